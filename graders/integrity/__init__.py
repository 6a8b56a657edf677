"""Keeping the course's answer out of the learner's kernel, and library answers out of their code.

The teaching and grading core uses this package through a few names:
- `Guard`: what an exercise's check needs of integrity beyond what it forbids the learner;
- `arm(session)`: a kernel's watches, before any learner code runs (the audit hook that hears of
  a replaced profiler or a started process; in a grading kernel, the torch kernels its checks
  refuse taken out of torch's dispatcher);
- `watch(exercise, learner, produce, given)`: runs one check's `produce` under the watches, and
  says whether the learner's code ran the course's answer or a library's;
- `receive(path)`: the course code a grading kernel is handed as a test cell starts;
- `kernel_refusals(forbidden, what)`: torch's kernels for an answer refused around learner code;
- `LibraryOps`, `WATCH_PARTS`, `refused_ops`: library routines refused at the dispatcher (12);
- `origin`, `LEARNER`, `file_functions`, `fingerprint`, `CourseCodeSealed`, `ANSWER_LIBRARIES`:
  where code that ran comes from, for the checks that read it (stubs, 11's library checks).
The grading host's side is `graders.integrity.host`; the torch routines the declarations name are
in `graders.integrity.library_kernels`. Nothing else of the package is imported from outside it.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Callable

from graders.integrity import kernel_bans as _kernel_bans
from graders.integrity import kernels as _kernels
from graders.integrity import library_ops as _library_ops
from graders.integrity import provenance as _provenance
from graders.integrity.allowed import given_part_names, given_parts, supplied_parts
from graders.integrity.deliveries import receive
from graders.integrity.kernel_bans import exercise_bans
from graders.integrity.library_ops import WATCH_PARTS, LibraryOps
from graders.integrity.origins import ANSWER_LIBRARIES, LEARNER, compiled_names, file_functions, fingerprint, origin
from graders.integrity.provenance import CourseCodeSealed
from graders.judging.compare import CheckFailed

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


@dataclass(frozen=True)
class Guard:
    """What integrity needs to know of one exercise's check, beyond what it forbids the learner
    (`Exercise.forbidden`). The defaults are right for most exercises."""
    # Course code the learner's code may run in this check, beside the composite's `course_parts`
    # and the notebook's given parts: a base class it builds on, a batch source it is handed.
    supplies: tuple = ()
    # Library routines for parts of the answer, refused at torch's dispatcher by the check itself
    # (`LibraryOps`, notebook 12).
    library_ops: tuple = ()
    # Torch kernels that a correct answer (or the check's own code) may run though another exercise
    # of the notebook refuses them (12's checkpoint check runs F.cross_entropy): the two are graded
    # in different kernels (graders.integrity.kernel_plan).
    may_run: tuple[str, ...] = ()

    def __post_init__(self):
        if self.library_ops:   # its watch's first use, paid as the notebook's checks load
            _library_ops.warm()

__all__ = ["ANSWER_LIBRARIES", "LEARNER", "WATCH_PARTS", "CourseCodeSealed", "Guard", "LibraryOps", "arm",
           "exercise_bans", "file_functions", "fingerprint", "kernel_refusals", "origin", "receive", "refused_ops",
           "supplied_parts", "watch"]


def arm(session) -> None:
    """Arm a kernel's watches for `session` (graders.judging.session.Session), before any learner
    code runs; the refused torch kernels stay refused for the kernel's whole life."""
    _provenance.install_audit_hook()
    _kernel_bans.arm(session.refused_kernels)


def kernel_refusals(forbidden, what: str):
    """A context in which torch's kernels that `forbidden` names raise its refusal."""
    return _kernels.refused(forbidden, what) if forbidden.kernels else contextlib.nullcontext()


def refused_ops(rule: LibraryOps, what: str):
    """A context in which the library routines `rule` names raise its refusal (notebook 12)."""
    return _library_ops.refused(rule, what)


def allowed_parts(exercise, given: tuple[str, ...] | None) -> tuple:
    """The course's parts the learner's code may run in `exercise`'s check: those it supplies, and
    the notebook's given parts (`given`: their names as a grading kernel's session hands them over;
    None: read from the notebook, in a learner's own kernel)."""
    names = given_part_names(exercise.notebook) if given is None else given
    return supplied_parts(exercise) + given_parts(names)


def watch(exercise, learner, produce: Callable[[], dict], given: tuple[str, ...] | None
          ) -> tuple[dict | None, CheckFailed | None, bool]:
    """(outputs, failure, refused) of `produce()`, run under the watches: refused when the
    learner's code (`learner`: what they passed to the check) ran the course's code or a library's
    answer, whatever it produced; a refused kernel's failure is worded as `exercise` words it."""
    bans = exercise_bans(exercise)
    builtins = any(compiled_names(tuple(rule.library_code)) for rule in exercise.forbidden)
    with _provenance.Watch(builtins=builtins) as watching:
        try:
            outputs, failure = produce(), None
        except CheckFailed as failed:
            outputs, failure = None, _kernel_bans.in_own_words(failed, bans)
    parts = allowed_parts(exercise, given)
    refusal = (watching.refusal(exercise.name, learner, parts, inspect.unwrap(exercise.produce))
               or watching.library_answer(exercise.name, exercise.forbidden))
    return (None, CheckFailed(refusal), True) if refusal else (outputs, failure, False)
