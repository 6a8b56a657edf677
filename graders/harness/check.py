"""A learner's check before submitting: `make check NB=exercises/03_attention.ipynb`.

Runs the notebook top to bottom in a fresh kernel, as the autograder will, and prints one line
per test cell with the diagnostic of every failure. It runs the visible checks only.
"""
import sys
from pathlib import Path

import nbformat

from graders.harness.cells import KERNEL_NAME, cell_error, is_test_cell, nbgrader_meta
from graders.harness.execute import TimeLimits, run, scratch_dir


def check(path: Path, limits: TimeLimits = TimeLimits()) -> int:
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "sandbox",
                                       "language": "python"}
    with scratch_dir() as workdir:
        problems = run(notebook, None, workdir, limits)
    failures, total = 0, 0
    for index, cell in enumerate(notebook.cells):
        if not is_test_cell(cell):
            continue
        total += 1
        meta = nbgrader_meta(cell)
        error = problems.get(index) or cell_error(cell)
        points = meta.get("points", 0)
        if error:
            failures += 1
            print(f"FAIL {meta['grade_id']} ({points} points)\n    " + error.replace("\n", "\n    "))
        else:
            print(f"pass {meta['grade_id']} ({points} points)")
    print(f"{total - failures} of {total} test cells pass.")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m graders.harness.check NOTEBOOK.ipynb")
    raise SystemExit(check(Path(sys.argv[1])))
