"""The marks integrity reads from the course's source, where each thing is defined.

- `@course_answer("LayerNorm")` above graders/reference/components.py's LayerNorm says that it
  answers the notebooks' LayerNorm. graders.integrity reads these marks without importing the
  source (graders.integrity.course_answers), and keeps each marked answer out of every grading
  kernel but where a check runs it (graders.integrity.kernel_view).
- A module-level `RUNS_IN_LEARNER_CODE = True` says that a file's code may run inside the
  learner's code (the check's machinery, the config and loading helpers a learner may call):
  it implements nothing a notebook grades, is never sealed, and its functions running there are
  the course's machinery, not the course's answers (graders.integrity.origins.is_machinery).

At run time a mark changes nothing. A leaf module: every layer may mark its answers."""
from typing import TypeVar

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

Answer = TypeVar("Answer")


def course_answer(named: str):
    """Mark a top-level class or function as the course's answer to what a notebook calls `named`
    (the course's `VariantAdamW` answers 12's `AdamW`), or as what a check keeps from the kernel
    for it (11's hidden texts)."""
    def mark(answer: Answer) -> Answer:
        return answer

    return mark
