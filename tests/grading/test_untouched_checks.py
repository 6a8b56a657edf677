"""An untouched exercise is answered at once: the check of every released
stub, in every notebook, says "not written yet" within a second of starting, before it builds any
reference or input. Run in-process: the released notebook's setup cell and answer cells (its
stubs) are run in one namespace, then each check call of its test cells, timed alone."""
import ast
import functools
import json
import time

import pytest

from course_code import as_cell

from graders.course.example_class import solution_answers
from graders.course.notebooks import notebook_names
from graders.judging import stubs
from graders.judging.compare import CheckFailed
from graders.judging.testcells import released_test_cells
from graders.layout import EXERCISES

BOUND = 1.0   # seconds: the figure; a stub's answer takes milliseconds


@functools.lru_cache(maxsize=None)
def released_stubs(notebook: str, solved: bool = False) -> dict:
    """The namespace of the released notebook after its setup cell and its answer cells ran (the
    stubs, or the solution's answers when `solved`)."""
    cells = [c for c in json.loads((EXERCISES / f"{notebook}.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    solutions = solution_answers(notebook) if solved else {}
    namespace: dict = {"__name__": "__main__"}
    setup_and_stubs = cells[:1] + [c for c in cells[1:] if c["metadata"].get("nbgrader", {}).get("solution")]
    for i, cell in enumerate(setup_and_stubs):   # compiled as IPython compiles a cell (its source is found)
        source = solutions.get(cell["metadata"].get("nbgrader", {}).get("grade_id"), "".join(cell["source"]))
        exec(as_cell(source, f"{notebook} {i} {solved}"), namespace)
    return namespace


def check_calls() -> list[tuple[str, str, int, str]]:
    """(notebook, test cell, index, source of the call) of every check of every released test cell."""
    calls = []
    for notebook in notebook_names():
        for cell in released_test_cells(notebook):
            statements = ast.parse(cell.source).body
            calls += [(notebook, cell.grade_id, i, ast.unparse(s)) for i, s in enumerate(statements)]
    return calls


@pytest.mark.parametrize("notebook, cell, index, call", check_calls(),
                         ids=[f"{n[:2]}-{c}-{i}" for n, c, i, _ in check_calls()])
def test_an_untouched_exercise_is_answered_within_a_second(notebook, cell, index, call, monkeypatch):
    """Within a second, and before the exercise's inputs or outputs are made: on an empty cache, on
    a busy machine, the answer does not wait for them."""
    namespace = released_stubs(notebook)
    function = ast.parse(call).body[0].value.func
    exercise = getattr(namespace[function.value.id], function.attr).exercise

    def made(*args, **kwargs):
        raise AssertionError(f"{exercise.name}'s inputs or outputs were made for an untouched exercise")
    for part in ("inputs", "produce", "judge"):
        monkeypatch.setitem(vars(exercise), part, made)
    start = time.monotonic()
    with pytest.raises(CheckFailed) as failed:
        exec(call, namespace)
    elapsed = time.monotonic() - start
    assert "not written yet" in str(failed.value), str(failed.value)
    assert elapsed < BOUND, f"{call} took {elapsed:.2f} s to say {str(failed.value)!r}"


@pytest.mark.parametrize("notebook", notebook_names())
def test_no_answer_of_a_solution_is_taken_for_a_stub(notebook):
    """The other side: every check's answers in the solution are written (none is answered unrun)."""
    namespace = released_stubs(notebook, solved=True)
    for cell in released_test_cells(notebook):
        for call in cell.calls:
            answers = tuple(namespace[name] for name in call.learners)
            assert stubs.untouched(call.function, answers) is None, (notebook, call)


def test_a_given_init_that_builds_an_untouched_part_names_it():
    """10's ModernDecoder: its __init__ is given and builds the learner's DecoderLayer."""
    failure = stubs.untouched("ModernDecoder", (released_stubs("10_modern_decoder")["ModernDecoder"],))
    assert str(failure) == ("ModernDecoder: DecoderLayer.__init__ is not written yet "
                            "(ModernDecoder builds DecoderLayer).")


def test_a_written_answer_is_not_untouched():
    """A stub's lines kept below written code still only raise; one written method of a class
    (03's apply_causal_mask beside an unwritten forward) makes it written: its check runs it."""
    namespace: dict = {}
    exec(as_cell(
        "import torch\n"
        "def written(x):\n    return x\n"
        "def kept_raise(x):\n    y = x + 1\n    raise NotImplementedError()\n"
        "def returns_first(x):\n    if x:\n        return x\n    raise NotImplementedError()\n"
        "class Half(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "    def forward(self, x):\n        raise NotImplementedError()\n"
        "    def apply_causal_mask(self, x):\n        return x\n", "written answers"), namespace)
    assert stubs.untouched("x", (namespace["written"],)) is None
    assert stubs.untouched("x", (namespace["kept_raise"],)) is not None
    assert stubs.untouched("x", (namespace["returns_first"],)) is None
    assert stubs.untouched("x", (namespace["Half"],)) is None
    assert stubs.untouched("x", (namespace["kept_raise"], namespace["written"])) is None
