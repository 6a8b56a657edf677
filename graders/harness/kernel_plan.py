"""In which kernels a notebook is graded: none may hold real the answer of a check it grades.

A check whose `produce` runs course code in the kernel (a composite's supplied parts, a course
model it hands over) makes that code real there (graders.harness.kernel_view.kept_real): the
kernel receives it as that test cell starts (graders.judging.deliveries), after the records of
every earlier cell were taken, and holds it from then on. So the test cells are put, in notebook
order, each into the first kernel where none of its answers is real yet nor made real by its own
checks. A composite comes after its parts, so most notebooks take one kernel. Several run side by
side, each in a sandbox and with folders of its own, and only the records of the cells a kernel
grades count from it (graders.harness.grading). A check that makes its own answer real cannot be
graded without it and is listed by `self_answering`, which a test keeps empty.

A check's answer is named by what its test cell passes it (`check_rope(rope_cos_sin, apply_rope)`);
a course implementation by the notebook's name for it (`Notebook.renamed`, else its own name).
"""
from __future__ import annotations

import contextlib
import functools
import json

from graders.harness.kernel_view import kept_real, views_folder
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
    """The notebook's names of the course implementations real in the kernel grading `cells`."""
    from graders.exercises import declared_notebooks
    from graders.judging.origins import PACKAGE

    declared = declared_notebooks()
    renamed = {course: mine for d in declared.values() for course, mine in d.renamed}
    kept = kept_real(notebook, cells)
    real = set()
    for declaration in declared.values():
        for entry in declaration.implementations:
            file, _, name = entry.partition(":")
            if name in kept.get((PACKAGE / file).resolve(), ()):
                real.add(renamed.get(name, name))
    return frozenset(real)


def _clash(notebook: str, cells: tuple[str, ...]) -> frozenset[str]:
    """The answers graded by the last of `cells` (in notebook order, one kernel's) that are real
    by the time it runs: received by it or by a cell before it (graders.judging.deliveries)."""
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


def _planned(notebook: str) -> tuple[tuple[str, ...], ...]:
    groups: list[tuple[str, ...]] = []
    for grade_id in answers(notebook):
        for i, group in enumerate(groups):
            if not _clash(notebook, group + (grade_id,)):
                groups[i] = group + (grade_id,)
                break
        else:
            groups.append((grade_id,))
    return tuple(groups)


def self_answering(notebook: str) -> dict[str, frozenset[str]]:
    """{grade_id: its answers that its own checks make real}: cells no kernel can grade safely."""
    return {g: clash for g in answers(notebook) if (clash := _clash(notebook, (g,)))}
