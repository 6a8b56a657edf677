"""Where the course's notebooks are, and which they are: the one list, read from solutions/.

A leaf module (it imports nothing of the course), so that every layer can ask."""
from pathlib import Path

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"


def notebook_names() -> list[str]:
    """The course's notebooks in teaching order (their file stems)."""
    return sorted(p.stem for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb"))
