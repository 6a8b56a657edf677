"""Torch's own kernel for an exercise's answer, refused however the learner's code reaches it.

A kernel taken under a computed name before the check starts passes the word scan and the
tripwires (graders.judging.learner): `torch.native_layer_norm` held in a variable, a Tensor
method, `torch.ops.aten`, `torch._C._nn`. Every such call passes torch's dispatcher, which
names the operator to torch's autograd profiler, composite operators included
(`aten::rms_norm`, `aten::scaled_dot_product_attention`). `refused` keeps that profiler on
while the learner's code runs and fails the check when an operator that `Forbidden.kernels`
declares for the exercise ran. The profiler starts in milliseconds (a TorchDispatchMode, as
graders.integrity.library_ops uses for notebook 12, first imports torch's compiler). It watches
every thread, so that a thread the learner's code started before the check (a worker waiting on
a queue, a thread pool) does not run the kernel unseen.
"""
from __future__ import annotations

import contextlib
import os
import sys

from torch._C._profiler import _ExperimentalConfig
from torch.autograd import profiler

from graders.judging.compare import CheckFailed

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

# Marks made as the watch starts and ends: both are in its results only if the learner's code
# left the profiler on in between (not stopped, nor stopped and started again).
START, END = "graders::check_starts", "graders::check_ends"


def matches(pattern: str, op: str) -> bool:
    """Whether the dispatcher's operator `op` ("aten::native_layer_norm") is `pattern`: a name, or a
    family ("aten::_scaled_dot_product_*")."""
    return op.startswith(pattern[:-1]) if pattern.endswith("*") else op == pattern


@contextlib.contextmanager
def _native_stderr_quiet():
    """Torch's profiler announces its start and stop on file descriptor 2, below Python: the
    learner's notebook would show it, and nbgrader zeroes a test cell that wrote to stderr."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class OperatorWatch:
    """Torch's profiler of every thread, on while the learner's code runs: `stop` gives each
    operator that ran, as (its name, whether on another thread than the watching one), or None
    when the learner's code stopped the profiler on the way. One at a time: a second watch inside
    a first ends the first's profiling session with its own."""

    def __init__(self, what: str):
        self.what = what
        self.profile = profiler.profile(experimental_config=_ExperimentalConfig(profile_all_threads=True))

    def start(self) -> None:
        try:
            with _native_stderr_quiet():
                self.profile.__enter__()
        except RuntimeError:   # the learner's own profiling session, around the check
            raise CheckFailed(f"{self.what}: torch's profiler is already on, so the check cannot watch your code. "
                              "Run the check outside your profiling.") from None
        with profiler.record_function(START):
            pass

    def stop(self) -> list[tuple[str, bool]] | None:
        # Stopped by the learner's code, the profiler records neither mark nor anything else: its
        # results are then empty (its state is not asked, which a profiler of every thread does
        # not keep in this one).
        with profiler.record_function(END):
            pass
        with _native_stderr_quiet():
            self.profile.__exit__(None, None, None)
        results = getattr(self.profile, "kineto_results", None)
        events = [(event.name(), event.start_thread_id()) for event in results.events()] \
            if results is not None else []
        names = [name for name, _ in events]
        if START not in names or END not in names:
            return None
        watching = events[names.index(START)][1]
        return [(name, thread != watching) for name, thread in events]


def switched_off(what: str, how: str = "") -> CheckFailed:
    return CheckFailed(f"{what}: your code switched off the check's watch of torch's operators while it ran"
                       f"{f' ({how})' if how else ''}. Remove that from your code.")


@contextlib.contextmanager
def refused(forbidden, what: str):
    """Run the body (the learner's code) with the profiler on; afterwards raise CheckFailed naming
    the first of `forbidden.kernels` that ran, or the watch switched off. A refusal comes before
    the body's own failure: a kernel that crashed on the way is still torch's."""
    watch = OperatorWatch(what)
    watch.start()
    failure = None
    try:
        yield
    except CheckFailed as failed:
        failure = failed
    finally:
        ops = watch.stop()
    if ops is None:
        raise switched_off(what)
    ran = next((op for op, _ in ops if any(matches(k, op) for k in forbidden.kernels)), None)
    if ran is not None:
        raise CheckFailed(forbidden.kernel_refusal(what, ran))
    if failure is not None:
        raise failure
