"""Library routines that compute an exercise's answer, refused at the level they run.

The word scan and the tripwires (graders.judging.learner) see names, and the profiler
(graders.integrity.provenance) sees Python functions and the compiled entry points it is told of.
An operator reached another way passes both: torch.ops.aten._log_softmax, torch._C._nn, a Tensor
method, a fused kernel, or torch's own Python source compiled again under another file name. Every
tensor operation reaches torch's dispatcher, so `refused` watches there: while the learner's code
runs, torch's profiler records each aten operator of every thread, in the order they start
(graders.integrity.kernels), and a TorchDispatchMode the Python functions on the stack when one
runs. Afterwards the check fails when one of them is declared (`LibraryOps`) as computing the
exercise's answer (a grading kernel has those operators taken out of its dispatcher too:
graders.integrity.kernel_bans):
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
from graders.integrity.kernels import OperatorWatch, matches, switched_off
from graders.integrity.origins import file_functions, fingerprint

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


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

    def refusal(self, name: str, op: str, what: str, where: str = "") -> str:
        """The check's words for the kernel `op` ("_log_softmax"), which is `what`, that ran."""
        return (f"{name}: your {name} runs aten::{op} ({what}){where}, torch's own kernel for part of {self.what}, "
                f"however it is called (a torch function, a Tensor method, torch.ops.aten, torch._C). Write it "
                f"yourself {self.instead}.")

    def kernel_bans(self, name: str) -> list[tuple[str, str]]:
        """(operator pattern, refusal) for graders.integrity.kernel_bans, "{op}" standing for the operator."""
        return [(f"aten::{pattern}", self.refusal(name, "{op}", what)) for pattern, what in self.ops]


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
    """Records the code of the Python frames the aten operators run under."""

    def __init__(self):
        super().__init__()
        self.codes: dict[int, object] = {}
        self.switched: list[str] = []       # the switches the learner's code called
        self.outermost = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
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
    from graders.integrity.origins import COPY, LEARNER, origin

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
    refusal = library_routine(rule, name, watch, ops)
    if refusal:
        raise CheckFailed(refusal)
    if failure is not None:
        raise failure


def library_routine(rule: LibraryOps, name: str, watch: OpWatch, ops: list[tuple[str, bool]] = ()) -> str | None:
    """Which of `rule`'s library routines the watch saw run (None: none did): its Python functions
    first (the outermost, the one the learner's code called), then its kernels among `ops` (the
    profiler's (operator, on another thread), in the order they started: the outermost first, as a
    grading kernel's dispatcher refuses it, graders.integrity.kernel_bans)."""
    index = _source_index(rule.sources)
    for code in reversed(watch.codes.values()):   # the outermost first
        found = index.get(fingerprint(code))
        if found:
            copied = "" if _same_file(code.co_filename, found) else ", compiled from a copy of its source"
            return (f"{name}: your {name} runs {found.replace(':', '.')}{copied}: torch's own implementation "
                    f"of {rule.what}. Write it yourself {rule.instead}.")
    for op, elsewhere in ops:
        op = op.removeprefix("aten::")
        what = rule.op(op)
        if what:
            return rule.refusal(name, op, what, " on another thread" if elsewhere else "")
    return None


def _same_file(filename: str, spec: str) -> bool:
    found = importlib.util.find_spec(spec.partition(":")[0])
    return found is not None and found.origin is not None and Path(filename) == Path(found.origin)


@functools.cache
def warm() -> None:
    """Enter a watch once, when a check that uses one is declared (Guard(library_ops=...)): the
    first dispatch mode of a process makes torch import its compiler stack (about a second), which
    a check's own clock should not pay, nor a kernel whose checks never watch."""
    with OpWatch():
        torch.zeros(1).add_(1)


# What of this module runs inside the learner's code: a check that watches declares it among the
# parts it supplies, so that provenance does not take it for a course answer the learner ran.
WATCH_PARTS = (OpWatch, _switches_watched)

