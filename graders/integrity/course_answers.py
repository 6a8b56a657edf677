"""The course's own answers, as the source marks them (`@course_answer("LayerNorm")`, graders.marks).

Read from the files, nothing imported: the host plans what each grading kernel seals from these
(graders.integrity.kernel_view, kernel_plan) before any kernel, or the graders, has run.
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from graders.integrity.origins import PACKAGE


def module_name(path: Path) -> str:
    """The dotted name of the graders module at `path` ("graders.reference.components")."""
    name = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
    return name.removesuffix(".__init__")


@dataclass(frozen=True)
class CourseAnswer:
    """A top-level class or function marked `@course_answer(named)` in `path`."""
    path: Path
    symbol: str
    named: str      # what the notebooks call it

    @property
    def module(self) -> str:
        return module_name(self.path)


@functools.lru_cache(maxsize=None)
def course_answers() -> tuple[CourseAnswer, ...]:
    """Every marked course answer in the graders package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        if "@course_answer(" not in source:
            continue
        for node in ast.parse(source).body:
            for decorator in getattr(node, "decorator_list", ()):
                if (isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "course_answer"
                        and decorator.args and isinstance(decorator.args[0], ast.Constant)):
                    found.append(CourseAnswer(path.resolve(), node.name, decorator.args[0].value))
    return tuple(found)
