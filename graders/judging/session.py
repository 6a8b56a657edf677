"""What a kernel's checks do, decided once by whoever starts the kernel.

- `Session()` (the default, a learner's own kernel): a check runs the learner's code, then
  `graders.judging.verdict.decide` judges it right there and the cell shows the verdict.
- `Session(records=..., inputs=...)`: a grading kernel. A check runs the learner's code on the
  inputs the grader prepared and records what it produced; the grader judges the records with
  the same `decide`, in a process that never runs learner code.
- `demonstrations=False`: demonstration cells skip themselves (grading, `make check`).

The harness creates the session and hands it to the kernel it starts, before any learner code
runs (graders.integrity.sandbox_kernel); before each test cell it names the cell
(`enter_cell`), so that a check's record carries its id in the course's manifest
(graders.judging.testcells): `grade_id/index`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from graders import integrity
from graders.judging.failed_cells import names_before, stand_in
from graders.judging.testcells import (TestCell, released_course_sources, released_test_cells, split_hidden,
                                      test_sources)
from graders.judging.verdict import LearnerCode

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


class GraderError(RuntimeError):
    """The grading run itself is broken (not the learner's code): the message says what to fix."""


@dataclass(frozen=True)
class Session:
    records: Path | None = None      # a grading kernel saves each check's outputs here ...
    inputs: Path | None = None       # ... and finds each check's inputs here
    demonstrations: bool = True
    given: tuple = ()                # a grading kernel's notebook's given parts (provenance)
    deliveries: Path | None = None   # ... and receives the course code a test cell's checks run here
    # ... and has these torch kernels (pattern, refusal) taken out of its dispatcher, for good
    # (graders.integrity.kernel_bans), before any learner code runs
    refused_kernels: tuple = ()

    @property
    def recording(self) -> bool:
        return self.records is not None

    def to_json(self) -> str:
        return json.dumps({k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()})

    @classmethod
    def from_json(cls, text: str) -> "Session":
        fields = json.loads(text)
        fields["given"] = tuple(fields.get("given", ()))
        fields["refused_kernels"] = tuple(tuple(ban) for ban in fields.get("refused_kernels", ()))
        return cls(**{k: (Path(v) if k in ("records", "inputs", "deliveries") and v else v) for k, v in fields.items()})


@dataclass
class Kernel:
    """What one kernel's checks remember between cells, in one object: the session its launcher
    installed, a grading kernel's running test cell and how many of its checks have run, a
    learner's kernel's cell history, and the verdicts graders.judging.progress shows. The
    process's own is `kernel()`; the functions below the checks are handed it."""
    session: Session = field(default_factory=Session)
    test_cell: str | None = None     # the test cell a grading kernel is running (enter_cell)
    checks_in_cell: int = 0
    history: CellHistory | None = None
    # graders.judging.progress: the verdicts of each test cell's checks in its last run,
    # {(notebook, grade_id): {index: passed}}; the learner's objects checks ran on, id -> (the
    # object, {exercise key: passed}); and the execution whose checks are being counted
    verdicts: dict = field(default_factory=dict)
    answers: dict = field(default_factory=dict)
    execution: int | None = None
    checks_in_execution: int = 0


_KERNEL = Kernel()   # this process's: a kernel is one process


def kernel() -> Kernel:
    """This kernel's state: what checks, `ready` and `progress` (the learner's entry points) start from."""
    return _KERNEL


def install(session: Session) -> None:
    """Called by the kernel's launcher, before any learner code runs."""
    _KERNEL.session = session
    integrity.arm(session)


def enter_cell(grade_id: str) -> None:
    """The harness's line before each test cell of a grading kernel: it takes the course code the
    cell's checks run, when the grader has handed it over (graders.integrity.deliveries)."""
    _KERNEL.test_cell, _KERNEL.checks_in_cell = grade_id, 0
    if _KERNEL.session.deliveries is not None:
        integrity.receive(_KERNEL.session.deliveries / f"{grade_id}.delivery")


def next_check_id(state: Kernel) -> str | None:
    """The id of the check about to run in a grading kernel's test cell (None outside one)."""
    if state.test_cell is None:
        return None
    state.checks_in_cell += 1
    return f"{state.test_cell}/{state.checks_in_cell - 1}"


def inputs_name(check_id: str) -> str:
    """The file in which the grader leaves one check's inputs."""
    return check_id.replace("/", ".") + ".safetensors"


def recorded_inputs(session: Session, check_id: str, exercise) -> dict:
    from safetensors.torch import load_file

    path = session.inputs / inputs_name(check_id)
    try:
        return load_file(path)
    except Exception as err:
        raise GraderError(f"grader error: the inputs of {exercise.name} for {check_id} cannot be read "
                          f"({path}: {type(err).__name__}). This is the grading run's fault, not your "
                          "code's: tell your instructor.") from None


def save_record(session: Session, check_id: str, key, outputs: dict | None, message: str,
                mistake: str | None = None) -> None:
    """What one check produced, or its failure's message and the key of the mistake it names."""
    from graders.judging.records import write_record

    write_record(session.records, {"check": check_id, "exercise": list(key), "message": message,
                                   "mistake": mistake}, outputs)


def code_only(source: str) -> str:
    """`source` without comments and strings: words there are not code the learner runs."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type not in (tokenize.COMMENT, tokenize.STRING)]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source


class CellHistory:
    """The cells a learner's kernel has run, latest version of each last (JupyterLab names each
    cell; a run without names, such as `make check`'s, lists every execution once). A cell that
    raised leaves stand-ins for the names it did not define (graders.judging.failed_cells)."""

    def __init__(self, shell):
        self.shell = shell
        self.cells: dict[str, str] = {f"#{n}": source for n, source
                                      in enumerate(shell.history_manager.input_hist_raw) if n and source}
        self._defined_before: dict[str, object] = {}
        shell.events.register("pre_run_cell", self._ran)
        shell.events.register("post_run_cell", self._finished)

    def _ran(self, info) -> None:
        key = info.cell_id or f"#{self.shell.execution_count - 1}"
        self.cells.pop(key, None)
        self.cells[key] = info.raw_cell
        self._defined_before = {}
        with contextlib.suppress(Exception):   # bookkeeping: never in the way of the learner's cell
            self._defined_before = names_before(info.raw_cell, self.shell.user_ns)

    def _finished(self, result) -> None:
        error = None if result is None else result.error_before_exec or result.error_in_exec
        if error is not None and self._defined_before:
            stand_in(self.shell.user_ns, self._defined_before, error)
        self._defined_before = {}

    def running(self) -> str:
        return next(reversed(self.cells.values()), "")

    def learner_code(self, notebook: str) -> LearnerCode:
        """The learner's cells that ran before the running one (the course's given cells and
        tests left out), and those since the last test cell: what the grader reads in the
        notebook above the test cell when the notebook runs top to bottom."""
        tests = test_sources(notebook)
        course = released_course_sources(notebook) | tests
        earlier = list(self.cells.values())[:-1]
        last_test = max((i for i, s in enumerate(earlier) if s in tests), default=-1)
        theirs = [(i, code_only(s)) for i, s in enumerate(earlier) if s not in course]
        return LearnerCode("\n".join(s for _, s in theirs), "\n".join(s for i, s in theirs if i > last_test))


def watch_cells(state: Kernel) -> CellHistory | None:
    """The learner's kernel's cell history (None outside IPython), watched from the first call."""
    if state.history is None:
        try:
            shell = get_ipython()  # noqa: F821  (IPython's builtin, absent outside a kernel)
        except NameError:
            return None
        state.history = CellHistory(shell)
    return state.history


def running_test_cell(state: Kernel, notebook: str) -> TestCell | None:
    """The released test cell the learner's kernel is running, if it is one: as learners have it,
    or as the solution has it, hidden tests and all (the reference run of `make solutions`)."""
    cells = state.history
    if cells is None:
        return None
    running = cells.running()
    visible = split_hidden(running)[0].strip()
    return next((c for c in released_test_cells(notebook)
                 if c.source == running or (running in test_sources(notebook) and c.source.strip() == visible)),
                None)
