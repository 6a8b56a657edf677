"""nbgrader's Validate (the lab's button, `nbgrader validate`) checks a notebook as `make check` and
grading do. nbgrader_config.py sets up its two sides:

- its kernels load this module as an IPython extension, before any cell runs, so the
  demonstrations skip themselves (they earn no points, and 07's and 10's train for minutes);
- its Execute runs the hooks of `cell_naming_hooks`, so a traceback names a cell as the grade
  report does (graders.harness.cells.cell_label), not "Cell In[7]": the counter of a fresh
  kernel the learner never saw.
"""
from graders.harness.cells import cell_label, name_cells
from graders.judging.session import Session, install


def load_ipython_extension(ipython) -> None:
    install(Session(demonstrations=False))


def cell_naming_hooks():
    """nbclient's `on_notebook_start` and `on_cell_error` hooks, which share the notebook being
    run: a failing cell's traceback can name any cell that ran before it, and nbclient hands
    `on_cell_error` only the failing one. (Closures, not a bound method's object: traitlets
    deep-copies each configured hook, and a function is copied as itself.)"""
    running = {}

    def remember(notebook, **_) -> None:
        running["notebook"] = notebook

    def name_its_cells(cell, **_) -> None:
        labels = {ran["execution_count"]: cell_label(ran)
                  for ran in running["notebook"].cells if ran.get("execution_count")}
        for output in cell.get("outputs", []):
            name_cells(output, labels)

    return remember, name_its_cells
