"""Answer cells that copy the course's own implementations, for the instructor to look at.

A learner who pastes `graders/reference/components.py`'s `Attention` passes every check. The
grade stands (it is correct code); the class report and nbgrader's comment on that answer cell
say which function matches which course function. Two functions match when their syntax trees
are equal after every local name is replaced by its order of first use and docstrings, type
annotations and comments are dropped: renaming variables or reformatting does not hide a copy,
while the same idea written another way (einops against matmul) is not one.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
MIN_STATEMENTS = 5   # shorter ones (a mask, a loop over blocks) have one natural way to be written


class _Canonical(ast.NodeTransformer):
    """Local names become n0, n1, ... in order of first use; annotations and docstrings go.
    Attribute names (self.W_Q) and constants stay: the exercise fixes the former."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, f"n{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(arg=self._name(node.arg)), node)

    def visit_FunctionDef(self, node):
        node.returns, node.decorator_list = None, []
        body = node.body[1:] if _is_docstring(node.body[0]) and len(node.body) > 1 else node.body
        node.body = body
        node.name = "f"
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node):
        if node.value is None:
            return None
        return self.visit(ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node))


def _is_docstring(statement) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def _functions(tree) -> list[tuple[str, ast.FunctionDef]]:
    """(qualified name, node) of every top-level function and method defined in `tree`."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found += [(f"{node.name}.{item.name}", item) for item in node.body
                      if isinstance(item, ast.FunctionDef)]
        elif isinstance(node, ast.FunctionDef):
            found.append((node.name, node))
    return found


def _fingerprint(function: ast.FunctionDef) -> str | None:
    statements = sum(isinstance(n, ast.stmt) for n in ast.walk(function)) - 1
    if statements < MIN_STATEMENTS:
        return None
    return ast.dump(_Canonical().visit(ast.parse(ast.unparse(function))), include_attributes=False)


@lru_cache(maxsize=1)
def course_fingerprints() -> dict[str, str]:
    """{fingerprint: "graders/<file>: <function>"} over the course's implementations: the grader
    files each notebook declares as its `course_code`."""
    from graders.exercises import declared_notebooks

    prints = {}
    patterns = dict.fromkeys(p for notebook in declared_notebooks().values() for p in notebook.course_code)
    for pattern in patterns:
        for path in sorted(PACKAGE.glob(pattern)):
            for name, function in _functions(ast.parse(path.read_text())):
                key = _fingerprint(function)
                if key is not None:
                    prints.setdefault(key, f"graders/{path.relative_to(PACKAGE)}: {name}")
    return prints


COPY_NOTE = re.compile(r"answer cell (\S+): (.* matches the course's own implementation .*)$")


def is_copy_note(flag: str) -> bool:
    """Copy notes are for the instructor: the report and nbgrader's comment, not the learner's
    feedback page."""
    return COPY_NOTE.match(flag) is not None


def cell_notes(flags) -> dict[str, list[str]]:
    """{answer cell id: its copy notes} among a notebook's flags: nbgrader's comment on the cell
    shows them to the instructor in formgrader."""
    notes: dict[str, list[str]] = {}
    for found in filter(None, map(COPY_NOTE.match, flags)):
        notes.setdefault(found[1], []).append(found[2])
    return notes


def _cell_functions(source: str) -> list[tuple[str, str]]:
    """(name, fingerprint) of the functions a cell defines that are long enough to compare."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [(name, key) for name, function in _functions(tree)
            if (key := _fingerprint(function)) is not None]


def copy_flags(notebook, released) -> list[str]:
    """One note per function in an answer cell that matches a course implementation; code the
    released notebook already gives (a constructor written out for the learner) is not theirs."""
    from graders.harness.cells import nbgrader_meta

    given = {key for cell in released.cells if nbgrader_meta(cell).get("solution")
             for _, key in _cell_functions(cell["source"])}
    notes = []
    for cell in notebook.cells:
        meta = nbgrader_meta(cell)
        if cell.get("cell_type") != "code" or not meta.get("solution"):
            continue
        for name, key in _cell_functions(cell["source"]):
            where = course_fingerprints().get(key)
            if where and key not in given:
                notes.append(f"answer cell {meta['grade_id']}: {name} matches the course's own "
                             f"implementation ({where}) after normalising names, comments and "
                             "formatting; its points stand, please review it")
    return notes
