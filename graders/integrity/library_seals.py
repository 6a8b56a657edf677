"""Torch's Python routines for a kernel's graded answers, sealed in its file system.

An exercise declares the library code that computes its answer (`Forbidden.library_code`,
`LibraryOps.sources`: torch.optim's Adam, clip_grad_norm_, F.multi_head_attention_forward, ...).
In the learner's process a profiler refuses it (graders.integrity.provenance), which the learner's
code can switch off; and such routines compute from ordinary operators, which no dispatcher
refusal (graders.integrity.kernel_bans) touches. So a confined kernel that grades the exercise sees
each such module as a sealed copy, its routines' bodies replaced by a raise, in place of the file
and of its compiled copy (which would otherwise give the real code to `marshal`). Modules that
torch's own import runs, or whose functions run as it imports (a decorator, a table), keep those.

Torch's reference implementations (torch._refs, torch._decomp, torch._prims) compute most
answers from ordinary operators, and torch runs some of their code as it loads (registering
decompositions, defining primitives): of those packages, what runs while torch and the graders
load (recorded once per torch, `_run_while_loading`) stays real, and the rest is sealed.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import py_compile
import subprocess
import sys
from pathlib import Path

from graders.integrity.kernel_view import import_time_calls, seal_bodies, views_folder
from graders.reference.paths import atomic_write

SEALED = "RuntimeError"


def _files_of(module: str) -> list[Path]:
    """The source files of a torch module: a plain module's, or every one of a package's."""
    spec = importlib.util.find_spec(module) if module.startswith("torch.") else None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    if spec.submodule_search_locations:
        return sorted(p for folder in spec.submodule_search_locations for p in Path(folder).rglob("*.py"))
    return [Path(spec.origin)]


# Run in a fresh Python: the torch functions (file, top-level name) that run while torch, every
# notebook's checks (what a setup cell imports, whichever notebook a kernel grades: notebook 13's
# import notebook 12's, whose watch loads torch's compiler stack) and a few ordinary operators
# (autograd included) load and run.
_LOADING = """
import json, sys, threading
seen = set()
def profile(frame, event, arg):
    if event == "call" and "/torch/_" in frame.f_code.co_filename:
        seen.add((frame.f_code.co_filename, frame.f_code.co_qualname.split(".")[0]))
sys.setprofile(profile)
threading.setprofile(profile)
import torch
import graders.judging.exercise, graders.integrity.library_ops, graders.exercises
graders.exercises.declared_notebooks()
x = torch.randn(3, 5, requires_grad=True)
(x.softmax(-1) * x.tanh()).sum().backward()
sys.setprofile(None)
print(json.dumps(sorted(seen)))
"""


def _run_while_loading() -> frozenset[tuple[str, str]]:
    """What of torch runs as a kernel loads (`_LOADING`), recorded once per torch and version of
    the graders (the views folder is the graders')."""
    import torch

    stored = views_folder() / "library" / f"loading-{torch.__version__}.json"
    if not stored.is_file():
        done = subprocess.run([sys.executable, "-c", _LOADING], capture_output=True, text=True, check=True)
        stored.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(stored, lambda p: p.write_text(done.stdout.splitlines()[-1]))
    return frozenset(tuple(item) for item in json.loads(stored.read_text()))


def _called_on_import(tree: ast.Module) -> set[str]:
    """The module's own names that run as it is imported: called, or applied as a decorator."""
    defined = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    decorators = [d for node in ast.walk(tree) if isinstance(node, defined) for d in node.decorator_list]
    return {node.id for node in [*(c.func for c in import_time_calls(tree.body)), *decorators]
            if isinstance(node, ast.Name)}


def library_code(exercises) -> list[str]:
    """What `exercises` declare as library code that computes their answers ("module[:Qualname]")."""
    return sorted({spec for exercise in exercises
                   for spec in [*(s for f in exercise.forbidden for s in f.library_code),
                                *(s for rule in exercise.guard.library_ops for s in rule.sources)]})


def seals(specs: list[str]) -> dict[Path, frozenset[str]]:
    """{torch module file: the top-level functions and classes to seal} for library code `specs`."""
    wanted: dict[Path, set[str] | None] = {}
    for spec in specs:
        module, _, qualname = spec.partition(":")
        for path in _files_of(module):
            if not qualname:
                wanted[path] = None   # all of it
            elif wanted.get(path, set()) is not None:
                wanted.setdefault(path, set()).add(qualname.partition(".")[0])
    if not wanted:
        return {}
    loading = _run_while_loading()
    found = {}
    for path, names in wanted.items():
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        kept = _called_on_import(tree) | {name for file, name in loading if file == str(path)}
        found[path] = frozenset((defined if names is None else names & defined) - kept)
    return {path: names for path, names in found.items() if names}


def _sealed_source(path: Path, module: str, names: frozenset[str]) -> str:
    tree = ast.parse(path.read_text())

    def raising(qualname: str, method=None) -> list[ast.stmt]:
        message = (f"{module}.{qualname} is taken out of this grading kernel: a check it grades refuses it "
                   "(write the exercise yourself)")
        return ast.parse(f"raise {SEALED}({message!r})").body

    seal_bodies(tree, names, raising, methods_only=False)   # torch's own class statements stay
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def sealed_mounts(exercises) -> list[tuple[str, str, str]]:
    """The sandbox plan's mounts (graders.integrity.sandbox_kernel.bwrap_argv) showing each module
    sealed for `exercises` at its place: its source and, when torch ships one, its compiled copy.
    Made once per version of the graders and of torch (the course cache's views folder), each
    sealed file compiled beside its copy, so that a kernel compiles nothing (and a grading reads
    no torch source)."""
    import torch

    specs = library_code(exercises)
    if not specs:
        return []
    key = hashlib.sha256(json.dumps([specs, torch.__version__, torch.__file__]).encode()).hexdigest()[:16]
    stored = views_folder() / "library" / f"mounts-{key}.json"
    if not stored.is_file():
        mounts = _made(seals(specs))
        stored.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(stored, lambda p: p.write_text(json.dumps(mounts)))
    return [tuple(mount) for mount in json.loads(stored.read_text())]


def _made(sealing: dict[Path, frozenset[str]]) -> list[tuple[str, str, str]]:
    mounts, library = [], views_folder() / "library"
    for path, names in sorted(sealing.items()):
        name = _module_name(path)
        key = hashlib.sha256(str(path).encode() + path.read_bytes() + "\0".join(sorted(names)).encode())
        folder = library / key.hexdigest()[:16]
        source, compiled = folder / path.name, folder / (path.stem + ".pyc")
        if not compiled.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            if not source.is_file():
                atomic_write(source, lambda p: p.write_text(_sealed_source(path, name, names)))
            atomic_write(compiled, lambda p: py_compile.compile(str(source), cfile=str(p), dfile=str(path),
                                                                 doraise=True))
            for where in (folder.parent, folder, source, compiled):   # readable by the kernel's own uid
                where.chmod(0o755 if where.is_dir() else 0o644)
        mounts.append((str(path), "ro", str(source)))
        cached = Path(importlib.util.cache_from_source(str(path)))
        if cached.exists():
            mounts.append((str(cached), "ro", str(compiled)))
    return mounts


def _module_name(path: Path) -> str:
    import torch

    return "torch." + ".".join(path.relative_to(Path(torch.__file__).parent).with_suffix("").parts)
