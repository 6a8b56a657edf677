"""A learner's check before submitting: `make check NB=exercises/03_attention.ipynb`.

Runs the notebook top to bottom in a fresh kernel, as the autograder will, and prints one line
per test cell with the diagnosis of every failure, as the notebook shows it (never the graders'
traceback). It runs the visible checks only, and skips the demonstrations, as grading does.
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

from graders.harness.cells import KERNEL_NAME, cell_error, is_test_cell, nbgrader_meta  # noqa: E402
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


def check(path: Path, limits: TimeLimits = TimeLimits()) -> int:
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "sandbox",
                                       "language": "python"}
    tests = [c for c in notebook.cells if is_test_cell(c)]
    print(f"Running {path} top to bottom in a fresh kernel, as the autograder will "
          f"({len(tests)} test cell{'s' if len(tests) != 1 else ''}, "
          f"{sum(nbgrader_meta(c).get('points', 0) for c in tests):g} points) ...", flush=True)
    with scratch_dir() as workdir:
        problems = run(notebook, None, workdir, limits, demonstrations=False)
    failures, total, earned, possible = 0, 0, 0.0, 0.0
    for index, cell in enumerate(notebook.cells):
        if not is_test_cell(cell):
            continue
        total += 1
        meta = nbgrader_meta(cell)
        error = problems.get(index) or diagnosis(cell)
        points = meta.get("points", 0)
        possible += points
        if error:
            failures += 1
            print(f"FAIL {meta['grade_id']} ({points} points)\n    " + error.replace("\n", "\n    "))
        else:
            earned += points
            print(f"pass {meta['grade_id']} ({points} points)")
    print(f"{total - failures} of {total} test cells pass: {earned:g} of {possible:g} points.")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m graders.harness.check NOTEBOOK.ipynb")
    raise SystemExit(check(Path(sys.argv[1])))
