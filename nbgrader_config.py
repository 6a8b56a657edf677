# nbgrader settings for this course, read by `nbgrader` run from the repository root, by the
# Validate button of `make lab`, and by `make check`. Every value here is chosen on purpose.
c = get_config()  # noqa: F821 (provided by nbgrader)

# The course folder nbgrader works in (release/, submitted/, gradebook.db); generated, not committed.
c.CourseDirectory.root = "build/course"

# Notebooks run in the kernel `make setup` installs into .venv (named python3 there). The grading
# harness (graders/harness/grading.py) ignores a notebook's kernelspec and always uses its own sandbox.
c.Execute.kernel_name = "python3"

# Per-cell time limits, the same policy as the course's harness (graders.harness.execute.TimeLimits):
# 120 s for an ordinary cell (the slowest graded cells build a 12-layer GPT-2 and run it a few
# times, about 10 s on one core; nbgrader's default of 30 s fails them on a slow laptop), 600 s
# for the cells tagged `training` (notebook 07's budgeted training runs, 1-2 min on one core).
# An infinite loop is interrupted after its cell's limit and costs only that cell.
from graders.harness.execute import TimeLimits  # noqa: E402

c.Execute.timeout = TimeLimits().ordinary
c.Execute.timeout_func = TimeLimits().of
c.Execute.interrupt_on_timeout = True

# Output limits: a cell that floods its output is cut, so a huge print cannot break grading.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# A deleted test cell is restored from the source notebook and graded, not silently lost.
c.OverwriteCells.add_missing_cells = True

# Warnings on stderr: our checks send library warnings and progress bars to stdout, because
# nbgrader's autograde zeroes any test cell that wrote to stderr even when it passed. The
# course's own harness (make grade) decides grades outside the kernel and ignores stderr.
