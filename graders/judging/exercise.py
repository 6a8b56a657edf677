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
A test cell is linked to its exercises through the check functions it calls (`checker`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from graders.judging import progress
from graders.judging.cases import WITHHELD_ENV, Case
from graders.judging.compare import CheckFailed, ok
from graders.judging.learner import Forbidden

CASE_FIELDS = frozenset(f.name for f in dataclasses.fields(Case))
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

    @property
    def key(self) -> tuple[str, str]:
        return (self.notebook, self.name)

    def case(self, **fields) -> Case:
        """The case a check function's keyword arguments ask for, with this exercise's defaults."""
        return Case(**{**self.defaults, **fields})

    def kernel_inputs(self, case: Case) -> dict[str, torch.Tensor]:
        """What the learner's code is run on: prepared by the grader in a grading kernel."""
        folder = os.environ.get(WITHHELD_ENV)
        if not folder:
            return self.inputs(case)
        from safetensors.torch import load_file

        path = Path(folder) / inputs_file(self.key, case)
        return load_file(path) if path.is_file() else {}

    def check(self, learner, case: Case) -> None:
        """Grade `learner` on one case; print a line when it passes, raise with a diagnosis if not."""
        from graders.harness.records import Recorder

        # Library warnings and progress bars go to stdout: nbgrader zeroes a test cell that
        # wrote anything to stderr, even when every check in it passed.
        with contextlib.redirect_stderr(sys.stdout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not Recorder.active():
                with progress.busy(f"Checking {self.name}"):
                    self.judge(case, self.produce(learner, case, self.kernel_inputs(case)))
                ok(f"{self.name}: correct on {_described(case)}{progress.points_note(self.key, case)}")
                return
            try:
                Recorder.save(self.key, case, self.produce(learner, case, self.kernel_inputs(case)))
            except CheckFailed as failure:
                Recorder.save(self.key, case, None, str(failure))
            print(f"{self.name}: outputs recorded for grading on {case.describe()}.")

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
            passed = False
            try:
                self.check(learner(*args, **extra) if learner else args[0], case)
                passed = True
            finally:  # what the notebook's progress line and demonstration cells go by
                progress.record(self, case, args, passed)

        check.__doc__, check.exercise = doc, self
        return check


def _described(case: Case) -> str:
    """The case as a passing check names it ("the reference text"; batch 1 goes unsaid)."""
    import re

    return re.sub(r", batch 1(?!\d)", "", case.describe())


def find(key: tuple[str, str]) -> Exercise:
    """The exercise with this (notebook, name) key. Notebook `NN_...` is graded by the module
    graders.exercises.nbNN, imported here if it was not yet."""
    if tuple(key) not in _REGISTRY:
        import importlib

        importlib.import_module(f"graders.exercises.nb{key[0][:2]}")
    if tuple(key) not in _REGISTRY:
        raise KeyError(f"no exercise {tuple(key)} (imported: {sorted(_REGISTRY)})")
    return _REGISTRY[tuple(key)]


def inputs_file(key: tuple[str, str], case: Case) -> str:
    """The file name under which a grading kernel finds one check's inputs."""
    text = json.dumps([list(key), dataclasses.asdict(case)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32] + ".safetensors"
