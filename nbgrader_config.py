# nbgrader settings for this course, read by `nbgrader` run from the repository root, by
# formgrader and the Validate button (`make formgrader`, `make lab`), by `make release` and
# `make grade`. Every value here is chosen on purpose.
import os

c = get_config()  # noqa: F821 (provided by nbgrader)

# The course folder nbgrader works in (source/, release/, submitted/, autograded/, feedback/,
# gradebook.db): made by `make release`, not committed. GPT2_COURSE_NBGRADER_ROOT points every
# nbgrader command (and formgrader) at another one, e.g. the example class's build/example_course.
c.CourseDirectory.root = os.environ.get("GPT2_COURSE_NBGRADER_ROOT", "build/course")
# The exchange (`nbgrader release_assignment`, `submit`, `collect`, ...) files the course under this id.
c.CourseDirectory.course_id = "gpt2-from-scratch"

# `nbgrader autograde` (and formgrader's Autograde button) grade through the course's harness,
# exactly as `make grade` does: nbgrader's own Execute + SaveAutoGrades would run the tests in
# the learner's kernel and count a cell as passed when it raised nothing, so an answer cell that
# replaces the check function would score full marks. nbgrader's sanitizing steps (restoring
# locked cells from the gradebook) still run first, and its late penalties after.
c.Autograde.autograde_preprocessors = [
    "graders.harness.autograde.CourseHarness",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]

# `nbgrader generate_feedback`: the notebooks the course's autograder leaves have no hidden
# tests; ClearHiddenTests also strips them from any notebook autograded another way.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "nbgrader.preprocessors.ClearHiddenTests",
]

# Notebooks run in the kernel `make setup` installs into .venv (named python3 there). The grading
# harness (graders/harness/grading.py) ignores a notebook's kernelspec and always uses its own sandbox.
c.Execute.kernel_name = "python3"

# Per-cell time limits for nbgrader's own execution (`nbgrader validate`), the same policy as
# the course's harness (graders.harness.limits.TimeLimits):
# 120 s for an ordinary cell (the slowest graded cells build a 12-layer GPT-2 and run it a few
# times, about 10 s on one core; nbgrader's default of 30 s fails them on a slow laptop), 600 s
# for the cells tagged `training` (notebook 07's budgeted training runs, 1-2 min on one core).
# An infinite loop is interrupted after its cell's limit and costs only that cell.
from graders.harness.limits import TimeLimits  # noqa: E402

# Validate checks as `make check` and grading do (graders/harness/validating.py): its kernels skip
# the demonstrations (an IPython extension installs that session before any cell runs), and a
# traceback names each cell as the grade report does, not "Cell In[7]" (the counter of a fresh
# kernel the learner never saw).
from graders.harness.validating import cell_naming_hooks  # noqa: E402

c.Execute.extra_arguments = ["--IPKernelApp.extensions=graders.harness.validating"]
c.Execute.on_notebook_start, c.Execute.on_cell_error = cell_naming_hooks()

c.Execute.timeout = TimeLimits().ordinary
c.Execute.timeout_func = TimeLimits().of
c.Execute.interrupt_on_timeout = True

# Output limits: a cell that floods its output is cut, so a huge print cannot break grading.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# A deleted test cell is restored from the source notebook and graded, not silently lost.
c.OverwriteCells.add_missing_cells = True

# Warnings on stderr: our checks send library warnings and progress bars to stdout, because
# nbgrader's validate fails any test cell that wrote to stderr even when it passed. The
# course's harness (make grade, nbgrader autograde) decides grades outside the kernel and
# ignores stderr.
