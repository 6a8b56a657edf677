"""The kernels of nbgrader's Validate (the lab's button, `nbgrader validate`) check a notebook as
`make check` and grading do: nbgrader_config.py loads this IPython extension into each one, before
any cell runs, so the demonstrations skip themselves (they earn no points, and 07's and 10's
train for minutes)."""
from graders.judging.session import Session, install


def load_ipython_extension(ipython) -> None:
    install(Session(demonstrations=False))
