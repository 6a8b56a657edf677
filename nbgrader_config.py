# nbgrader settings for this course, read by `nbgrader` run from the repository root, by the
# Validate button of `make lab`, and by `make check`. Every value here is chosen on purpose.
c = get_config()  # noqa: F821 (provided by nbgrader)

# The course folder nbgrader works in (release/, submitted/, gradebook.db); generated, not committed.
c.CourseDirectory.root = "build/course"

# Notebooks run in the kernel `make setup` installs into .venv (named python3 there). The grading
# harness (graders/grading.py) ignores a notebook's kernelspec and always uses its own sandbox.
c.Execute.kernel_name = "python3"

# Per-cell time limit. The slowest graded cells build a full 12-layer GPT-2 and run it a few
# times (~5 s on 2 CPU cores, more on a loaded laptop); nbgrader's default of 30 s fails them
# on slow machines. Training cells in 07 run their own fixed budget (<= 2 min). An infinite
# loop is interrupted after this long and costs only that cell.
c.Execute.timeout = 300
c.Execute.interrupt_on_timeout = True

# Output limits: a cell that floods its output is cut, so a huge print cannot break grading.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# A deleted test cell is restored from the source notebook and graded, not silently lost.
c.OverwriteCells.add_missing_cells = True

# Warnings on stderr: our checks send library warnings and progress bars to stdout, because
# nbgrader's autograde zeroes any test cell that wrote to stderr even when it passed. The
# course's own harness (make grade) decides grades outside the kernel and ignores stderr.
