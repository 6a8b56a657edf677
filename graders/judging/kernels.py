"""Torch's own kernel for an exercise's answer, refused however the learner's code reaches it.

A kernel taken under a computed name before the check starts passes the word scan and the
tripwires (graders.judging.learner): `torch.native_layer_norm` held in a variable, a Tensor
method, `torch.ops.aten`, `torch._C._nn`. Every such call passes torch's dispatcher, which
names the operator to torch's autograd profiler, composite operators included
(`aten::rms_norm`, `aten::scaled_dot_product_attention`). `refused` keeps that profiler on
while the learner's code runs and fails the check when an operator that `Forbidden.kernels`
declares for the exercise ran. The profiler starts in milliseconds (a TorchDispatchMode, as
graders.judging.library_ops uses for notebook 12, first imports torch's compiler). It sees the
calling thread only, as the course's other watches do.
"""
from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch.autograd import profiler

from graders.judging.compare import CheckFailed

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


@contextlib.contextmanager
def refused(forbidden, what: str):
    """Run the body (the learner's code) with the profiler on; afterwards raise CheckFailed naming
    the first of `forbidden.kernels` that ran, or the watch switched off. A refusal comes before
    the body's own failure: a kernel that crashed on the way is still torch's."""
    watch = profiler.profile()
    try:
        with _native_stderr_quiet():
            watch.__enter__()
    except RuntimeError:   # the learner's own profiling session, around the check
        raise CheckFailed(f"{what}: torch's profiler is already on, so the check cannot watch your code. Run the "
                          "check outside your profiling.") from None
    with profiler.record_function(START):
        pass
    failure = None
    try:
        yield
    except CheckFailed as failed:
        failure = failed
    finally:
        on = torch.autograd._profiler_enabled()
        if on:
            with profiler.record_function(END):
                pass
            with _native_stderr_quiet():
                watch.__exit__(None, None, None)
    ops = [event.name() for event in watch.kineto_results.events()] if on else []
    if START not in ops or END not in ops:
        raise CheckFailed(f"{what}: your code switched off the check's watch of torch's operators while it ran. "
                          "Remove that from your code.")
    ran = next((op for op in ops if any(matches(k, op) for k in forbidden.kernels)), None)
    if ran is not None:
        raise CheckFailed(f"{what}: your {what} runs {ran}, torch's own kernel for {forbidden.what}, however it is "
                          f"called (a torch function, a Tensor method, torch.ops.aten, torch._C). Write it "
                          f"yourself {forbidden.instead}.")
    if failure is not None:
        raise failure
