"""Library routines that compute an exercise's answer, refused at the level they run.

The word scan and the tripwires (graders.judging.learner) see names, and the profiler
(graders.judging.provenance) sees Python functions and the compiled entry points it is told of.
An operator reached another way passes both: torch.ops.aten._log_softmax, torch._C._nn, a Tensor
method, a fused kernel, or torch's own Python source compiled again under another file name. Every
tensor operation reaches torch's dispatcher, so `refused` watches there: while the learner's code
runs, a TorchDispatchMode records each aten operator and the Python functions on the stack when
it runs, and torch's profiler the operators of every other thread (graders.judging.kernels).
Afterwards the check fails when one of them is declared (`LibraryOps`) as computing the
exercise's answer:
- an aten operator, by name or by family ("_foreach_", torch's multi-tensor kernels);
- a function of a library module, whether it ran from the library's file or from a copy compiled
  from its source (code compiled from a library file's source is the library's code).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from graders.judging.compare import CheckFailed
from graders.judging.kernels import OperatorWatch, matches, switched_off
from graders.judging.origins import file_functions, fingerprint


@dataclass(frozen=True)
class LibraryOps:
    """What of a library computes an exercise's answer, and what to do instead."""
    what: str                           # "the cross-entropy"
    ops: tuple[tuple[str, str], ...]    # (aten operator, or a family as "_foreach_*"; what it is)
    sources: tuple[str, ...] = ()       # "package.module" (all of it) or "package.module:Qualname"
    instead: str = "from tensor operations"

    def op(self, name: str) -> str | None:
        """What the aten operator `name` ("_log_softmax") is, if this exercise refuses it."""
        return next((what for pattern, what in self.ops if matches(pattern, name)), None)


@functools.lru_cache(maxsize=None)
def _source_index(sources: tuple[str, ...]) -> dict[tuple, str]:
    """The functions of `sources`, compiled from their files, by fingerprint: "module:Qualname"."""
    index = {}
    for spec in sources:
        module, _, within = spec.partition(":")
        found = importlib.util.find_spec(module)
        if found is None or not found.origin or not found.origin.endswith(".py"):
            continue
        for code in file_functions(Path(found.origin)):
            if not within or code.co_qualname == within or code.co_qualname.startswith(within + "."):
                index.setdefault(fingerprint(code), f"{module}:{code.co_qualname}")
    return index


class OpWatch(TorchDispatchMode):
    """Records the aten operators that run, and the code of the Python frames they run under."""

    def __init__(self):
        super().__init__()
        self.ops: dict[str, None] = {}
        self.codes: dict[int, object] = {}
        self.switched: list[str] = []       # the switches the learner's code called
        self.outermost = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.setdefault(func._schema.name.removeprefix("aten::"), None)
        frame = sys._getframe(1)
        while frame is not None and frame is not self.outermost:
            self.codes.setdefault(id(frame.f_code), frame.f_code)   # kept: its id is not reused
            frame = frame.f_back
        return func(*args, **(kwargs or {}))


# The ways to take a dispatch mode off torch's stack: while a watch runs, each records a call from
# the learner's own code (torch's own calls pass), and the check fails. A reference taken before
# the check goes round them; a mode popped for good is still seen when the watch ends.
SWITCHES = (("torch.utils._python_dispatch", "_disable_current_modes"),
            ("torch.utils._python_dispatch", "_pop_mode_temporarily"), ("torch.utils._python_dispatch", "_pop_mode"),
            ("torch._C", "_pop_torch_dispatch_stack"), ("torch._C", "_unset_dispatch_mode"),
            ("torch._C", "_set_dispatch_mode"))


@contextlib.contextmanager
def _switches_watched(watch: OpWatch):
    from graders.judging.origins import COPY, LEARNER, origin

    saved = []

    def recording(original, name):
        @functools.wraps(original)
        def switch(*args, **kwargs):
            if origin(sys._getframe(1).f_code).kind in (LEARNER, COPY):
                watch.switched.append(name)
            return original(*args, **kwargs)
        return switch
    try:
        for module, attribute in SWITCHES:
            owner = sys.modules[module]
            original = getattr(owner, attribute, None)
            if original is not None:
                saved.append((owner, attribute, original))
                setattr(owner, attribute, recording(original, f"{module}.{attribute}"))
        yield
    finally:
        for owner, attribute, original in reversed(saved):
            setattr(owner, attribute, original)


@contextlib.contextmanager
def refused(rule: LibraryOps, name: str):
    """Run the body (the learner's code) under an OpWatch; afterwards raise CheckFailed naming the
    first library routine of `rule` that ran, or the watch switched off. A refusal comes before
    the body's own failure: a library kernel that crashed on the way is still the library's."""
    threads = OperatorWatch(name)   # the operators of the other threads (a dispatch mode sees its own)
    threads.start()
    watch = OpWatch()
    watch.outermost = sys._getframe(2)   # the caller of the with statement: the check's own code
    failure = None
    watch.__enter__()
    try:
        with _switches_watched(watch):
            yield watch
    except CheckFailed as failed:
        failure = failed
    finally:
        how = [f"it calls {called}" for called in watch.switched[:1]] or \
            ([] if watch in _get_current_dispatch_mode_stack() else ["the watch was off torch's stack at the end"])
        with contextlib.suppress(Exception):   # a stack the learner's code left unbalanced
            watch.__exit__(None, None, None)
        ops = threads.stop()
    if how or ops is None:
        raise switched_off(name, *how)
    refusal = library_routine(rule, name, watch, [op.removeprefix("aten::") for op, elsewhere in ops if elsewhere])
    if refusal:
        raise CheckFailed(refusal)
    if failure is not None:
        raise failure


def library_routine(rule: LibraryOps, name: str, watch: OpWatch, elsewhere: list[str] = ()) -> str | None:
    """Which of `rule`'s library routines the watch saw run (None: none did): its Python functions
    first (the outermost, the one the learner's code called), then its kernels, this thread's and
    then `elsewhere`'s (the operators other threads ran meanwhile)."""
    index = _source_index(rule.sources)
    for code in reversed(watch.codes.values()):   # the outermost first
        found = index.get(fingerprint(code))
        if found:
            copied = "" if _same_file(code.co_filename, found) else ", compiled from a copy of its source"
            return (f"{name}: your {name} runs {found.replace(':', '.')}{copied}: torch's own implementation "
                    f"of {rule.what}. Write it yourself {rule.instead}.")
    for op, where in [*((op, "") for op in watch.ops), *((op, " on another thread") for op in elsewhere)]:
        what = rule.op(op)
        if what:
            return (f"{name}: your {name} runs aten::{op} ({what}){where}, torch's own kernel for part of "
                    f"{rule.what}, however it is called (a torch function, a Tensor method, torch.ops.aten, "
                    f"torch._C). Write it yourself {rule.instead}.")
    return None


def _same_file(filename: str, spec: str) -> bool:
    found = importlib.util.find_spec(spec.partition(":")[0])
    return found is not None and found.origin is not None and Path(filename) == Path(found.origin)


def _warm() -> None:
    """Enter a watch once, when the checks are loaded: the first dispatch mode of a process makes
    torch import its compiler stack (about a second), which a check's own clock should not pay."""
    with OpWatch():
        torch.zeros(1).add_(1)


# What of this module runs inside the learner's code: a check that watches declares it among the
# parts it supplies, so that provenance does not take it for a course answer the learner ran.
WATCH_PARTS = (OpWatch, _switches_watched)


_warm()
