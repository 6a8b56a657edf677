"""Answer cells that copy the course's own implementations are flagged for the instructor, not
zeroed; the solutions, written in their own style, are never flagged."""
import inspect
import re

import nbformat
import pytest

from graders.course.example_class import submission
from graders.course.notebooks import notebook_names
from graders.harness import grading
from graders.harness.cells import nbgrader_meta, released_notebook, source_notebook
from graders.harness.copies import cell_notes, copy_flags
from graders.reference import components


def _pasted_attention() -> str:
    """The course's Attention as a learner might paste it: names changed, comments and
    formatting different."""
    source = inspect.getsource(components.Attention)
    for old, new in (("shape_in", "in_shape"), ("shape_out", "out_shape"), ("scores", "att"),
                     ("pattern", "probs"), ("future", "upper"), ("q_len", "nq"), ("k_len", "nk")):
        source = source.replace(old, new)
    source = re.sub(r"\bx\b", "resid", source)
    source = re.sub(r"\bz\b", "mixed", source)
    source = re.sub(r" +#.*", "", source)                      # the course's comments go
    return "# my attention\n" + source.replace("(self, cfg: Config)", "(self, cfg)")


def _with_answer(notebook, grade_id: str, source: str):
    for cell in notebook.cells:
        if nbgrader_meta(cell).get("grade_id") == grade_id:
            cell.source = source
    return notebook


@pytest.mark.parametrize("name", notebook_names())
def test_no_solution_is_flagged_as_a_copy(name):
    assert copy_flags(source_notebook(name), released_notebook(name)) == []


def test_a_pasted_attention_with_renamed_variables_is_flagged():
    notebook = _with_answer(source_notebook("03_attention"), "attention_answer", _pasted_attention())
    flags = copy_flags(notebook, released_notebook("03_attention"))
    assert any(f.startswith("answer cell attention_answer: Attention.forward matches the course's own "
                            "implementation (graders/reference/components.py: Attention.forward)")
               for f in flags), flags
    assert list(cell_notes(flags)) == ["attention_answer"]


def test_the_given_constructor_is_not_the_learners_copy():
    """The released notebook writes Attention.__init__ out; keeping it is not copying."""
    notebook = submission("03_attention", solved=True)
    assert copy_flags(notebook, released_notebook("03_attention")) == []


@pytest.mark.slow
def test_a_pasted_attention_keeps_its_points_and_is_reported(tmp_path):
    notebook = _with_answer(submission("03_attention", solved=True), "attention_answer", _pasted_attention())
    path = tmp_path / "03_attention.ipynb"
    nbformat.write(notebook, path)
    result, _ = grading.grade_notebook("pat", "03_attention", path, tmp_path / "work")
    assert result.score == sum(c.max_points for c in result.cells)
    assert any("Attention.forward matches the course's own implementation" in f for f in result.flags)


def test_the_copy_note_is_the_answer_cells_comment_in_nbgrader():
    """What formgrader shows the instructor: nbgrader's auto comment on the copied answer cell
    (kept apart from the student's feedback page)."""
    from types import SimpleNamespace

    from graders.harness.gradebook import save_verdicts

    comments = [SimpleNamespace(name=n, auto_comment=None) for n in ("attention_answer", "other_answer")]
    grades = {}
    fake = SimpleNamespace(
        find_grade=lambda cell, *_: grades.setdefault(cell, SimpleNamespace(manual_score=None)),
        find_submission_notebook=lambda *_: SimpleNamespace(comments=comments),
        db=SimpleNamespace(commit=lambda: None))
    cells = [{"grade_id": "attention_test", "points": 9, "max_points": 9, "status": "passed", "message": ""}]
    notebook = _with_answer(source_notebook("03_attention"), "attention_answer", _pasted_attention())
    save_verdicts(fake, "03_attention", "03_attention", "pat", cells,
                  copy_flags(notebook, released_notebook("03_attention")))
    assert "Attention.forward matches the course's own implementation" in comments[0].auto_comment
    assert comments[1].auto_comment is None and grades["attention_test"].auto_score == 9
