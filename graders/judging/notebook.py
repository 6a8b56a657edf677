"""A notebook's declaration: what the course needs to know about a graded notebook, in one place.

Each grader module `graders/exercises/nbNN/__init__.py` declares `NOTEBOOK = Notebook(...)` beside its
exercises. The example class, the classroom test's expected grades, copy detection and the
picture tests derive from it; a test names the notebook whose declaration is missing.
"""
from __future__ import annotations

from dataclasses import dataclass

from graders.integrity import ANSWER_LIBRARIES


@dataclass(frozen=True)
class ExampleBug:
    """The classic mistake the example class's buggy student makes in this notebook."""
    answer: str                 # the grade_id of the answer cell it is made in
    find: str                   # text of the solution's answer cell ...
    replace: str                # ... and what the buggy student wrote instead
    costs: tuple[str, ...]      # the test cells (grade_ids) it fails: the rest keep their points
    named: str                  # words the grade report must use to name it


@dataclass(frozen=True)
class Notebook:
    name: str                   # the solution notebook's file stem, e.g. "01_layernorm"
    example_bug: ExampleBug
    pictures: int = 0           # cells tagged `picture` (each must draw one image)
    # Grader files (globs under graders/) whose functions solve this notebook's exercises: an
    # answer that copies one is flagged for the instructor (graders.harness.copies). By default
    # the notebook's own grader package, graders/exercises/nbNN/.
    course_code: tuple[str, ...] = ()
    # Installed modules or packages that answer this notebook's exercises and that its kernel does
    # not need: its grading kernels have them empty (graders.integrity.sandbox.sandbox_plan), so no
    # way of reaching them reaches anything. By default the libraries the judge's references are
    # built on (transformers, transformer_lens); a notebook whose kernel needs one says so.
    without_libraries: tuple[str, ...] = ANSWER_LIBRARIES

    def __post_init__(self):
        if not (len(self.name) > 3 and self.name[:2].isdigit() and self.name[2] == "_"):
            raise ValueError(f"notebook name {self.name!r} must look like NN_topic (the solution's file stem)")
        if not self.course_code:
            object.__setattr__(self, "course_code", (f"exercises/nb{self.name[:2]}/*.py",))
