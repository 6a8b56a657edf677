"""Per-cell time limits: one policy for nbgrader (nbgrader_config.py) and the course's harness.

Kept free of heavy imports: every `nbgrader` command reads it through nbgrader_config.py.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeLimits:
    """Seconds a cell may run before it is interrupted: one policy for nbgrader (see
    nbgrader_config.py) and the course's harness. Cells tagged "training" (notebook 07's
    budgeted runs, 1-2 min on one core) get minutes; every other cell needs seconds (the
    slowest graded one about 10 s on one core), so an infinite loop there costs 2 min instead
    of the 5 min the former single limit allowed."""
    ordinary: int = 120
    training: int = 600

    def of(self, cell) -> int:
        return self.training if "training" in cell.get("metadata", {}).get("tags", []) else self.ordinary
