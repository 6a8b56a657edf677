"""What each test cell of a source notebook grades: its checks, by id, read without running it.

The calls come from the one reader of test cells (graders.judging.testcells); here each is
resolved to its exercise and case. A cell that cannot be read (a computed argument, a loop, a
function that is not a check) is refused with an error naming the notebook, the cell and the
line, when the course is built and tested, so that no such cell can silently score 0 later.
"""
from __future__ import annotations

import dataclasses
import importlib

from graders.harness.cells import source_notebook, test_cells
from graders.judging.cases import CASE_FIELDS
from graders.judging.testcells import CheckCall, UnreadableTestCell, read_calls, test_cells_of

Check = tuple[tuple[str, str], dict]   # ((notebook, exercise name), case fields); check i of cell g is "g/i"

__all__ = ["Check", "UnreadableTestCell", "checks_of", "notebook_checks"]


def _resolve(call: CheckCall, where: str) -> Check:
    try:
        module = importlib.import_module(f"graders.exercises.{call.module}")
    except ModuleNotFoundError:
        module = None
    exercise = getattr(getattr(module, call.function, None), "exercise", None)
    if exercise is None:
        raise UnreadableTestCell(f"{where}, line {call.line}: {call.module}.{call.function} is not a "
                                 "check function. A test cell may only call "
                                 "nbNN.check_...(LearnerName, field=literal, ...).")
    fields = {k: v for k, v in call.arguments.items() if k in CASE_FIELDS}
    return exercise.key, dataclasses.asdict(exercise.case(**fields))


def checks_of(source: str, where: str = "test cell") -> list[Check]:
    """The (exercise key, case) pairs a source test cell asks for, in order."""
    return [_resolve(call, where) for call in read_calls(source, where)]


def notebook_checks(name: str) -> dict[str, list[Check] | UnreadableTestCell]:
    """{grade_id: its checks, or why they could not be read} for one source notebook."""
    listed = {}
    for cell in test_cells(source_notebook(name)):
        grade_id = cell.metadata.nbgrader["grade_id"]
        try:
            (read,) = test_cells_of([cell], name)
            listed[grade_id] = [_resolve(call, f"{name}, test cell {grade_id}") for call in read.calls]
        except UnreadableTestCell as err:
            listed[grade_id] = err
    return listed
