"""Torch's own kernels for a kernel's graded answers, taken out of its dispatcher before any
learner code runs.

The watches of graders.integrity.kernels and graders.integrity.library_ops run in the learner's own
process, and its code can switch them off (patch the graders' modules, stop the profiler). A
grading kernel is therefore started with the kernels its graded exercises refuse replaced, in
torch's dispatcher, by one that raises the exercise's refusal: every overload of each operator, at
every dispatch key that holds a kernel for it (CPU, the composite keys, nested and sparse
tensors, autograd, vmap), so that no route (a torch function, a Tensor method, torch.ops.aten,
`_op_dk`, another layout, another thread) reaches the original. Torch keeps a replaced kernel
only while the registration lives: the registration is never released, and nothing in Python
refers to it (it is not an object the garbage collector lists), so no Python code can undo it
(code that rewrites its own process's memory can: "Not protected" in docs/grading.md).

Only a kernel's graded exercises' refusals are armed, for its whole life: an exercise whose
correct answers may run another's refused kernel is graded in another kernel
(graders.integrity.kernel_plan, `Guard.may_run`).
"""
from __future__ import annotations

import ctypes
import re
import warnings
from typing import Iterable

import torch

from graders.judging.compare import CheckFailed
from graders.integrity.kernels import matches

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

# What an operator's registration dump lists that is not a dispatch key of a kernel, and the key
# whose kernels compute only shapes (never an answer).
_NOT_REPLACED = ("debug", "Meta")
_KEY = re.compile(r"^(\w+)(?:\[alias\])?: registered at", re.M)


def operators(pattern: str) -> list[str]:
    """Every overload torch's dispatcher has of `pattern` ("aten::gelu" or a family
    "aten::_foreach_*"), as "aten::gelu", "aten::gelu.out", ..."""
    return sorted(op for op in torch._C._dispatch_get_all_op_names() if matches(pattern, op.partition(".")[0]))


def _keys(op: str) -> list[str]:
    return [key for key in _KEY.findall(torch._C._dispatch_dump(op)) if key not in _NOT_REPLACED]


class KernelRefused(CheckFailed):
    """A refused kernel ran: `operator` ("gelu") names it."""

    def __init__(self, message: str, operator: str):
        super().__init__(message)
        self.operator = operator


def _refusing(message: str, operator: str):
    def refuse(*args, **kwargs):
        raise KernelRefused(message, operator)
    return refuse


def exercise_bans(exercise) -> list[tuple[str, str]]:
    """(operator pattern, refusal) for each torch kernel `exercise` refuses, "{op}" standing for
    the operator: what a kernel that grades it takes out of torch's dispatcher."""
    return [*((kernel, forbidden.kernel_refusal(exercise.name, "aten::{op}"))
              for forbidden in exercise.forbidden for kernel in forbidden.kernels),
            *(ban for rule in exercise.guard.library_ops for ban in rule.kernel_bans(exercise.name))]


def in_own_words(failure: CheckFailed, bans: list[tuple[str, str]]) -> CheckFailed:
    """`failure`, when a refused kernel raised it and the check's own exercise refuses that kernel
    too (`bans`), in that exercise's words: a kernel refused by two exercises of one grading kernel
    (12's AdamW and clipping both refuse "_foreach_*") was armed with the first one's."""
    operator = getattr(failure, "operator", None)
    found = next((refusal for pattern, refusal in bans if operator and matches(pattern, f"aten::{operator}")), None)
    return failure if found is None else KernelRefused(found.replace("{op}", operator), operator)


def arm(bans: Iterable[tuple[str, str]]) -> None:
    """Replace each operator of each (pattern, refusal) in `bans` by one that raises the refusal
    ("{op}" in it stands for the operator's name, "gelu"). For good: call it before any learner code runs."""
    bans = list(bans)
    if not bans:
        return
    library = torch._C._dispatch_library("IMPL", "aten", "")
    armed: set[str] = set()
    with warnings.catch_warnings():   # "overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        for pattern, refusal in bans:
            for op in operators(pattern):
                if op in armed:   # the first exercise's refusal names it
                    continue
                armed.add(op)
                name, _, overload = op.removeprefix("aten::").partition(".")
                refuse = _refusing(refusal.replace("{op}", name), name)
                for key in _keys(op):
                    library.impl(f"{name}.{overload}" if overload else name, key, refuse, False)
    # Released, the registration would give the original kernels back: it never is.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))
