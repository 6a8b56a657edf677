"""What a learner's kernel knows about their progress, from the checks already run in it.

- Each check records its verdict in the kernel's state (`record`, graders.judging.session.Kernel)
  under its place: the released test cell the
  kernel is running and the check's index in it (graders.judging.testcells). A passing check
  that completes its test cell names the cell's points (`points_note`), and the last cell of a
  notebook says how far the learner is (`progress`) without running anything again.
- `ready(*answers)` guards a demonstration cell that needs the learner's answers: it says in one
  line which exercise to finish first instead of letting the cell raise. Demonstrations earn no
  points, so a grading kernel and `make check` skip them all (07's alone train for minutes);
  `ready()` with no answers guards one that needs none (a timing, whose figures would differ
  on every run).
- `busy(what)` says what a long check is doing while it runs.

This is display only: verdicts are `graders.judging.verdict.decide`'s, and in a grading kernel
(where checks only record) nothing here judges or prints, and only demonstrations are skipped.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import time
from dataclasses import dataclass

from graders.judging import session
from graders.judging.failed_cells import DidNotRun
from graders.judging.testcells import TestCell, released_test_cells

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


@dataclass(frozen=True)
class Place:
    """Where a check runs: check number `index` of a released test cell of `notebook`."""
    notebook: str
    cell: TestCell
    index: int


def place_of_check(state: session.Kernel, notebook: str) -> Place | None:
    """The place of the check about to run, when the kernel is running one of the notebook's
    released test cells (not when a learner calls a check in a cell of their own)."""
    with contextlib.suppress(Exception):   # bookkeeping for display: never in a check's way
        cell = session.running_test_cell(state, notebook)
        if cell is None:
            return None
        execution = state.history.shell.execution_count
        if state.execution != execution:
            state.execution, state.checks_in_execution = execution, 0
        index = state.checks_in_execution
        state.checks_in_execution += 1
        return Place(notebook, cell, index) if index < len(cell.calls) else None
    return None


def _points(p: float) -> str:
    return f"{p:g} point{'s' if p != 1 else ''}"


def points_note(state: session.Kernel, place: Place | None) -> str:
    """' (5/5 points)' when this check completes its test cell and all of the cell's checks
    passed, else ''."""
    if place is None or place.index != len(place.cell.calls) - 1:
        return ""
    verdicts = state.verdicts.get((place.notebook, place.cell.grade_id), {})
    if all(verdicts.get(i) is True for i in range(len(place.cell.calls))):
        return f" ({place.cell.points:g}/{_points(place.cell.points)})"
    return ""


UNWRITTEN = "unwritten"   # a check's verdict on nbgrader's stub: failed, and not started


def record(state: session.Kernel, key: tuple[str, str], place: Place | None, answers, passed: bool,
           unwritten: bool = False) -> None:
    """Remember a check's verdict in this kernel (`unwritten`: it failed on a stub). A pass
    counts for the answers it ran on only in a test cell; a failure counts wherever it happens."""
    with contextlib.suppress(Exception):
        if place is not None:
            cell = state.verdicts.setdefault((place.notebook, place.cell.grade_id), {})
            if place.index == 0:
                cell.clear()
            cell[place.index] = UNWRITTEN if unwritten and not passed else passed
        for a in answers:
            if inspect.isfunction(a) or inspect.isclass(a):
                verdicts = state.answers.setdefault(id(a), (a, {}))[1]
                if not passed:
                    verdicts[key] = False
                elif place is not None:
                    verdicts[key] = True


def _names(cell: TestCell) -> str:
    """The exercises a test cell checks, by name (from the check functions the notebook loaded)."""
    names = []
    for call in cell.calls:
        function = getattr(sys.modules.get(f"graders.exercises.{call.module}"), call.function, None)
        exercise = getattr(function, "exercise", None)
        names.append(exercise.name if exercise is not None else call.function)
    return " + ".join(dict.fromkeys(names)) or cell.grade_id


def _unwritten(answer) -> bool:
    """True when the answer cannot run yet: a function, or a method of the class, that is still
    nbgrader's stub (graders.judging.stubs.is_stub)."""
    from graders.judging.stubs import is_stub

    if inspect.isclass(answer):
        functions = [v for v in vars(answer).values() if inspect.isfunction(v)]
    else:
        functions = [answer] if inspect.isfunction(answer) else []
    return any(is_stub(function) for function in functions)


