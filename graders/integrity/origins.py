"""Where a function that ran comes from: the learner's cells, a library, the course's machinery,
the course's own code, a copy of it compiled from a string, or a library that holds the answers.
graders.integrity.provenance decides from these origins whether a check's answer is the learner's.
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import os
import sys
from dataclasses import dataclass
from pathlib import Path

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

PACKAGE = Path(__file__).resolve().parents[1]
# A graders file whose code may run inside the learner's code (the check's own machinery:
# tripwires, submodule watchers; the config and loading helpers a learner may call) says so where
# it is written, with a module-level `RUNS_IN_LEARNER_CODE = True` (graders.marks). None of them
# implements anything a notebook grades.
MACHINERY_MARK = "RUNS_IN_LEARNER_CODE"
ANSWER_LIBRARIES = ("transformer_lens", "transformers")   # libraries that hold the answers
LEARNER, LIBRARY, MACHINE, COURSE, COPY, ANSWER_LIBRARY = (
    "learner", "library", "machinery", "course", "copy", "answer library")


@dataclass(frozen=True)
class Origin:
    kind: str
    where: str = ""     # the course file, the course function a copy matches, or the library


def _library_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(sorted(str(Path(r).resolve()) + os.sep for r in roots))


@functools.lru_cache(maxsize=1)
def _answer_library_dirs() -> tuple[tuple[str, str], ...]:
    import importlib.util

    found = []
    for name in ANSWER_LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found += [(str(Path(p).resolve()) + os.sep, name) for p in spec.submodule_search_locations]
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _module_location(module: str) -> str:
    """A module's file, or a package's folder followed by a separator ("" if not installed)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None:
        return ""
    if spec.submodule_search_locations:
        return str(Path(next(iter(spec.submodule_search_locations))).resolve()) + os.sep
    return str(Path(spec.origin).resolve()) if spec.origin else ""


@functools.lru_cache(maxsize=None)
def library_answer_spec(specs: tuple, filename: str, qualname: str) -> str | None:
    """The entry of `specs` ("module" or "module:Qualname") that a function that ran belongs to."""
    path = str(Path(filename).resolve()) if os.path.isabs(filename) else filename
    for spec in specs:
        module, _, within = spec.partition(":")
        location = _module_location(module)
        in_module = location and (path == location or location.endswith(os.sep) and path.startswith(location))
        if in_module and (not within or qualname == within or qualname.startswith(within + ".")):
            return spec
    return None


@functools.lru_cache(maxsize=None)
def compiled_names(specs: tuple) -> tuple[str, ...]:
    """The names under which the profiler shows the compiled (C or Rust) classes and functions
    among `specs` ("tiktoken._tiktoken:CoreBPE"): Python code of the library calls into them, and
    a learner could call them directly, where only a profiler of builtins sees it."""
    import importlib

    names = []
    for spec in specs:
        module, _, within = spec.partition(":")
        try:
            found = getattr(importlib.import_module(module), within) if within else None
        except (ImportError, AttributeError):
            continue
        if found is not None and _compiled(found):
            names.append(found.__name__)
    return tuple(names)


def _compiled(found) -> bool:
    if inspect.isbuiltin(found):
        return True
    module_file = getattr(sys.modules.get(getattr(found, "__module__", "")), "__file__", None) or ""
    return isinstance(found, type) and not module_file.endswith(".py")


def compiled_call(entry: str, names: tuple[str, ...]) -> str | None:
    """Which of `names` a profiler entry of a compiled call ("<method 'encode' of 'builtins.CoreBPE'
    objects>", "<built-in method x>") belongs to."""
    for name in names:
        if entry.endswith((f".{name}' objects>", f"'{name}' objects>")):
            return f"{name}.{entry.split(chr(39))[1]}"
        if entry.startswith("<built-in ") and entry.rstrip(">").split(" ")[-1].split(".")[-1] == name:
            return name
    return None


