"""Cells of a notebook as nbgrader marks them, and putting a submission's locked cells back.

A cell is linked to its grade by nbgrader metadata (`grade_id`, `points`, `solution`), never by
its text. Every locked cell of the source notebook (tests, given code) replaces the
submission's version; a deleted test cell is put back where it was; cells the learner added
run in place, after the cell they followed.
"""
from __future__ import annotations

import copy
import re

import nbformat

from graders.layout import EXERCISES, SOLUTIONS
from graders.judging.failed_cells import scanned_names
from graders.judging.session import code_only
from graders.judging.testcells import split_hidden
from graders.judging.verdict import LearnerCode

KERNEL_NAME = "gpt2-course-sandbox"


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_test_cell(cell) -> bool:
    meta = nbgrader_meta(cell)
    return bool(meta.get("grade")) and not meta.get("solution") and cell["cell_type"] == "code"


def cell_label(cell) -> str:
    """A cell as a learner's traceback names it in a report (IPython's "Cell In[7]" is the
    kernel's counter, which no report shows): by the functions and classes it defines, else by its
    nbgrader id, else by its first line of code. Unparsed: the grading threads call it."""
    meta, names = nbgrader_meta(cell), [f"`{name}`" for name in scanned_names(cell["source"])]
    defined = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
    if is_test_cell(cell):
        return f"the test cell `{meta['grade_id']}`"
    if defined:
        return f"the answer cell of {defined}" if meta.get("solution") else f"the cell that defines {defined}"
    if meta.get("grade_id"):
        return f"the {'answer' if meta.get('solution') else 'given'} cell `{meta['grade_id']}`"
    first = next((line.strip() for line in cell["source"].splitlines()
                  if line.strip() and not line.strip().startswith("#")), "")
    return f"the cell starting `{first if len(first) <= 40 else first[:37] + '...'}`"


# IPython's name for a cell in a traceback, "Cell In[7]", colours and all (its parts are coloured apart).
_CELL_IN = re.compile(r"Cell(?:\x1b\[[0-9;]*m)*\s(?:\x1b\[[0-9;]*m)*In\[(\d+)\]")


def name_cells(output, labels: dict[int, str]) -> None:
    """An error output's traceback with each "Cell In[N]" of a cell that ran named by `labels`
    (its execution count -> cell_label): the grading kernels' and Validate's share this one rule."""
    if output.get("output_type") == "error":
        output["traceback"] = [_CELL_IN.sub(lambda found: labels.get(int(found[1]), found[0]), line)
                               for line in output.get("traceback", [])]


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


def learner_code(notebook, released, grade_id: str) -> LearnerCode:
    """The learner's code as the check of test cell `grade_id` is judged with: their cells above
    it (answer cells, and added cells that are not the course's), and those since the test cell
    before it (the exercise's own answer). A learner's kernel collects the same from the cells it
    ran (graders.judging.session.CellHistory), so the two agree on a top-to-bottom run."""
    course = {c["source"] for c in released.cells
              if c["cell_type"] == "code" and not nbgrader_meta(c).get("solution")}
    end = next(i for i, c in enumerate(notebook.cells)
               if is_test_cell(c) and nbgrader_meta(c)["grade_id"] == grade_id)
    before, own = [], []
    for i, cell in enumerate(notebook.cells[:end]):
        if is_test_cell(cell):
            own = []
            continue
        meta = nbgrader_meta(cell)
        if cell["cell_type"] == "code" and (
                meta.get("solution") or (not meta.get("grade_id") and cell["source"] not in course)):
            code = code_only(cell["source"])
            before.append(code)
            own.append(code)
    return LearnerCode("\n".join(before), "\n".join(own))


def cell_error(cell) -> str:
    """The error a cell's outputs show, as `Name: message` (empty when it ran cleanly)."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output.get('ename')}: {output.get('evalue')}"[:2000]
    return ""
