"""One verdict: what a learner is shown before submitting is the grade, point for point, in the
same words.

Each submission is checked as `make check` does (the learner's kernel judges, with the cells it
ran) and graded as `make grade` does (a recording kernel, judged outside it); both call
graders.judging.verdict.decide. The submissions are the ways the two paths once parted: a stray
`graders` import, a library call, a library call through computed names, a deleted test cell,
a kernel that dies, the classic bug, and the solution.
"""
import nbformat
import pytest

from graders.course import example_class
from graders.exercises import declaration
from graders.harness import grading
from graders.harness.check import check_cells
from graders.harness.execute import scratch_dir

NAME = "01_layernorm"
SOLVED_VARIANCE = "variance = centred.pow(2).mean(dim=-1, keepdim=True)"


def _answer(edit):
    """A solved 01 whose LayerNorm answer cell goes through `edit(source) -> source`."""
    notebook = example_class.submission(NAME, True)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "layernorm_answer":
            cell.source = edit(cell.source)
    return notebook


def _without_test_cell():
    notebook = example_class.submission(NAME, True)
    notebook.cells = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "layernorm_test"]
    return notebook


def _library_call(source: str, call: str) -> str:
    """The answer with its forward's result replaced by a library LayerNorm reached by `call`."""
    lines = source.splitlines()
    at = max(i for i, line in enumerate(lines) if line.strip().startswith("return "))
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines[at] = f"{indent}return {call}(residual, residual.shape[-1:], self.w, self.b, self.cfg.layer_norm_eps)"
    return "\n".join(lines)


BUG = declaration(NAME).example_bug
COURSE_MODULE = "import importlib\n_course = importlib.import_module('gra' + 'ders.reference.components')\n"
SUBCLASSED = "class LayerNorm(_course.LayerNorm):\n    pass\n"
EXECUTED = ("import inspect\n_ns = {'__name__': '__main__'}\nexec(inspect.getsource(_course), _ns)\n"
            "LayerNorm = _ns['LayerNorm']\n")
SUBMISSIONS = {
    "solved": lambda: example_class.submission(NAME, True),
    # An untouched exercise is answered before anything is built, in both paths alike.
    "untouched": lambda: example_class.submission(NAME, False),
    "classic bug": lambda: _answer(lambda s: s.replace(BUG.find, BUG.replace)),
    "stray graders import": lambda: _answer(lambda s: "from graders.judging.cases import Case\n" + s),
    "library call": lambda: _answer(lambda s: _library_call(s, "torch.nn.functional.layer_norm")),
    "computed-name call": lambda: _answer(lambda s: "import torch.nn.functional as F\n"
                                          + _library_call(s, 'getattr(F, "layer" + "_norm")')),
    "deleted test cell": _without_test_cell,
    # The course's own LayerNorm (graders.integrity.provenance), reached without the word `graders`.
    "course code subclassed": lambda: _answer(lambda s: COURSE_MODULE + SUBCLASSED),
    "course source executed": lambda: _answer(lambda s: COURSE_MODULE + EXECUTED),
    "crash": lambda: _answer(lambda s: s.replace(SOLVED_VARIANCE, "import os; os._exit(1)")),
}


def _words(text: str) -> str:
    return " ".join(text.replace("\N{BALLOT X}", " ").split())


def _shown_and_graded(name: str, notebook, tmp_path):
    """What `make check` shows of `notebook` and what `make grade` gives it, after checking that
    they agree cell by cell, in points and in words."""
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(notebook, path)
    shown = check_cells(path)
    with scratch_dir() as workdir:
        graded, _ = grading.grade_notebook("learner", name, path, workdir)
    assert [(g, earned) for g, earned, _, _ in shown] == [(c.grade_id, c.points) for c in graded.cells]
    for (_, earned, _, diagnosis), cell in zip(shown, graded.cells):
        if cell.status != "passed":
            assert _words(cell.message) in _words(diagnosis), (name, cell.message, diagnosis)
    return shown, graded


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SUBMISSIONS))
def test_the_verdict_before_submitting_is_the_grade(kind, tmp_path):
    _, graded = _shown_and_graded(NAME, SUBMISSIONS[kind](), tmp_path)
    expect_full = kind in ("solved", "deleted test cell")
    assert graded.score == (graded.cells[0].max_points if expect_full else 0), (kind, graded.cells)
    if kind == "untouched":
        assert "not written yet" in graded.cells[0].message, graded.cells


BLOCK = "05_transformer_block"
BLOCK_BUG = declaration(BLOCK).example_bug
ATTENTION_RENAMED = (BLOCK, "block_answer", "self.attn", "self.attention_heads")


@pytest.mark.slow
@pytest.mark.parametrize("bug", [False, True], ids=["right", "classic bug"])
def test_a_renamed_submodule_gets_the_same_verdict_graded(bug, tmp_path):
    """A block with `attention_heads` for `attn`: both paths fail it on the names, and both say
    whether the computation under the learner's names is right."""
    classic = [(BLOCK, BLOCK_BUG.answer, BLOCK_BUG.find, BLOCK_BUG.replace)] if bug else []
    _, graded = _shown_and_graded(BLOCK, example_class.submission(BLOCK, True, classic + [ATTENTION_RENAMED]),
                                  tmp_path)
    cell = next(c for c in graded.cells if c.grade_id == "block_test")
    assert cell.points == 0 and "missing: attn.W_Q" in cell.message, cell
    said = ("is also wrong", BLOCK_BUG.named) if bug else ("computes the right thing",)
    assert all(words in cell.message for words in said), cell.message
