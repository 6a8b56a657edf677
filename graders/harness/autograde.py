"""`nbgrader autograde` through the course's harness, so that it never hands out forgeable points.

nbgrader's own autograder runs the tests inside the learner's kernel and counts a test as
passed when its cell raised nothing: an answer cell that replaces the check
(`nb01.check_layernorm = lambda *a, **k: print('✓ ...')`) scores full marks. nbgrader_config.py
therefore replaces nbgrader's execute-and-score preprocessors with `CourseHarness`, which
grades the (already sanitized) notebook exactly as `make grade` does: sandboxed kernel, checks
that only record, verdicts decided in this process. The gradebook receives the same scores and
comments as from `make grade`, and the notebook written to autograded/ is the same annotated
one (no hidden tests, verdicts as outputs). The same holds for formgrader's Autograde button,
which runs `nbgrader autograde` with this configuration.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor


class CourseHarness(NbGraderPreprocessor):
    """Grade one notebook with graders.harness.grading and save the verdicts to the gradebook."""

    def preprocess(self, nb, resources):
        from graders.layout import notebook_names
        from graders.harness import grading
        from graders.harness.cells import is_test_cell, released_source
        from graders.harness.copies import is_copy_note
        from graders.harness.execute import scratch_dir
        from graders.harness.feedback import annotated
        from graders.harness.gradebook import save_verdicts

        ids = resources["nbgrader"]
        name = ids["notebook"]
        if name not in notebook_names():
            raise ValueError(f"{name}.ipynb is not a notebook of this course: the course's "
                             f"autograder grades only {', '.join(notebook_names())}")
        for cell in nb.cells:  # nbgrader's sanitizing put the test cells back with their hidden
            if is_test_cell(cell):  # tests; as the student saw them, the harness's restore
                cell.source = released_source(cell)  # does not report them as edited
        with tempfile.TemporaryDirectory(prefix="gpt2-autograde-") as folder, scratch_dir() as workdir:
            path = Path(folder, f"{name}.ipynb")
            nbformat.write(nb, path)
            result, executed = grading.grade_notebook(ids["student"], name, path, workdir)
        cells = result.to_json()["cells"]
        for flag in result.flags:
            self.log.warning("%s/%s/%s: %s", ids["student"], ids["assignment"], name, flag)
        with Gradebook(ids["db_url"]) as gradebook:
            save_verdicts(gradebook, ids["assignment"], name, ids["student"], cells, result.flags)
        # nbgrader's feedback is made from this notebook: a copy note stays in the gradebook's
        # comment, which the instructor reviews (and may edit) in formgrader first.
        return annotated(executed, name, cells, [f for f in result.flags if not is_copy_note(f)]), resources
