"""One verdict: what a learner is shown before submitting is the grade, point for point, in the
same words (issue 25).

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
SUBMISSIONS = {
    "solved": lambda: example_class.submission(NAME, True),
    "classic bug": lambda: _answer(lambda s: s.replace(BUG.find, BUG.replace)),
    "stray graders import": lambda: _answer(lambda s: "from graders.judging.cases import Case\n" + s),
    "library call": lambda: _answer(lambda s: _library_call(s, "torch.nn.functional.layer_norm")),
    "computed-name call": lambda: _answer(lambda s: "import torch.nn.functional as F\n"
                                          + _library_call(s, 'getattr(F, "layer" + "_norm")')),
    "deleted test cell": _without_test_cell,
    "crash": lambda: _answer(lambda s: s.replace(SOLVED_VARIANCE, "import os; os._exit(1)")),
}


def _words(text: str) -> str:
    return " ".join(text.replace("\N{BALLOT X}", " ").split())


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SUBMISSIONS))
def test_the_verdict_before_submitting_is_the_grade(kind, tmp_path):
    notebook = SUBMISSIONS[kind]()
    path = tmp_path / f"{NAME}.ipynb"
    nbformat.write(notebook, path)
    shown = check_cells(path)
    with scratch_dir() as workdir:
        graded, _ = grading.grade_notebook("learner", NAME, path, workdir)
    assert [(g, earned) for g, earned, _, _ in shown] == [(c.grade_id, c.points) for c in graded.cells]
    for (_, earned, _, diagnosis), cell in zip(shown, graded.cells):
        if cell.status != "passed":
            assert _words(cell.message) in _words(diagnosis), (kind, cell.message, diagnosis)
    expect_full = kind in ("solved", "deleted test cell")
    assert graded.score == (graded.cells[0].max_points if expect_full else 0), (kind, graded.cells)
