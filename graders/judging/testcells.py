"""The one reader of test cells: what each test cell of a notebook calls, read without running it.

A test cell is a sequence of calls `nbNN.check_x(LearnerName, field=literal, ...)`, with
comments and nbgrader's hidden-test markers between them. Anything else (a computed argument, a
loop) is refused with an error that names the notebook, the cell and the line. Check number `i`
of test cell `grade_id` is the check id `grade_id/i`: the grading kernel records under it and
the judge looks it up under it, so the two never compare cases to find each other.

The grader reads the source notebooks (hidden tests included); a learner's kernel reads the
released notebook to know which test cell it is running and what that cell is worth.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from functools import lru_cache

from graders.layout import EXERCISES, SOLUTIONS

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


class UnreadableTestCell(ValueError):
    """A source test cell that cannot be read without running it."""


@dataclass(frozen=True)
class CheckCall:
    """One `module.function(..., field=literal)` call of a test cell."""
    module: str          # "nb01"
    function: str        # "check_layernorm"
    arguments: dict      # its keyword arguments, each a literal
    line: int
    learners: tuple[str, ...] = ()   # the names of the learner's objects it checks


@dataclass(frozen=True)
class TestCell:
    grade_id: str
    points: float
    source: str          # as the notebook holds it
    calls: tuple[CheckCall, ...]

    def check_id(self, index: int) -> str:
        return f"{self.grade_id}/{index}"


def split_hidden(source: str) -> tuple[str, str]:
    """(what learners see, what nbgrader hides) of a test cell's source: the lines outside and
    inside its `### BEGIN/END HIDDEN TESTS` markers, markers dropped."""
    parts, hidden = ([], []), False
    for line in source.splitlines():
        if line.strip() in (HIDDEN_BEGIN, HIDDEN_END):
            hidden = line.strip() == HIDDEN_BEGIN
        else:
            parts[hidden].append(line)
    return "\n".join(parts[0]), "\n".join(parts[1])


def hidden_calls(source: str) -> set[int]:
    """The indices, among a readable test cell's calls (`read_calls`), of those nbgrader hides."""
    inside, hidden_lines = False, set()
    for number, line in enumerate(source.splitlines(), start=1):
        if line.strip() in (HIDDEN_BEGIN, HIDDEN_END):
            inside = line.strip() == HIDDEN_BEGIN
        elif inside:
            hidden_lines.add(number)
    return {index for index, call in enumerate(read_calls(source)) if call.line in hidden_lines}


def read_calls(source: str, where: str = "test cell") -> tuple[CheckCall, ...]:
    """The check calls of a test cell's source, in order; UnreadableTestCell for anything else."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise UnreadableTestCell(f"{where}: not valid Python ({err.msg}, line {err.lineno})") from None
    calls = []
    for statement in tree.body:
        def refuse(why: str):
            raise UnreadableTestCell(f"{where}, line {statement.lineno}: {why}. A test cell may only call "
                                     "nbNN.check_...(LearnerName, field=literal, ...).")

        call = statement.value if isinstance(statement, ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) \
                or not isinstance(call.func.value, ast.Name) or not re.fullmatch(r"nb\d\d", call.func.value.id):
            refuse("not a call of a notebook's check function")
        arguments = {}
        for keyword in call.keywords:
            if keyword.arg is None:
                refuse("**arguments are not allowed")
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                refuse(f"the argument {keyword.arg}= is computed; write its value as a literal")
        learners = tuple(a.id for a in call.args if isinstance(a, ast.Name))
        calls.append(CheckCall(call.func.value.id, call.func.attr, arguments, statement.lineno, learners))
    return tuple(calls)


def test_cells_of(cells: list[dict], where: str) -> tuple[TestCell, ...]:
    """The test cells among a notebook's cells (nbformat JSON dicts), each read strictly."""
    found = []
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        grade_id = meta.get("grade_id", "?")
        found.append(TestCell(grade_id, float(meta.get("points", 0)), source,
                              read_calls(source, f"{where}, test cell {grade_id}")))
    return tuple(found)


@lru_cache(maxsize=None)
def released_test_cells(notebook: str) -> tuple[TestCell, ...]:
    """The test cells of a course notebook as learners have them: exercises/, else solutions/
    with the hidden tests removed (read as JSON: nbformat's import alone costs a second)."""
    for path, strip in ((EXERCISES / f"{notebook}.ipynb", False), (SOLUTIONS / f"{notebook}.ipynb", True)):
        if path.is_file():
            cells = json.loads(path.read_text())["cells"]
            break
    else:
        return ()
    if strip:
        cells = [{**c, "source": split_hidden("".join(c["source"]) if isinstance(c["source"], list)
                                              else c["source"])[0]} for c in cells]
    return test_cells_of(cells, notebook)


@lru_cache(maxsize=None)
def released_course_sources(notebook: str) -> frozenset[str]:
    """The sources of the released notebook's code cells that are the course's (given code and
    tests, not answer cells): what a learner's kernel leaves out of "the learner's code"."""
    path = EXERCISES / f"{notebook}.ipynb"
    if not path.is_file():
        return frozenset()
    return frozenset(_text(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "code"
                     and not c.get("metadata", {}).get("nbgrader", {}).get("solution"))


@lru_cache(maxsize=None)
def test_sources(notebook: str) -> frozenset[str]:
    """The sources of the notebook's test cells as learners have them and as the solution has
    them (hidden tests included): the reference run of a solution runs the latter."""
    found = set()
    for path in (EXERCISES / f"{notebook}.ipynb", SOLUTIONS / f"{notebook}.ipynb"):
        if path.is_file():
            found |= {_text(c["source"]) for c in json.loads(path.read_text())["cells"]
                      if c.get("metadata", {}).get("nbgrader", {}).get("grade")
                      and not c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    return frozenset(found)


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source
