"""An exercise: what the learner's code is run on, and how what it produced is judged.

Each `Exercise` declares, in one place, everything the harness needs to grade it safely:
- `notebook` and `name`: its key. Keys are unique across the course; a second registration
  of the same key fails at import, naming both places.
- `inputs(case)`: the only tensors the learner's kernel receives (computed by the trusted
  grading process from the reference). Expected outputs never cross into the kernel.
- `produce(learner, case, inputs)`: runs the learner's code (in the kernel) and returns tensors.
- `judge(case, outputs)`: decides, in a process that never runs learner code.
- `forbidden`: library versions of the thing being built, refused in the learner's code.
- `defaults`: case fields its check functions use unless the test cell says otherwise.
- `describe`: how its messages name a case, where `Case.describe`'s words do not fit (notebook
  11's seeds choose hidden texts, not random inputs).
- `course_parts`: a composite's parts run in the course's version, so a part's mistake costs
  that part's check only.
- `guard`: what integrity needs beyond `forbidden` (graders.integrity.Guard); most need nothing.
A test cell is linked to its exercises through the check functions it calls (`checker`). What a
check does with the verdict depends on its kernel's session (graders.judging.session); the
verdict itself is always `graders.judging.verdict.decide`'s.
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from graders import integrity
from graders.integrity import Guard
from graders.judging import progress, session
from graders.judging.cases import CASE_FIELDS, Case
from graders.judging.compare import CheckFailed, ok
from graders.judging.failed_cells import did_not_run
from graders.judging.learner import Forbidden, renamed_submodules_loaded, with_course_functions
from graders.judging.stubs import untouched
from graders.judging.verdict import LearnerCode, decide, names_verdict

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

_REGISTRY: dict[tuple[str, str], "Exercise"] = {}


class DuplicateExercise(RuntimeError):
    """Two exercises share a (notebook, name) key."""


def no_inputs(case: Case) -> dict[str, torch.Tensor]:
    return {}


@dataclass(frozen=True)
class Exercise:
    notebook: str
    name: str
    produce: Callable    # (learner, Case, inputs) -> dict[str, Tensor]; runs in the kernel
    judge: Callable      # (Case, outputs) -> None, raises CheckFailed; runs in the judge
    inputs: Callable[[Case], dict[str, torch.Tensor]] = no_inputs
    forbidden: tuple[Forbidden, ...] = ()
    defaults: dict = field(default_factory=dict)
    describe: Callable[[Case], str] | None = None
    # The course's versions of a composite's parts, by the notebook's names for them ({"gelu_new":
    # ...}): its check runs the learner's code with these in place of the learner's own, so that
    # a mistake in a part costs that part's check only.
    course_parts: dict = field(default_factory=dict)
    # What integrity needs to know of the check beyond `forbidden` (graders.integrity.Guard).
    guard: Guard = Guard()
    defined_at: str = field(default="", compare=False)

    def __post_init__(self):
        caller = sys._getframe(2)
        while caller.f_back is not None and caller.f_code.co_name != "<module>":
            caller = caller.f_back   # through factories, to the module line that made it
        object.__setattr__(self, "defined_at", f"{caller.f_code.co_filename}:{caller.f_lineno}")
        earlier = _REGISTRY.get(self.key)
        if earlier is not None and earlier.defined_at != self.defined_at:
            raise DuplicateExercise(f"exercise {self.key} is defined twice: at {earlier.defined_at} "
                                    f"and at {self.defined_at}. Give one of them another name.")
        _REGISTRY[self.key] = self
        if self.course_parts:
            object.__setattr__(self, "produce", with_course_functions(self.produce, self.course_parts))

    @property
    def key(self) -> tuple[str, str]:
        return (self.notebook, self.name)

    def case(self, **fields) -> Case:
        """The case a check function's keyword arguments ask for, with this exercise's defaults."""
        return Case(**{**self.defaults, **fields})

    def run(self, learner, case: Case, inputs: dict, answers: tuple = (),
            given: tuple | None = None) -> tuple[dict | None, CheckFailed | None]:
        """What `produce` made of the learner's code, or how it failed. Both, when the learner's
        submodules are named otherwise than the exercise's and their code ran under their own
        names: `decide` fails the names and says whether the computation is right. An answer
        that runs the course's own code fails, whatever it produced (graders.integrity.watch):
        `answers` are what the learner passed to the check (`learner` may be built from them);
        `given` are the notebook's given parts in a grading kernel, None in a learner's."""
        with renamed_submodules_loaded() as names_failures:
            outputs, failure, refused = integrity.watch(self, answers or learner,
                                                        lambda: self.produce(learner, case, inputs), given)
            if refused:
                return None, failure
            if failure is not None:
                if not names_failures:
                    return None, failure
                also_failed = CheckFailed(names_verdict(self.name, str(names_failures[0]), str(failure)))
                also_failed.__cause__ = failure.__cause__   # the learner's own line, if their code raised
                return None, also_failed
        return outputs, (names_failures[0] if names_failures else None)

    def check(self, learner, case: Case, answers: tuple = ()) -> None:
        """Grade `learner` on one case: in a grading kernel, record what it produced; otherwise
        print the verdict, or raise it with its diagnosis."""
        state = session.kernel()
        # Library warnings and progress bars go to stdout: nbgrader zeroes a test cell that
        # wrote anything to stderr, even when every check in it passed.
        with contextlib.redirect_stderr(sys.stdout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if state.session.recording:
                self._record(state, learner, case, answers)
                return
            place = progress.place_of_check(state, self.notebook)
            given = answers or (learner,)   # a cell that did not run, or a stub: answered before anything is built
            failure = did_not_run(self.name, given) or untouched(self.name, given)
            with progress.busy(f"Checking {self.name}"):
                outputs, failure = self.run(learner, case, self.inputs(case), answers) if failure is None \
                    else (None, failure)
                code = state.history.learner_code(self.notebook) if state.history else LearnerCode()
                verdict = decide(self, case, outputs, str(failure or ""), code, getattr(failure, "mistake", None))
            progress.record(state, self.key, place, answers, verdict.passed,
                            unwritten=getattr(failure, "unwritten", False) and str(failure) == verdict.message)
        if not verdict.passed:   # the learner's own failure keeps its traceback (their line)
            own = failure is not None and str(failure) == verdict.message
            failed = failure if own else CheckFailed(verdict.message)
            failed.mistake = verdict.mistake   # as the class's results count it
            failed.folds_fix = state.session.demonstrations   # a learner's own kernel (Validate and make check: off)
            raise failed
        ok(f"{self.name}: correct on {self.described(case)}{progress.points_note(state, place)}")

    def _record(self, state: session.Kernel, learner, case: Case, answers: tuple = ()) -> None:
        check_id = session.next_check_id(state)
        if check_id is None:   # a learner's own call outside a test cell: nothing to grade
            print(f"{self.name}: not checked here; checks are graded in the test cells.")
            return
        given = answers or (learner,)
        failure = did_not_run(self.name, given) or untouched(self.name, given)
        outputs, failure = self.run(learner, case, session.recorded_inputs(state.session, check_id, self), answers,
                                    state.session.given) if failure is None else (None, failure)
        session.save_record(state.session, check_id, self.key, outputs, str(failure or ""),
                            getattr(failure, "mistake", None))
        print(f"{self.name}: outputs recorded for grading on {self.described(case, recorded=True)}.")

    def described(self, case: Case, recorded: bool = False) -> str:
        """The case as this exercise's messages name it ("the reference text"; batch 1 goes unsaid
        when a check passes)."""
        if self.describe is not None:
            return self.describe(case)
        return case.describe() if recorded else _described(case)

    def checker(self, doc: str, learner: Callable | None = None) -> Callable:
        """The learner-facing check function of this exercise. Keyword arguments that are
        `Case` fields choose the case; others go with the positional ones to `learner`, which
        builds what `produce` runs (default: the first argument itself)."""
        def check(*args, **kwargs):
            case = self.case(**{k: v for k, v in kwargs.items() if k in CASE_FIELDS})
            extra = {k: v for k, v in kwargs.items() if k not in CASE_FIELDS}
            if learner is None and (len(args) != 1 or extra):
                raise TypeError(f"check for {self.name} takes your code and keyword arguments among "
                                f"{sorted(CASE_FIELDS)}; got {len(args)} positional and {sorted(extra)}")
            self.check(learner(*args, **extra) if learner else args[0], case, args)

        check.__doc__, check.exercise = doc, self
        return check


def _described(case: Case) -> str:
    """The case as a passing check names it ("the reference text"; batch 1 goes unsaid)."""
    import re

    return re.sub(r", batch 1(?!\d)", "", case.describe())


def registered(key: tuple[str, str]) -> Exercise:
    """The exercise registered under this (notebook, name) key (graders.exercises.find imports
    the notebook's grader first)."""
    if tuple(key) not in _REGISTRY:
        raise KeyError(f"no exercise {tuple(key)} (imported: {sorted(_REGISTRY)})")
    return _REGISTRY[tuple(key)]


# A learner's kernel watches which cells run, and arms its watches, from the moment a notebook
# imports its grader (a grading kernel's launcher armed them already: graders.judging.session.install).
session.watch_cells(session.kernel())
integrity.arm(session.kernel().session)
