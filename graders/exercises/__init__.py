"""The graders of the course's notebooks: the package `nbNN/` grades notebook NN, its `__init__.py`
declaring it (`NOTEBOOK`) and holding the checks its test cells call; `common/` holds what several
notebooks share.

A notebook's test cells call `nbNN.check_...`, so the module's name follows from the notebook's
number; `declaration` is the one place that looks it up, and says what is missing when it fails.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from graders.judging.exercise import Exercise, registered
from graders.judging.notebook import Notebook


class MissingGrader(LookupError):
    """A graded notebook without its grader module or declaration."""


def grader_module(notebook: str) -> ModuleType:
    """The module that grades `notebook` (NN_topic): graders.exercises.nbNN."""
    name = f"{__name__}.nb{notebook[:2]}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise
        raise MissingGrader(f"{notebook} has no grader: write graders/exercises/nb{notebook[:2]}/__init__.py "
                            "(see docs/adding-a-notebook.md)") from None


def declaration(notebook: str) -> Notebook:
    """The `NOTEBOOK` that `notebook`'s grader module declares."""
    declared = getattr(grader_module(notebook), "NOTEBOOK", None)
    if not isinstance(declared, Notebook) or declared.name != notebook:
        raise MissingGrader(f"graders/exercises/nb{notebook[:2]}/__init__.py must declare "
                            f"NOTEBOOK = Notebook({notebook!r}, ...) (see docs/adding-a-notebook.md)")
    return declared


def find(key: tuple[str, str]) -> Exercise:
    """The exercise with this (notebook, name) key, its notebook's grader imported first."""
    grader_module(key[0])
    return registered(key)


def declared_notebooks() -> dict[str, Notebook]:
    """Every notebook a grader module here declares, by name."""
    found = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name[:2] == "nb"):
        declared = getattr(importlib.import_module(f"{__name__}.{module}"), "NOTEBOOK", None)
        if isinstance(declared, Notebook):
            found[declared.name] = declared
    return found
