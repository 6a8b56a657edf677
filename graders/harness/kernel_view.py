"""What a confined grading kernel sees of the graders package: the answer is not there to take.

A notebook's kernel needs the course's machinery (running the learner's code, recording what it
produced) and the earlier notebooks' parts its given cells import, nothing that answers an
exercise. Each function or class that implements an exercise of any notebook (declared beside
the notebook: `Notebook.implementations`: so an earlier notebook's part that computes the same
thing is sealed too) or judges one (every exercise's `judge` and `inputs`, and the `*_mistakes`
catalogs) is shown to the kernel as a sealed copy: the same names, classes and signatures, every
such body replaced by a `raise`. Imports keep working and a learner who reaches for the course's
code gets the same refusal as in their own kernel (graders.judging.provenance), but no correct
implementation is on the kernel's file system, as source or as bytecode: the kernel sees the
package as a folder of its own (`kernel_package`), compiled from those copies.

Kept real: what the notebook's given cells import and what the checks a kernel grades run in
it (their `produce`, the parts a composite supplies), with the course functions and classes they
name. A notebook is graded in as many kernels as it takes for none of them to hold real the
answer of a check it grades (graders.harness.kernel_plan).
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from graders.judging.origins import PACKAGE
from graders.judging.provenance import allowed_code, given_parts

SEALED_ERROR = "CourseCodeSealed"


def _exercises_of(notebook: str) -> list:
    from graders.exercises import grader_module
    from graders.judging.exercise import _REGISTRY

    grader_module(notebook)
    return [e for key, e in sorted(_REGISTRY.items()) if key[0] == notebook]


def _function_name(fn) -> tuple[Path, str] | None:
    """(file, top-level name) of a module-level function or class of the graders package."""
    fn = inspect.unwrap(fn)
    module = inspect.getmodule(fn)
    path = Path(getattr(module, "__file__", "") or "").resolve()
    name = getattr(fn, "__qualname__", "")
    if not path.is_relative_to(PACKAGE) or "." in name or "<" in name:
        return None
    return path, name


def supplied_parts(exercise) -> tuple:
    """The course's parts a composite's check runs inside the learner's code (none for others)."""
    return (*exercise.supplies, *getattr(exercise.produce, "supplies", ()))


def sealed(notebook: str, cells: tuple[str, ...] | None = None) -> dict[Path, set[str]]:
    """The top-level functions and classes, by file, that the kernel grading `cells` of `notebook`
    (grade_ids; None: a kernel that runs no check) sees sealed."""
    from graders.exercises import declared_notebooks

    declared = declared_notebooks()
    wanted: dict[Path, set[str]] = {}

    def add(path: Path, name: str) -> None:
        wanted.setdefault(path, set()).add(name)

    for name, declaration in declared.items():
        for entry in declaration.implementations:
            file, _, symbol = entry.partition(":")
            add(PACKAGE / file, symbol)
        for exercise in _exercises_of(name):
            for fn in (exercise.judge, exercise.inputs):
                found = _function_name(fn)
                if found:
                    add(*found)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_mistakes"):
                add(path.resolve(), node.name)
    kept = kept_real(notebook, cells)
    return {path: names - kept.get(path, set()) for path, names in wanted.items() if names - kept.get(path, set())}


def cell_exercises(notebook: str, cells: tuple[str, ...] | None) -> list:
    """The exercises the test cells `cells` of `notebook` check."""
    from graders.exercises import find
    from graders.harness.manifest import notebook_checks

    listed = notebook_checks(notebook)
    return [find(key) for grade_id in cells or () if isinstance(listed.get(grade_id), list)
            for key, _ in listed[grade_id]]


def kept_real(notebook: str, cells: tuple[str, ...] | None) -> dict[Path, set[str]]:
    """What stays real in the kernel grading `cells`: the given parts, and what those cells'
    checks run in the kernel (their `produce`, and the parts a composite supplies), with the
    course's functions and classes they name."""
    parts = list(given_parts(notebook))
    for exercise in cell_exercises(notebook, cells):
        parts += [inspect.unwrap(exercise.produce), *supplied_parts(exercise)]
    kept: dict[Path, set[str]] = {}
    for code in allowed_code(tuple(parts)):
        module_file = Path(code.co_filename).resolve()
        top = code.co_qualname.split(".")[0]
        if module_file.is_relative_to(PACKAGE) and "<" not in top:
            kept.setdefault(module_file, set()).add(top)
    return kept


def sealed_source(path: Path, names: set[str]) -> str:
    """`path`'s module with the bodies of `names` (top-level functions, and classes' methods)
    replaced by a raise that names them."""
    tree = ast.parse(path.read_text())
    module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")

    def raising(qualname: str) -> list[ast.stmt]:
        return ast.parse(f"raise {SEALED_ERROR}({module + '.' + qualname!r})").body

    body = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            node.body = raising(node.name)
        elif isinstance(node, ast.ClassDef) and node.name in names:
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for method in methods:
                method.body = raising(f"{node.name}.{method.name}")
            node.body = methods or [ast.Pass()]
        body.append(node)
    at = next((i for i, n in enumerate(body) if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
               and not (i == 0 and isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))), 0)
    body[at:at] = ast.parse(f"from graders.judging.provenance import {SEALED_ERROR}").body
    tree.body = body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def kernel_package(notebook: str, cells: tuple[str, ...] | None = None) -> Path:
    """The graders package as the kernel grading `cells` of `notebook` sees it: a folder of its
    own holding every module, each file that `sealed` names as its sealed copy, compiled (so that
    no kernel compiles, nor finds a real module's bytecode). Made once per version of the graders and the released
    notebooks (what decides it), in the course cache; a grading kernel's cache is a fresh folder."""
    import compileall
    import hashlib
    import os
    import shutil
    import tempfile

    from graders.layout import EXERCISES
    from graders.reference.paths import cache_dir

    sources = sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in sources + sorted(EXERCISES.glob("*.ipynb")):
        digest.update(str(path.relative_to(PACKAGE.parent)).encode() + b"\0" + path.read_bytes())
    group = hashlib.sha256(repr(sorted(cells or ())).encode()).hexdigest()[:10]
    folder = cache_dir("kernel-views", digest.hexdigest()[:16]) / f"{notebook}-{group}"
    if not folder.is_dir():
        seal = sealed(notebook, cells)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{notebook}."))
        for path in sources:
            copy = staging / path.relative_to(PACKAGE)
            copy.parent.mkdir(parents=True, exist_ok=True)
            if path.resolve() in seal:
                copy.write_text(sealed_source(path.resolve(), seal[path.resolve()]))
            else:
                shutil.copyfile(path, copy)
        compileall.compile_dir(staging, quiet=2, ddir=str(PACKAGE))
        for where in [staging, *staging.rglob("*")]:   # readable by the kernel's own uid
            where.chmod(0o755 if where.is_dir() else 0o644)
        try:
            os.rename(staging, folder)
        except OSError:   # another grader made it meanwhile: theirs is the same
            shutil.rmtree(staging, ignore_errors=True)
    return folder
