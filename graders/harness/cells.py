"""Cells of a notebook as nbgrader marks them, and putting a submission's locked cells back.

A cell is linked to its grade by nbgrader metadata (`grade_id`, `points`, `solution`), never by
its text. Every locked cell of the source notebook (tests, given code) replaces the
submission's version; a deleted test cell is put back where it was; cells the learner added
run in place, after the cell they followed.
"""
from __future__ import annotations

import copy

import nbformat

from graders.course.notebooks import EXERCISES, SOLUTIONS
from graders.judging.progress import split_hidden

KERNEL_NAME = "gpt2-course-sandbox"


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_test_cell(cell) -> bool:
    meta = nbgrader_meta(cell)
    return bool(meta.get("grade")) and not meta.get("solution") and cell["cell_type"] == "code"


def source_notebook(name: str):
    return nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)


def released_notebook(name: str):
    """The notebook as learners receive it (generated from the source, kept in sync by a test)."""
    return nbformat.read(EXERCISES / f"{name}.ipynb", as_version=4)


def test_cells(source) -> list:
    return [cell for cell in source.cells if is_test_cell(cell)]


def points_of(cell) -> float:
    return float(nbgrader_meta(cell).get("points", 0))


def restore(submission, source) -> tuple[object, list[str]]:
    """The submission with every locked source cell put back as the source has it."""
    flags = []
    theirs = {nbgrader_meta(c).get("grade_id"): c for c in submission.cells if nbgrader_meta(c).get("grade_id")}
    restored = []
    for cell in source.cells:
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if meta.get("solution") and grade_id in theirs:
            answer = copy.deepcopy(theirs[grade_id])
            answer["metadata"]["nbgrader"] = copy.deepcopy(meta)
            restored.append(answer)
        elif meta.get("solution"):
            flags.append(f"answer cell {grade_id} is missing: graded as unanswered")
            restored.append(_unanswered(cell))
        elif grade_id:  # locked: tests and given code always come from the source
            if grade_id not in theirs:
                flags.append(f"cell {grade_id} was deleted: restored from the source")
            elif theirs[grade_id].get("source") != released_source(cell):
                flags.append(f"cell {grade_id} was edited: restored from the source")
            restored.append(copy.deepcopy(cell))
    extras = _extra_cells(submission)
    result = nbformat.v4.new_notebook()
    for cell in restored:
        result.cells.append(cell)
        result.cells.extend(extras.get(nbgrader_meta(cell).get("grade_id"), []))
    result.cells[0:0] = extras.get(None, [])
    result.metadata = {"kernelspec": {"name": KERNEL_NAME, "display_name": "sandbox",
                                      "language": "python"}}
    return result, flags


def released_source(cell) -> str:
    """What a test cell looks like in the student version (hidden tests removed)."""
    return split_hidden(cell["source"])[0]


def hidden_source(cell) -> str:
    """The hidden tests of a test cell (empty if it has none)."""
    return split_hidden(cell["source"])[1]


def _unanswered(cell):
    blank = copy.deepcopy(cell)
    blank["source"] = "raise NotImplementedError()"
    return blank


def _extra_cells(submission) -> dict:
    """Cells the learner added (no nbgrader id), keyed by the grade_id of the cell before them."""
    extras, previous = {}, None
    for cell in submission.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if grade_id:
            previous = grade_id
        elif cell["cell_type"] == "code":
            extras.setdefault(previous, []).append(copy.deepcopy(cell))
    return extras


def learner_code(notebook, source, up_to: str | None = None) -> str:
    """The code the learner wrote: answer cells and cells that are not the course's, without
    comments and strings. With `up_to` (a test cell's grade_id), only those between the test
    cell before it and that test cell: the exercise's own answer."""
    import io
    import tokenize

    course_cells = {c["source"] for c in source.cells}
    cells = notebook.cells
    if up_to is not None:
        tests = [i for i, c in enumerate(cells) if is_test_cell(c)]
        end = next(i for i in tests if nbgrader_meta(cells[i])["grade_id"] == up_to)
        cells = cells[max([i for i in tests if i < end], default=-1) + 1:end]
    parts = []
    for cell in cells:
        meta = nbgrader_meta(cell)
        if cell["cell_type"] == "code" and (
                meta.get("solution") or (not meta.get("grade_id") and cell["source"] not in course_cells)):
            try:
                tokens = [t for t in tokenize.generate_tokens(io.StringIO(cell["source"]).readline)
                          if t.type not in (tokenize.COMMENT, tokenize.STRING)]
                parts.append(tokenize.untokenize(tokens))
            except (tokenize.TokenError, IndentationError, SyntaxError):
                parts.append(cell["source"])
    return "\n".join(parts)


def cell_error(cell) -> str:
    """The error a cell's outputs show, as `Name: message` (empty when it ran cleanly)."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output.get('ename')}: {output.get('evalue')}"[:2000]
    return ""