def ready(*answers) -> bool:
    """Whether a demonstration cell can use these answers of the learner's; when it cannot,
    one line says which exercise to finish first. An answer is not ready when a check run on it
    in this kernel failed, when it is still nbgrader's stub, or when the cell that defines it
    raised (graders.judging.failed_cells). In a grading kernel, never: no
    test cell depends on a demonstration (tests/learner/test_notebooks.py checks), and they earn nothing."""
    state = session.kernel()
    if state.session.recording or not state.session.demonstrations:
        print("\N{WHITE CIRCLE} Not run while grading: demonstrations earn no points.")
        return False
    missing = []
    for answer in answers:
        name = getattr(answer, "__name__", repr(answer))
        checked, verdicts = state.answers.get(id(answer), (None, {}))
        if isinstance(answer, DidNotRun):
            missing.append(f"{name} (the cell that defines it did not run: {answer.failure.said()})")
        elif _unwritten(answer):
            missing.append(f"{name} (not written yet)")
        elif checked is answer and not all(verdicts.values()):
            missing.append(f"{name} (its check does not pass yet)")
    if missing:
        needs = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
        print(f"\N{WHITE CIRCLE} Skipped: this cell needs your {needs}. "
              f"Finish {'it' if len(missing) == 1 else 'them'} above, then run this cell again.")
        return False
    return True


def progress(notebook: str) -> None:
    """One line: the points of the test cells whose checks passed in this kernel, and the
    exercises still to do. Nothing is run again."""
    state = session.kernel()
    if state.session.recording:
        return
    try:
        cells = released_test_cells(notebook)
    except Exception as err:  # an unreadable course notebook: say so rather than raise
        print(f"Progress in {notebook}: unknown ({type(err).__name__} reading the course's notebook).")
        return
    if not cells:
        print(f"{notebook}: nothing to grade in this notebook.")
        return
    total = sum(c.points for c in cells)
    earned, todo = 0.0, []
    for cell in cells:
        verdicts = state.verdicts.get((notebook, cell.grade_id), {})
        if all(verdicts.get(i) is True for i in range(len(cell.calls))):
            earned += cell.points
            continue
        standing = ("its check fails" if False in verdicts.values() else
                    "not written yet" if UNWRITTEN in verdicts.values() else "not checked yet")
        todo.append(f"{_names(cell)} ({_points(cell.points)}, {standing})")
    if not todo:
        print(f"\N{CHECK MARK} Progress in {notebook}: {earned:g} of {_points(total)}: every check passes.")
    else:
        print(f"Progress in {notebook}: {earned:g} of {_points(total)}. Still to do: {', '.join(todo)}.")


@contextlib.contextmanager
def busy(what: str, after: float = 2.0, every: float = 1.0):
    """While the block runs longer than `after` seconds, one line says what it does, what is being
    built for the course cache meanwhile (graders.reference.paths.building) and for how long; it is
    removed when the block ends. A grading kernel shows none: nobody watches it."""
    if session.kernel().session.recording:
        yield
        return
    from graders.reference.paths import being_built

    done, line = threading.Event(), _Line(sys.stdout)
    start = time.monotonic()

    def tick():
        if done.wait(after):
            return
        while not done.is_set():
            built = being_built()
            with contextlib.suppress(Exception):
                line.show(f"{what} \N{HORIZONTAL ELLIPSIS} {time.monotonic() - start:.0f} s"
                          + (f" ({built})" if built else ""))
            done.wait(every)

    thread = threading.Thread(target=tick, daemon=True, name="graders-busy")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        with contextlib.suppress(Exception):
            line.remove()


class _Line:
    """A line shown, rewritten in place and removed. In a Jupyter kernel it is a display of its own,
    emptied at the end (a stream's line erased by spaces stays on screen as a blank line above
    what follows, and a line printed meanwhile does not break it); elsewhere a carriage return."""

    def __init__(self, out):
        self.out, self.handle, self.width = out, None, 0
        self.jupyter = type(out).__module__.startswith("ipykernel")

    def show(self, text: str) -> None:
        if self.jupyter:
            from IPython.display import display

            if self.handle is None:
                self.handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": text}, raw=True)
        else:
            self.out.write("\r" + text.ljust(self.width))
            self.out.flush()
            self.width = max(self.width, len(text))

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.update({}, raw=True)   # a display with nothing to show takes no room
        elif self.width:
            self.out.write("\r" + " " * self.width + "\r")
            self.out.flush()
