"""What a confined grading kernel sees of the graders package: the answer is not there to take.

A notebook's kernel needs the course's machinery (running the learner's code, recording what it
produced) and the earlier notebooks' parts its given cells import, nothing that answers an
exercise. Each function or class that implements an exercise of any notebook (marked where it is
defined, `@course_answer("LayerNorm")`, graders.marks: so an earlier notebook's part that
computes the same thing is sealed too) or judges one (every exercise's `judge` and `inputs`, and the `*_mistakes`
catalogs), and every course function or class those call (a judge's expected value computed in
float64 is an answer too), is shown to the kernel as a sealed copy: the same names, classes and
signatures, every such body replaced by a `raise`. Imports keep working and a learner who reaches for the course's
code gets the same refusal as in their own kernel (graders.integrity.provenance), but no correct
implementation is on the kernel's file system, as source or as bytecode: the kernel sees the
package as a folder of its own (`kernel_package`), compiled from those copies.

Kept real: what the notebook's given cells import, with the course functions and classes they
name. What a test cell's checks run of the sealed code (a composite's parts, a course model
handed over) reaches the kernel as that cell starts (`delivery`, graders.integrity.deliveries),
and no later test cell of that kernel grades it (graders.integrity.kernel_plan).
"""
from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path

from graders.integrity.course_answers import course_answers, module_name
from graders.integrity.origins import PACKAGE, is_machinery
from graders.integrity.allowed import allowed_code, given_part_names, given_parts, supplied_parts

SEALED_ERROR = "CourseCodeSealed"


def _exercises_of(notebook: str) -> list:
    from graders.exercises import grader_module
    from graders.judging.exercise import _REGISTRY

    grader_module(notebook)
    return [e for key, e in sorted(_REGISTRY.items()) if key[0] == notebook]


def sealed(notebook: str, cells: tuple[str, ...] | None = None) -> dict[Path, set[str]]:
    """The top-level functions and classes, by file, that the kernel grading `cells` of `notebook`
    (grade_ids; None: a kernel that runs no check) sees sealed."""
    kept = kept_real(notebook, cells)
    return {path: set(names) - kept.get(path, set()) for path, names in _sealable().items()
            if set(names) - kept.get(path, set())}


@functools.lru_cache(maxsize=None)
def _answers_and_judges() -> tuple:
    """Every course answer (graders.marks.course_answer), judge, `inputs` function and mistake catalog."""
    import importlib

    from graders.exercises import declared_notebooks

    roots = [getattr(importlib.import_module(answer.module), answer.symbol) for answer in course_answers()]
    for name in declared_notebooks():
        for exercise in _exercises_of(name):
            roots += [fn for fn in (exercise.judge, exercise.inputs) if fn is not None]
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text()
        for node in ast.parse(source).body if "_mistakes" in source else ():
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_mistakes"):
                roots.append(getattr(importlib.import_module(module_name(path)), node.name))
    return tuple(inspect.unwrap(root) for root in roots)


@functools.lru_cache(maxsize=None)
def _sealable() -> dict[Path, frozenset[str]]:
    """`_answers_and_judges`, and the course functions and classes they name, transitively (a
    judge's float64 expected value, or a helper an implementation calls, is the answer too), by
    file. The machinery that may run inside the learner's code (origins.is_machinery) is never sealed."""
    return {path: frozenset(names) for path, names in _by_name(allowed_code(_answers_and_judges())).items()
            if not is_machinery(path)}


def cell_exercises(notebook: str, cells: tuple[str, ...] | None) -> list:
    """The exercises the test cells `cells` of `notebook` check."""
    from graders.exercises import find
    from graders.harness.manifest import notebook_checks

    listed = notebook_checks(notebook)
    return [find(key) for grade_id in cells or () if isinstance(listed.get(grade_id), list)
            for key, _ in listed[grade_id]]


@functools.lru_cache(maxsize=None)
def kept_real(notebook: str, cells: tuple[str, ...] | None) -> dict[Path, set[str]]:
    """What stays real in the kernel grading `cells`: the given parts, what the notebook's own
    cells and the package's imports call, and what those cells' checks run in the kernel (their
    `produce` and `describe`, and the parts a composite supplies), with the course's functions
    and classes they name."""
    kept: dict[Path, set[str]] = {}
    for found in [_kept_on_import(),
                  _by_name(allowed_code(given_parts(given_part_names(notebook)) + _called_by_course_cells(notebook))),
                  *(_kept_for(exercise.key) for exercise in cell_exercises(notebook, cells))]:
        for path, names in found.items():
            kept.setdefault(path, set()).update(names)
    return kept


def _by_name(codes) -> dict[Path, set[str]]:
    """The package's top-level functions and classes that `codes` belong to, by file."""
    found: dict[Path, set[str]] = {}
    for code in codes:
        path, top = Path(code.co_filename).resolve(), code.co_qualname.split(".")[0]
        if path.is_relative_to(PACKAGE) and "<" not in top:
            found.setdefault(path, set()).add(top)
    return found


