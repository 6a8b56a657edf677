"""What of the course's code a check lets the learner's code run: the parts the check supplies
(a composite's layers, a model it hands over) and the notebook's given parts, with the course
functions and classes they name, transitively (graders.integrity.provenance refuses the rest).
"""
from __future__ import annotations

import ast
import contextlib
import functools
import inspect

from graders.integrity.origins import LEARNER, library_class, origin

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


def parts_of(obj) -> list:
    """What an object is made of: itself, a method's, a partial's or a wrapper's function, a class's own
    attributes (along its MRO, library classes left out), an instance's class's, a tuple's items."""
    seen, found, stack = set(), [], [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        found.append(item)
        if isinstance(item, functools.partial):
            stack.append(item.func)
        elif inspect.isfunction(item) and hasattr(item, "__wrapped__"):   # a decorator's wrapper
            stack.append(item.__wrapped__)
        elif inspect.ismethod(item) or isinstance(item, (staticmethod, classmethod)):
            stack.append(item.__func__)
        elif isinstance(item, property):
            stack += [f for f in (item.fget, item.fset) if f is not None]
        elif inspect.isclass(item):
            stack += [value for klass in item.__mro__ if not library_class(klass)
                      for value in vars(klass).values()]
        elif isinstance(item, (tuple, list)):
            stack += list(item)
        elif not (inspect.isfunction(item) or inspect.ismodule(item) or isinstance(
                item, (str, bytes, int, float, bool, dict, type(None)))) \
                and not library_class(type(item)):
            stack.append(type(item))
    return found


def code_of(obj) -> list:
    """The code objects of the functions an object is made of (see parts_of)."""
    return [item.__code__ for item in parts_of(obj) if inspect.isfunction(item)]


def named_by(learner) -> list:
    """What the learner's own functions name: their globals (`LN = module.LayerNorm`, an
    instance built in a cell, a namespace a string was executed in) and their closures' cells."""
    named = []
    for function in (f for f in parts_of(learner) if inspect.isfunction(f)):
        if origin(function.__code__).kind != LEARNER:
            continue
        for name in function.__code__.co_names:
            item = function.__globals__.get(name)
            named += [item, *list(item.values())[:1000]] if isinstance(item, dict) else [item]
        for cell in function.__closure__ or ():
            with contextlib.suppress(ValueError):
                named.append(cell.cell_contents)
    return [item for item in named if not inspect.ismodule(item)]


def nested(codes) -> set:
    found, stack = set(), list(codes)
    while stack:
        code = stack.pop()
        if code not in found:
            found.add(code)
            stack += [c for c in code.co_consts if inspect.iscode(c)]
    return found


@functools.lru_cache(maxsize=64)
def allowed_code(parts: tuple) -> frozenset:
    """The code objects of the parts a check supplies, and of the course functions and classes
    they name (their own parts), transitively: what the learner's code may run of the course's."""
    allowed, stack = set(), list(parts)
    visited: set[int] = set()
    while stack:
        part = stack.pop()
        if id(part) in visited:
            continue
        visited.add(id(part))
        for code in nested(code_of(part)):
            if code in allowed:
                continue
            allowed.add(code)
            namespace = getattr(inspect.getmodule(code), "__dict__", {})
            modules = [namespace[n] for n in code.co_names if inspect.ismodule(namespace.get(n))]
            for name in code.co_names:   # a global, or an attribute of a module it names (bert.X)
                for named in [namespace.get(name)] + [getattr(m, name, None) for m in modules]:
                    named = inspect.unwrap(named) if hasattr(named, "__wrapped__") else named   # lru_cache
                    if not (inspect.isclass(named) or inspect.isfunction(named) or inspect.ismodule(named)):
                        named = type(named)   # an instance made once (a recipe, a table): its class's code
                    if (inspect.isclass(named) or inspect.isfunction(named)) and \
                            getattr(named, "__module__", "").startswith("graders."):
                        stack.append(named)
    return frozenset(allowed)


def supplied_parts(exercise) -> tuple:
    """The course's code a check runs inside the learner's: its course parts and its guard's supplies."""
    return (*exercise.course_parts.values(), *exercise.guard.supplies)


@functools.lru_cache(maxsize=None)
def given_part_names(notebook: str) -> tuple[str, ...]:
    """The course's classes and functions that `notebook`'s given cells import for the learner
    (the earlier notebooks' parts, e.g. 05's LayerNorm, Attention and MLP), as module:name."""
    from graders.judging.testcells import released_course_sources

    names = []
    for source in sorted(released_course_sources(notebook)):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        names += [f"{node.module}:{alias.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("graders.")
                  and not node.module.startswith("graders.judging") for alias in node.names]
    return tuple(sorted(set(names)))


def given_parts(names: tuple[str, ...]) -> tuple:
    """The classes and functions named by `names` (module:name, as given_part_names lists them).
    The caller chooses the names: a grading kernel, which cannot read its notebook, takes those
    handed to it in its session (graders.integrity.allowed_parts)."""
    import importlib

    parts = []
    for name in names:
        module, _, attribute = name.partition(":")
        found = getattr(importlib.import_module(module), attribute, None)
        if inspect.isclass(found) or inspect.isfunction(found):
            parts.append(found)
    return tuple(parts)
