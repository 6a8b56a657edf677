"""Honest answers: code written without the course's solution, to measure how similar to it an
independent answer already is (graders.harness.copy_thresholds sets each exercise's bar above that).

Two kinds, both whole answer cells: the files here, `<notebook>/<answer cell>.<style>.txt` (text:
an answer cell needs its notebook's setup cell to run), written from the released notebook alone;
and the correct variants of the catalogs (tests/catalog/test_catalog_NN*.py), taken by their definitions:
each function or class a `test_*correct*` test is parametrized with,
named as the released test cell of the check it runs names its answer (a bare method becomes that
class's `forward`). Add a file here to grow the corpus.
"""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from graders.harness.cells import nbgrader_meta, released_notebook
from graders.layout import EXERCISES

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent


@dataclass(frozen=True)
class Honest:
    """An independent answer to one answer cell of a notebook."""
    notebook: str
    grade_id: str
    origin: str
    text: str


def written() -> list[Honest]:
    """The answers kept as files here."""
    return [Honest(path.parent.name, path.name.split(".")[0], str(path.relative_to(TESTS.parent)), path.read_text())
            for path in sorted(HERE.glob("*/*.txt"))]


def _checks(notebook: str) -> dict[str, tuple[str, str]]:
    """{check function a test cell calls: (the answer cell before it, the name it passes)}."""
    found, answer = {}, None
    for cell in released_notebook(notebook).cells:
        if nbgrader_meta(cell).get("solution"):
            answer = nbgrader_meta(cell)["grade_id"]
        elif cell.get("cell_type") == "code" and answer:
            for call in re.finditer(r"nb\d\d\.(check_\w+)\((\w+)", cell["source"]):
                found.setdefault(call[1], (answer, call[2]))
    return found


def _as_answer(node, text: str, name: str) -> str:
    """The definition `node` renamed to `name`; a function taking `self` as `name`'s forward."""
    node.name = name
    if isinstance(node, ast.FunctionDef) and node.args.args and node.args.args[0].arg == "self":
        node.name = "forward"
        return f"class {name}(nn.Module):\n" + textwrap.indent(ast.unparse(node), "    ") + "\n"
    return ast.unparse(node) + "\n"


def catalog_variants() -> list[Honest]:
    """The catalogs' correct variants that are definitions of their own file (but those named
    for the solution: they are its copies)."""
    notebooks = {path.stem[:2]: path.stem for path in EXERCISES.glob("[0-9][0-9]_*.ipynb")}
    found = []
    for path in sorted((TESTS / "catalog").glob("test_catalog_*.py")):
        notebook = notebooks[path.stem.split("_")[2]]   # test_catalog_NN.py or test_catalog_NN_<topic>.py
        checks, text = _checks(notebook), path.read_text()
        tree = ast.parse(text)
        defined = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        lists = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}
        for test in (node for node in tree.body if isinstance(node, ast.FunctionDef) and "correct" in node.name):
            called = [a.attr for a in ast.walk(test) if isinstance(a, ast.Attribute) and a.attr in checks]
            if not called:
                continue
            grade_id, answer_name = checks[called[0]]
            for decorator in test.decorator_list:
                if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "parametrize"):
                    continue
                values = decorator.args[1]
                values = lists.get(values.id, values) if isinstance(values, ast.Name) else values
                names = values.values if isinstance(values, ast.Dict) else getattr(values, "elts", [])
                for item in names:
                    if isinstance(item, ast.Name) and item.id in defined and "solution" not in item.id:
                        node = ast.parse(ast.get_source_segment(text, defined[item.id])).body[0]
                        found.append(Honest(notebook, grade_id, f"{path.name}: {item.id}",
                                            _as_answer(node, text, answer_name)))
    return found


def corpus() -> list[Honest]:
    """Every honest answer, each variant once."""
    unique = {(h.notebook, h.grade_id, h.text): h for h in written() + catalog_variants()}
    return list(unique.values())