def fingerprint(code) -> tuple:
    """What a function computes, not what it is called: its bytecode, names and constants."""
    consts = tuple(repr(c) for c in code.co_consts if not inspect.iscode(c))
    return code.co_code, code.co_names, consts


def file_functions(path: Path):
    """The code objects of the functions and classes compiled from the Python file `path`
    (none if it cannot be read or compiled), comprehensions and one-liners left out."""
    try:
        module = compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return
    stack = [module]
    while stack:
        code = stack.pop()
        stack += [c for c in code.co_consts if inspect.iscode(c)]
        if code is not module and not code.co_name.startswith("<") and len(code.co_code) >= 24:
            yield code


@functools.lru_cache(maxsize=None)
def is_machinery(path: Path) -> bool:
    """Whether a graders file carries the machinery mark: read from its source, never imported
    (a file this kernel cannot read is not machinery)."""
    try:
        body = ast.parse(path.read_text(encoding="utf-8")).body
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return False
    return any(isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [MACHINERY_MARK]
               and isinstance(node.value, ast.Constant) and node.value.value is True for node in body)


@functools.lru_cache(maxsize=1)
def course_index() -> dict[tuple, str]:
    """Every function of the course's own code (not its machinery) by fingerprint, as this
    kernel's file system shows it: how a copy compiled from its source is recognised."""
    index: dict[tuple, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not is_machinery(path):
            for code in file_functions(path):
                index.setdefault(fingerprint(code), f"graders/{relative} ({code.co_qualname})")
    return index


def _is_cell(code) -> bool:
    """A cell of this IPython kernel: registered in linecache without a file, with the function's
    own `def` at its first line (a course function renamed to a cell's name has not)."""
    entry = linecache.cache.get(code.co_filename)
    if entry is None or entry[1] is not None:
        return False
    if code.co_name.startswith("<"):
        return True
    return code.co_name in linecache.getline(code.co_filename, code.co_firstlineno)


_ORIGINS: dict = {}


def origin(code) -> Origin:
    """Where a code object comes from (cached: classified once per kernel, by identity first:
    hashing a code object hashes its bytecode)."""
    seen = _BY_ID.get(id(code))
    if seen is not None and seen[0] is code:
        return seen[1]
    key = (code, code.co_filename)   # equal code objects from two files are two origins
    found = _ORIGINS.get(key)
    if found is None:
        found = _ORIGINS[key] = _classify(code)
    _BY_ID[id(code)] = (code, found)   # holds the code object, so its id is not reused
    return found


_BY_ID: dict = {}


def _classify(code) -> Origin:
    filename = code.co_filename
    if os.path.isabs(filename) and os.path.isfile(filename):
        return _file_origin(filename)
    if _is_cell(code):
        return Origin(LEARNER)
    # Frozen modules, and code generated from strings (dataclasses', a learner's own exec):
    # library code, unless it is a copy of the course's.
    copied = None if filename.startswith("<frozen ") else course_index().get(fingerprint(code))
    return Origin(COPY, copied) if copied else Origin(LIBRARY)


@functools.lru_cache(maxsize=None)
def _file_origin(filename: str) -> Origin:
    path = str(Path(filename).resolve())
    if path.startswith(str(PACKAGE) + os.sep):
        relative = Path(path).relative_to(PACKAGE).as_posix()
        return Origin(MACHINE if is_machinery(Path(path)) else COURSE, f"graders/{relative}")
    for root, name in _answer_library_dirs():
        if path.startswith(root):
            return Origin(ANSWER_LIBRARY, name)
    return Origin(LIBRARY) if path.startswith(_library_roots()) else Origin(LEARNER)


def library_class(klass) -> bool:
    """A class of a library the learner may use (torch's nn.Module): its attributes are not
    looked into."""
    filename = getattr(sys.modules.get(klass.__module__), "__file__", None)
    return klass.__module__ == "builtins" or (filename is not None and _file_origin(filename).kind == LIBRARY)
