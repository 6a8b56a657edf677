"""A learner's check before submitting: `make check NB=exercises/03_attention.ipynb`.

Runs the notebook top to bottom in a fresh kernel, as the autograder will, and prints one line
per test cell with the diagnostic of every failure. It runs the visible checks only.
"""
import sys
from pathlib import Path

import nbformat

from graders import grading


def check(path: Path, limits: grading.TimeLimits = grading.TimeLimits()) -> int:
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = {"name": grading.KERNEL_NAME, "display_name": "sandbox",
                                       "language": "python"}
    with grading.scratch_dir() as workdir:
        problems = grading.run(notebook, None, workdir, limits)
    failures, total = 0, 0
    for index, cell in enumerate(notebook.cells):
        if not grading.is_test_cell(cell):
            continue
        total += 1
        meta = grading._nbgrader(cell)
        error = problems.get(index) or grading._cell_error(cell)
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
        raise SystemExit("usage: python -m graders.check NOTEBOOK.ipynb")
    raise SystemExit(check(Path(sys.argv[1])))
