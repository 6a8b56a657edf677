"""What a learner's kernel knows about their progress, from the checks already run in it.

- Each check records its verdict here (`record`), so that a passing check can name its test
  cell's points (`points_note`), and the last cell of a notebook can say how far the learner is
  (`progress`) without running anything again.
- `ready(*answers)` guards a demonstration cell that needs the learner's answers: it says in one
  line which exercise to finish first instead of letting the cell raise. Demonstrations earn no
  points, so a grading kernel skips them all (07's alone train for minutes); `ready()` with no
  answers guards one that needs none (a timing, whose figures would differ on every run).
- `busy(what)` says what a long check is doing while it runs.

A test cell's points are nbgrader metadata, which the kernel does not receive: they are read
from the course's released notebook (`exercises/`, else `solutions/` without its hidden tests),
where the check's exercise and case name the test cell. This is display only: grades are
decided by the harness, and in a grading kernel (where checks only record) nothing here
judges or prints, and only demonstrations are skipped.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
# Set by `make check` (graders.harness.check), which runs a notebook as the autograder will:
# its checks judge in the kernel, and its demonstrations are skipped as in grading.
DEMONSTRATIONS_OFF_ENV = "GPT2_COURSE_NO_DEMONSTRATIONS"

# The last verdict of each exercise's visible check in this kernel, by (notebook, name).
_verdicts: dict[tuple[str, str], bool] = {}
# The learner's objects that checks were run on: id -> (the object, {exercise key: passed}).
_answers: dict[int, tuple[object, dict[tuple[str, str], bool]]] = {}


def grading() -> bool:
    """True in a grading kernel: checks record outputs there and are judged elsewhere."""
    from graders.harness.records import Recorder
    from graders.judging.cases import WITHHELD_ENV

    return Recorder.active() or bool(os.environ.get(WITHHELD_ENV))


@dataclass(frozen=True)
class TestCell:
    grade_id: str
    points: float
    checks: tuple   # ((exercise key, Case), ...) of its visible check calls, in order

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(key[1] for key, _ in self.checks))


@lru_cache(maxsize=None)
def test_cells(notebook: str) -> tuple[TestCell, ...]:
    """The test cells of a course notebook as learners have them (read as JSON: nbformat's
    import alone costs a second and a half)."""
    for path, hidden_removed in ((ROOT / "exercises" / f"{notebook}.ipynb", True),
                                 (ROOT / "solutions" / f"{notebook}.ipynb", False)):
        if path.is_file():
            break
    else:
        return ()
    cells = []
    for cell in json.loads(path.read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if not hidden_removed:
            source = split_hidden(source)[0]
        cells.append(TestCell(meta.get("grade_id", "?"), float(meta.get("points", 0)),
                              tuple(_checks(source))))
    return tuple(cells)


def split_hidden(source: str) -> tuple[str, str]:
    """(what learners see, what nbgrader hides) of a test cell's source: the lines outside and
    inside its `### BEGIN/END HIDDEN TESTS` markers, markers dropped."""
    parts, hidden = ([], []), False
    for line in source.splitlines():
        if line.strip() in (HIDDEN_BEGIN, HIDDEN_END):
            hidden = line.strip() == HIDDEN_BEGIN
        else:
            parts[hidden].append(line)
    return "\n".join(parts[0]), "\n".join(parts[1])


def _checks(source: str):
    """(exercise key, Case) of each `nbNN.check_x(Learner, field=literal, ...)` in `source`
    (graders.harness.manifest reads the same calls strictly; this only needs to match them)."""
    import importlib

    from graders.judging.exercise import CASE_FIELDS

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for statement in tree.body:
        call = getattr(statement, "value", None)
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id.startswith("nb")):
            continue
        try:
            module = importlib.import_module(f"graders.exercises.{call.func.value.id}")
            exercise = getattr(module, call.func.attr).exercise
            fields = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in CASE_FIELDS}
            yield exercise.key, exercise.case(**fields)
        except Exception:  # not a check call: nothing to match
            continue


def _cell_of(key, case) -> tuple[TestCell | None, bool]:
    """The test cell whose visible checks include this one, and whether it is its last check."""
    for cell in test_cells(key[0]):
        for i, (k, c) in enumerate(cell.checks):
            if k == key and c == case:
                return cell, i == len(cell.checks) - 1
    return None, False


def _points(p: float) -> str:
    return f"{p:g} point{'s' if p != 1 else ''}"


def points_note(key, case) -> str:
    """' (5/5 points)' when this check completes its test cell, else ''."""
    with contextlib.suppress(Exception):
        cell, last = _cell_of(tuple(key), case)
        if cell is not None and last:
            return f" ({cell.points:g}/{_points(cell.points)})"
    return ""


def record(exercise, case, answers, passed: bool) -> None:
    """Remember a check's verdict in this kernel. A pass counts for the test cell when it is
    the visible check (hidden variants, run on solutions, only ever count as failures)."""
    with contextlib.suppress(Exception):   # bookkeeping for display: never in a check's way
        if grading():
            return
        key = exercise.key
        try:
            visible = _cell_of(key, case)[0] is not None or not test_cells(key[0])
        except Exception:
            visible = True
        for target in [_verdicts] + [_answers.setdefault(id(a), (a, {}))[1] for a in answers
                                     if inspect.isfunction(a) or inspect.isclass(a)]:
            if not passed:
                target[key] = False
            elif visible:
                target[key] = True


def _unwritten(answer) -> bool:
    """True for nbgrader's untouched stub: a function (or a method of the class) whose body is
    only `raise NotImplementedError()`."""
    if inspect.isclass(answer):
        functions = [v for v in vars(answer).values() if inspect.isfunction(v)]
    else:
        functions = [answer] if callable(answer) else []
    for function in functions:
        with contextlib.suppress(Exception):
            tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(function))))
            body = [s for s in tree.body[0].body
                    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                    and not isinstance(s, ast.Pass)]
            if len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None:
                raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
                if isinstance(raised, ast.Name) and raised.id == "NotImplementedError":
                    return True
    return False


def ready(*answers) -> bool:
    """Whether a demonstration cell can use these answers of the learner's; when it cannot,
    one line says which exercise to finish first. An answer is not ready when a check run on it
    in this kernel failed, or when it is still nbgrader's stub. In a grading kernel, never: no
    test cell depends on a demonstration (tests/test_notebooks.py checks), and they earn nothing."""
    if grading() or os.environ.get(DEMONSTRATIONS_OFF_ENV):
        print("\N{WHITE CIRCLE} Not run while grading: demonstrations earn no points.")
        return False
    missing = []
    for answer in answers:
        name = getattr(answer, "__name__", repr(answer))
        checked, verdicts = _answers.get(id(answer), (None, {}))
        if _unwritten(answer):
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
    if grading():
        return
    try:
        cells = test_cells(notebook)
    except Exception as err:  # an unreadable course notebook: say so rather than raise
        print(f"Progress in {notebook}: unknown ({type(err).__name__} reading the course's notebook).")
        return
    if not cells:
        print(f"{notebook}: nothing to grade in this notebook.")
        return
    total = sum(c.points for c in cells)
    earned, todo = 0.0, []
    for cell in cells:
        verdicts = [_verdicts.get(key) for key, _ in cell.checks]
        if verdicts and all(v is True for v in verdicts):
            earned += cell.points
            continue
        state = "its check fails" if False in verdicts else "not checked yet"
        todo.append(f"{' + '.join(cell.names) or cell.grade_id} ({_points(cell.points)}, {state})")
    if not todo:
        print(f"\N{CHECK MARK} Progress in {notebook}: {earned:g} of {_points(total)}: every check passes.")
    else:
        print(f"Progress in {notebook}: {earned:g} of {_points(total)}. Still to do: {', '.join(todo)}.")


@contextlib.contextmanager
def busy(what: str, after: float = 2.0, every: float = 1.0):
    """While the block runs longer than `after` seconds, one line on stdout (updated in place)
    says what it does and for how long; it is erased when the block ends."""
    if grading():
        yield
        return
    done, shown = threading.Event(), []
    out = sys.stdout
    start = time.monotonic()

    def tick():
        if done.wait(after):
            return
        while not done.is_set():
            line = f"{what} \N{HORIZONTAL ELLIPSIS} {time.monotonic() - start:.0f} s"
            with contextlib.suppress(Exception):
                out.write("\r" + line)
                out.flush()
                shown.append(len(line))
            done.wait(every)

    thread = threading.Thread(target=tick, daemon=True, name="graders-busy")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if shown:
            out.write("\r" + " " * (max(shown) + 2) + "\r")
            out.flush()