@functools.lru_cache(maxsize=None)
def _kept_for(key: tuple[str, str]) -> dict[Path, set[str]]:
    """What an exercise's check runs in the kernel: its `produce` and `describe`, a composite's parts."""
    from graders.exercises import find

    exercise = find(key)
    return _by_name(allowed_code((inspect.unwrap(exercise.produce), *supplied_parts(exercise),
                                  *([exercise.describe] if exercise.describe else []))))


@functools.lru_cache(maxsize=None)
def _kept_on_import() -> dict[Path, set[str]]:
    """What importing the package runs. A class it instantiates then stays whole, but of its code
    only the constructors run (a recipe's other methods may call an answer)."""
    made = [item for item in _run_on_import() if inspect.isclass(item)]
    found = _by_name(allowed_code((*(item for item in _run_on_import() if not inspect.isclass(item)),
                                   *(vars(k)[m] for k in made for m in ("__new__", "__init__", "__post_init__")
                                     if inspect.isfunction(vars(k).get(m))))))
    for klass in made:
        found.setdefault(Path(inspect.getfile(klass)).resolve(), set()).add(klass.__qualname__.split(".")[0])
    return found


def _resolve(namespace: dict, node: ast.expr):
    """What a name or a dotted attribute (`tasks.sft_batches`) names in `namespace`, or None."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_resolve(namespace, node.value), node.attr, None)
    return None


def _course_callables(found) -> list:
    found = [inspect.unwrap(item) if hasattr(item, "__wrapped__") else item for item in found]   # lru_cache
    return [item for item in found if (inspect.isclass(item) or inspect.isfunction(item))
            and getattr(item, "__module__", "").startswith("graders.")]


def import_time_calls(body: list) -> list:
    """The calls a module's (or class's) body makes as it runs: not those inside function bodies."""
    calls = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            outside = [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]
            calls += [c for part in outside if part is not None for c in ast.walk(part) if isinstance(c, ast.Call)]
        elif isinstance(node, ast.ClassDef):
            calls += [c for part in [*node.decorator_list, *node.bases] for c in ast.walk(part)
                      if isinstance(c, ast.Call)]
            calls += import_time_calls(node.body)
        elif not _main_guard(node):
            calls += [c for c in ast.walk(node) if isinstance(c, ast.Call) and not _in_lambda(node, c)]
    return calls


def _main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`, which an import does not run."""
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)


def _in_lambda(root: ast.AST, call: ast.Call) -> bool:
    return any(isinstance(n, ast.Lambda) and any(c is call for c in ast.walk(n.body)) for n in ast.walk(root))


@functools.lru_cache(maxsize=None)
def _run_on_import() -> tuple:
    """The course functions and classes the package's modules call as they are imported (an
    exercise built by a helper, a table made once): a kernel that imports a module runs them."""
    import importlib

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        calls = import_time_calls(ast.parse(path.read_text()).body)
        if not calls:
            continue
        try:
            namespace = vars(importlib.import_module(module_name(path)))
        except Exception:   # a script or a configuration file, which no kernel imports
            continue
        found += _course_callables(_resolve(namespace, call.func) for call in calls)
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _called_by_course_cells(notebook: str) -> tuple:
    """The course functions and classes the released notebook's own cells (given code, tests) call
    through a course module one of them imports (09's `nb09.block_config()`, 13's
    `tasks.sft_batches(...)`)."""
    import importlib

    from graders.judging.testcells import released_course_sources

    trees = []
    for source in sorted(released_course_sources(notebook)):
        try:
            trees.append(ast.parse(source))
        except SyntaxError:
            continue
    modules = {}
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("graders."):
            modules |= {alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):   # `import graders.x.y` binds `graders`
            modules |= {alias.asname or "graders": alias.name if alias.asname else "graders"
                        for alias in node.names if alias.name.startswith("graders.")}
    namespace = {}
    for bound, module in modules.items():
        try:
            namespace[bound] = importlib.import_module(module)
        except ImportError:   # a function or class imported by name: a given part
            continue
    return tuple(_course_callables(_resolve(namespace, node.func) for tree in trees for node in _run_while_grading(tree)
                                   if isinstance(node, ast.Call)))


