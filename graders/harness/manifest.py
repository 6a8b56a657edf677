"""What each test cell grades, read from the source notebooks without executing their text.

A test cell is a sequence of calls `nbNN.check_x(LearnerName, field=literal, ...)`, with
comments and nbgrader's hidden-test markers between them. Each check function names its
exercise (`check_x.exercise`); the keyword arguments that are `Case` fields, with the
exercise's defaults, give the case. Anything else in a test cell (a computed argument, a
loop) is refused with an error that names the notebook, the cell and the line, when the course
is built and tested, so that no such cell can silently score 0 later.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import re

from graders.harness.cells import nbgrader_meta, source_notebook, test_cells

Check = tuple[tuple[str, str], dict]   # ((notebook, exercise name), case fields)


class UnreadableTestCell(ValueError):
    """A source test cell that the harness cannot read without running it."""


def checks_of(source: str, where: str = "test cell") -> list[Check]:
    """The (exercise key, case) pairs a source test cell asks for, in order."""
    from graders.judging.exercise import CASE_FIELDS

    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise UnreadableTestCell(f"{where}: not valid Python ({err.msg}, line {err.lineno})") from None
    found = []
    for statement in tree.body:
        def refuse(why: str):
            raise UnreadableTestCell(f"{where}, line {statement.lineno}: {why}. A test cell may only call "
                                "nbNN.check_...(LearnerName, field=literal, ...).")

        call = statement.value if isinstance(statement, ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) \
                or not isinstance(call.func.value, ast.Name) or not re.fullmatch(r"nb\d\d", call.func.value.id):
            refuse("not a call of a notebook's check function")
        module = importlib.import_module(f"graders.exercises.{call.func.value.id}")
        exercise = getattr(getattr(module, call.func.attr, None), "exercise", None)
        if exercise is None:
            refuse(f"{call.func.value.id}.{call.func.attr} is not a check function")
        fields = {}
        for keyword in call.keywords:
            if keyword.arg is None:
                refuse("**arguments are not allowed")
            try:
                value = ast.literal_eval(keyword.value)
            except ValueError:
                refuse(f"the argument {keyword.arg}= is computed; write its value as a literal")
            if keyword.arg in CASE_FIELDS:
                fields[keyword.arg] = value
        found.append((exercise.key, dataclasses.asdict(exercise.case(**fields))))
    return found


def notebook_checks(name: str) -> dict[str, list[Check] | UnreadableTestCell]:
    """{grade_id: its checks, or why they could not be read} for one source notebook."""
    listed = {}
    for cell in test_cells(source_notebook(name)):
        grade_id = nbgrader_meta(cell)["grade_id"]
        try:
            listed[grade_id] = checks_of(cell["source"], f"{name}, test cell {grade_id}")
        except UnreadableTestCell as err:
            listed[grade_id] = err
    return listed
