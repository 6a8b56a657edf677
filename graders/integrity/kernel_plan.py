"""In which kernels a notebook is graded: none may hold real the answer of a check it grades.

A check whose `produce` runs course code in the kernel (a composite's supplied parts, a course
model it hands over) makes that code real there (graders.integrity.kernel_view.kept_real): the
kernel receives it as that test cell starts (graders.integrity.deliveries), after the records of
every earlier cell were taken, and holds it from then on. So the test cells are put, in notebook
order, each into the first kernel where none of its answers is real yet nor made real by its own
checks. A composite comes after its parts, so most notebooks take one kernel. Several run side by
side, each in a sandbox and with folders of its own, and only the records of the cells a kernel
grades count from it (graders.harness.grading). A check that makes its own answer real cannot be
graded without it and is listed by `self_answering`, which a test keeps empty.

A kernel is also started with the torch kernels its graded exercises refuse taken out of its
dispatcher, for its whole life (graders.integrity.kernel_bans): an exercise that refuses a kernel
another's correct answers or check may run (`Guard.may_run`: 12's checkpoint check runs the
course's training step, with F.cross_entropy, which 12's loss refuses) is graded in a kernel
apart, which stops after it.

A check's answer is named by what its test cell passes it (`check_rope(rope_cos_sin, apply_rope)`);
a course answer by the name its mark gives it (`@course_answer("AdamW")`, graders.marks).
"""
from __future__ import annotations

import contextlib
import functools
import json

from graders.integrity.kernel_bans import exercise_bans
from graders.integrity.course_answers import course_answers
from graders.integrity.kernel_view import kept_real, views_folder
from graders.reference.paths import atomic_write


@functools.lru_cache(maxsize=None)
def answers(notebook: str) -> dict[str, frozenset[str]]:
    """{grade_id: the names of the learner's objects its checks grade}."""
    from graders.harness.cells import source_notebook, test_cells
    from graders.judging.testcells import UnreadableTestCell, test_cells_of

    found = {}
    for cell in test_cells(source_notebook(notebook)):
        try:
            (read,) = test_cells_of([cell], notebook)
        except UnreadableTestCell:
            continue
        found[read.grade_id] = frozenset(name for call in read.calls for name in call.learners)
    return found


def real_answers(notebook: str, cells: tuple[str, ...]) -> frozenset[str]:
    """The notebook's names of the course answers real in the kernel grading `cells`."""
    kept = kept_real(notebook, cells)
    return frozenset(answer.named for answer in course_answers() if answer.symbol in kept.get(answer.path, ()))


def _clash(notebook: str, cells: tuple[str, ...]) -> frozenset[str]:
    """The answers graded by the last of `cells` (in notebook order, one kernel's) that are real
    by the time it runs: received by it or by a cell before it (graders.integrity.deliveries)."""
    real = frozenset().union(*(real_answers(notebook, (c,)) for c in cells))
    return real & answers(notebook).get(cells[-1], frozenset())


@functools.lru_cache(maxsize=None)
def kernel_groups(notebook: str) -> tuple[tuple[str, ...], ...]:
    """The test cells (grade_ids) each kernel grades, in notebook order: planned once per place
    and version of the graders and notebooks, and kept beside the kernel views (planning imports
    every notebook's graders and reads what they call, about a second)."""
    stored = views_folder() / f"{notebook}.kernels.json"
    with contextlib.suppress(OSError, ValueError):
        return tuple(tuple(group) for group in json.loads(stored.read_text()))
    groups = _planned(notebook)
    with contextlib.suppress(OSError):   # a cache shared read-only: planned again next time
        atomic_write(stored, lambda path: path.write_text(json.dumps(groups)))
    return groups


@functools.lru_cache(maxsize=None)
def _graded(notebook: str) -> dict[str, tuple]:
    """{grade_id: the exercises its checks grade}."""
    from graders.exercises import find
    from graders.harness.manifest import notebook_checks

    return {grade_id: tuple(find(key) for key, _ in checks) for grade_id, checks in notebook_checks(notebook).items()
            if not isinstance(checks, Exception)}


def graded_exercises(notebook: str, cells: tuple[str, ...]) -> list:
    """The exercises the test cells `cells` grade."""
    return [exercise for grade_id in cells for exercise in _graded(notebook).get(grade_id, ())]


def refused_kernels(notebook: str, cells: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(operator pattern, refusal): the torch kernels that the exercises `cells` grade refuse, which
    the kernel grading them has taken out of its dispatcher (graders.integrity.kernel_bans)."""
    bans: dict[str, str] = {}
    for exercise in graded_exercises(notebook, cells):
        for pattern, refusal in exercise_bans(exercise):
            bans.setdefault(pattern, refusal)
    return tuple(bans.items())


def _refuses_what_others_run(notebook: str, grade_id: str, others: tuple[str, ...]) -> bool:
    """Whether `grade_id`'s exercises refuse a kernel that a correct answer of one of `others` may run."""
    from graders.integrity.kernels import matches

    may_run = [op for exercise in graded_exercises(notebook, others) for op in exercise.guard.may_run]
    return any(matches(pattern, op) for pattern, _ in refused_kernels(notebook, (grade_id,)) for op in may_run)


def _planned(notebook: str) -> tuple[tuple[str, ...], ...]:
    """Each test cell in the first kernel where nothing clashes; then each that refuses a kernel
    another of its kernel may run (12's loss, whose checkpoint check runs F.cross_entropy) in a
    kernel apart, which stops after it (a refusal is armed for a kernel's whole life)."""
    def place(grade_id: str, into: list[tuple[str, ...]], refusals: bool = True) -> None:
        for i, group in enumerate(into):
            joined = group + (grade_id,)
            if not _clash(notebook, joined) and not (refusals and any(
                    _refuses_what_others_run(notebook, g, tuple(o for o in joined if o != g)) for g in joined)):
                into[i] = joined
                return
        into.append((grade_id,))

    groups: list[tuple[str, ...]] = []
    for grade_id in answers(notebook):
        place(grade_id, groups, refusals=False)
    apart: list[tuple[str, ...]] = []
    for i, group in enumerate(groups):
        for grade_id in group:
            others = tuple(g for g in groups[i] if g != grade_id)
            if _refuses_what_others_run(notebook, grade_id, others):
                groups[i] = others
                place(grade_id, apart)
    return tuple(group for group in groups + apart if group)


def self_answering(notebook: str) -> dict[str, frozenset[str]]:
    """{grade_id: its answers that its own checks make real}: cells no kernel can grade safely."""
    return {g: clash for g in answers(notebook) if (clash := _clash(notebook, (g,)))}