def _run_while_grading(tree: ast.AST):
    """The nodes of a cell, less the demonstrations (`if ready(...):`), which skip themselves in a
    grading kernel (graders.judging.progress.ready)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and any(isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1] == "ready"
                                            for c in ast.walk(node.test)):
            stack += [node.test, *node.orelse]
        else:
            stack += list(ast.iter_child_nodes(node))


def delivered(notebook: str, grade_id: str) -> dict[Path, set[str]]:
    """What the kernel's view seals and the checks of test cell `grade_id` run (a composite's
    course parts, a course model handed over): the kernel receives it as that cell starts."""
    base, mine = sealed(notebook), sealed(notebook, (grade_id,))
    return {path: names - mine.get(path, set()) for path, names in base.items() if names - mine.get(path, set())}


def delivery(notebook: str, grade_id: str) -> bytes | None:
    """`delivered(...)`'s real code, marshalled for graders.integrity.deliveries: for each module,
    the code of just those top-level definitions (nothing else of the module runs again)."""
    import marshal

    found = []
    for path, names in sorted(delivered(notebook, grade_id).items()):
        tree = ast.parse(path.read_text())
        tree.body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name in names]
        found.append((module_name(path), compile(tree, str(path), "exec"), tuple(sorted(names))))
    return marshal.dumps(found) if found else None


def seal_bodies(tree: ast.Module, names, raising, methods_only: bool) -> None:
    """In `tree`, give the top-level functions `names`, and every method of the top-level classes
    `names`, the body `raising(qualname, function)`; with `methods_only`, such a class keeps nothing
    else (its attributes could hold an answer)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            node.body = raising(node.name)
        elif isinstance(node, ast.ClassDef) and node.name in names:
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for method in methods:
                method.body = raising(f"{node.name}.{method.name}", method)
            if methods_only:
                node.body = methods or [ast.Pass()]


def sealed_source(path: Path, names: set[str]) -> str:
    """`path`'s module with the bodies of `names` (top-level functions, and classes' methods)
    replaced by a raise that names them."""
    tree = ast.parse(path.read_text())

    def raising(qualname: str, method=None) -> list[ast.stmt]:
        where = path.relative_to(PACKAGE.parent).as_posix()
        body = ast.parse(f"raise {SEALED_ERROR}({where!r}, {qualname!r})").body
        uses_class = method is not None and any(isinstance(n, ast.Name) and n.id in ("super", "__class__")
                                                for n in ast.walk(method))
        # Never reached; it keeps the `__class__` cell of a method that calls super(), so that a
        # delivery (graders.integrity.deliveries) can hand the method its real code.
        return body + (ast.parse("__class__").body if uses_class else [])

    seal_bodies(tree, names, raising, methods_only=True)
    at = next((i for i, n in enumerate(tree.body) if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
               and not (i == 0 and isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))), 0)
    tree.body[at:at] = ast.parse(f"from graders.integrity.provenance import {SEALED_ERROR}").body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


STALE_VIEW_SECONDS = 14 * 24 * 3600


def _prune_stale_views(current: Path) -> None:
    """Each version and place of the graders gets views of its own; those not used for two weeks
    (an older version, a checkout since removed) are removed when a new one is made."""
    import contextlib
    import shutil
    import time

    for other in current.parent.iterdir():
        with contextlib.suppress(FileNotFoundError):   # pruned by another grader meanwhile
            if other != current and other.is_dir() and other.stat().st_mtime < time.time() - STALE_VIEW_SECONDS:
                shutil.rmtree(other, ignore_errors=True)


def _package_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def views_folder() -> Path:
    """The course cache's folder for this place and version of the graders and the notebooks
    (source and released): the kernel views, their deliveries and the kernel plans."""
    import hashlib

    from graders.layout import EXERCISES, SOLUTIONS
    from graders.reference.paths import cache_dir

    # The compiled view and the deliveries name the package's own files (a code object's file is
    # how provenance tells the course's code from the learner's): a checkout elsewhere that shares
    # the cache needs a view of its own.
    digest = hashlib.sha256(str(PACKAGE).encode() + b"\0")
    for path in _package_sources() + sorted(EXERCISES.glob("*.ipynb")) + sorted(SOLUTIONS.glob("*.ipynb")):
        digest.update(str(path.relative_to(PACKAGE.parent)).encode() + b"\0" + path.read_bytes())
    return cache_dir("kernel-views", digest.hexdigest()[:16])


def kernel_package(notebook: str, grade_ids: tuple[str, ...] = ()) -> tuple[Path, dict[str, bytes | None]]:
    """The graders package as `notebook`'s grading kernels see it, and the `delivery` of each of
    `grade_ids`. The package is a folder of its own holding every module, each file that `sealed`
    names as its sealed copy, compiled (so that no kernel compiles, nor finds a real module's
    bytecode). Both are made once per place and version of the graders and the notebooks
    (`views_folder`: what decides them), in the course cache, the deliveries beside the folder (never in it: a
    kernel sees the folder); a grading kernel's own cache is a fresh folder."""
    import compileall
    import contextlib
    import marshal
    import os
    import shutil
    import tempfile

    from graders.reference.paths import atomic_write

    sources = _package_sources()
    folder = views_folder() / notebook
    with contextlib.suppress(OSError):   # in use: not stale (a cache shared read-only stays as it is)
        os.utime(folder.parent)
    if not folder.is_dir():
        _prune_stale_views(folder.parent)
        seal = sealed(notebook)
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
    made = folder.with_name(f"{notebook}.deliveries")
    known = marshal.loads(made.read_bytes()) if made.is_file() else {}
    if not set(grade_ids) <= known.keys():
        known |= {grade_id: delivery(notebook, grade_id) for grade_id in grade_ids}
        atomic_write(made, lambda path: path.write_bytes(marshal.dumps(known)))
    return folder, {grade_id: known[grade_id] for grade_id in grade_ids}
