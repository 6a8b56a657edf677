"""A learner's check before submitting: `make check NB=exercises/03_attention.ipynb`.

Runs the notebook top to bottom in a fresh kernel, as the autograder will (its locked cells put
back first, as grading does), and prints one line per test cell with the diagnosis of every
failure as the notebook shows it: the verdicts of `graders.judging.verdict.decide`, which also
grades. It runs the visible checks only (the autograder adds hidden variants), and skips the
demonstrations, as grading does.
"""
import sys
from pathlib import Path


def _quick_nbformat() -> None:
    """nbformat imports jsonschema, whose format checkers import rfc3987_syntax, which compiles
    a grammar at import: 1.6 s of CPU to validate IRI strings, which no notebook contains. Without
    it jsonschema leaves that format unchecked; everything else is validated as before."""
    sys.modules.setdefault("rfc3987_syntax", None)


_quick_nbformat()

import nbformat  # noqa: E402

from graders.harness.cells import (cell_error, is_test_cell, nbgrader_meta, points_of,  # noqa: E402
                                   released_notebook, restore)
from graders.harness.execute import run, scratch_dir  # noqa: E402
from graders.harness.limits import TimeLimits  # noqa: E402


def diagnosis(cell) -> str:
    """A failed test cell's message as the notebook shows it: a check's rendered diagnosis
    (graders.judging.rendering), else `Name: message`."""
    from graders.judging.rendering import strip_ansi

    for output in cell.get("outputs", []):
        if output.get("output_type") == "error" and output.get("ename") == "CheckFailed" \
                and output.get("traceback"):
            return strip_ansi("\n".join(output["traceback"])).strip()[:4000]
    return cell_error(cell)


def notebook_of(path: Path) -> str | None:
    """The course notebook a file is (by its name, as grading finds it)."""
    from graders.layout import notebook_names

    return next((name for name in notebook_names() if path.stem.startswith(name)), None)


def check_cells(path: Path, limits: TimeLimits = TimeLimits(),
                on_test_cell=None) -> list[tuple[str, float, float, str]]:
    """(grade_id, points earned, points, diagnosis) of each test cell, as the learner's kernel
    judges it: the notebook with the released notebook's locked cells put back (a deleted or
    edited test cell runs as grading runs it), top to bottom in a fresh kernel, demonstrations
    skipped. `on_test_cell` is called with each test cell's grade_id as it starts."""
    notebook = nbformat.read(path, as_version=4)
    name = notebook_of(path)
    if name is not None:
        notebook, _ = restore(notebook, released_notebook(name))
    with scratch_dir() as workdir:
        problems = run(notebook, None, workdir, limits, demonstrations=False,
                       around_test_cells=(on_test_cell, None) if on_test_cell else None)
    verdicts = []
    for index, cell in enumerate(notebook.cells):
        if is_test_cell(cell):
            error = problems.get(index) or diagnosis(cell)
            points = points_of(cell)
            verdicts.append((nbgrader_meta(cell)["grade_id"], 0.0 if error else points, points, error))
    return verdicts


def check(path: Path, limits: TimeLimits = TimeLimits()) -> int:
    notebook = nbformat.read(path, as_version=4)
    tests = [c for c in notebook.cells if is_test_cell(c)]
    print(f"Running {path} top to bottom in a fresh kernel, as the autograder will "
          f"({len(tests)} test cell{'s' if len(tests) != 1 else ''}, "
          f"{sum(points_of(c) for c in tests):g} points) ...", flush=True)
    line = _ProgressLine([nbgrader_meta(c)["grade_id"] for c in tests])
    try:
        verdicts = check_cells(path, limits, line.show)
    finally:
        line.clear()
    for grade_id, earned, points, error in verdicts:
        if error:
            print(f"FAIL {grade_id} ({points:g} points)\n    " + error.replace("\n", "\n    "))
        else:
            print(f"pass {grade_id} ({points:g} points)")
    passed = sum(1 for v in verdicts if not v[3])
    print(f"{passed} of {len(verdicts)} test cells pass: {sum(v[1] for v in verdicts):g} of "
          f"{sum(v[2] for v in verdicts):g} points.")
    return 0 if passed == len(verdicts) else 1


class _ProgressLine:
    """One line, rewritten in place, naming the test cell the kernel is on (a whole notebook takes
    up to a minute, and said nothing meanwhile); the verdicts are printed over it."""

    def __init__(self, grade_ids: list[str]):
        self.grade_ids, self.width = grade_ids, 0

    def show(self, grade_id: str) -> None:
        number = self.grade_ids.index(grade_id) + 1 if grade_id in self.grade_ids else "?"
        text = f"  on test cell {number} of {len(self.grade_ids)}: {grade_id} ..."
        sys.stdout.write("\r" + text.ljust(self.width))
        sys.stdout.flush()
        self.width = max(self.width, len(text))

    def clear(self) -> None:
        if self.width:
            sys.stdout.write("\r" + " " * self.width + "\r")
            sys.stdout.flush()


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m graders.harness.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path, metavar="NOTEBOOK.ipynb",
                        help="the notebook to check, e.g. exercises/03_attention.ipynb")
    args = parser.parse_args(argv)
    try:
        nbformat.read(args.notebook, as_version=4)
    except Exception as err:   # a wrong path or not a notebook: the learner's to fix, in one line
        why = str(err).splitlines()[0] if str(err) else ""
        parser.error(f"{args.notebook} cannot be read as a notebook ({type(err).__name__}: {why})")
    return check(args.notebook)


if __name__ == "__main__":
    raise SystemExit(main())
