"""Grade one submitted notebook: run it in a sandboxed kernel, judge in this clean process.

1. Restore (graders.harness.cells): every locked cell of the source notebook replaces the
   submission's version, by nbgrader grade_id.
2. List (graders.harness.manifest): what each source test cell grades, read without running it.
   This imports every exercise module the judge needs before any learner code runs.
3. Prepare: each listed check's inputs, computed here from the reference and written where the
   kernel can read them. Expected outputs never leave this process.
4. Run (graders.harness.execute): the notebook in a fresh sandbox kernel (in several side by
   side when a test cell would grade course code the kernel received for an earlier one:
   graders.integrity.kernel_plan); test cells record what the learner's code produced
   (graders.judging.records), and each cell's records are taken as it ends, before the next
   cell receives the course code its checks run (graders.integrity.deliveries).
5. Judge: each recorded output, found by its check id, with `graders.judging.verdict.decide`
   (what the learner's own check cell calls too). A test cell scores its points only if all
   its checks pass.
"""
from __future__ import annotations

import copy
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from graders.harness.cells import (cell_error, is_test_cell, learner_code, nbgrader_meta, points_of,
                                   released_notebook, restore, source_notebook, test_cells)
from graders.harness.copies import copy_flags
from graders.harness.execute import TimeLimits, run
from graders.harness.manifest import Check, UnreadableTestCell, notebook_checks
from graders.exercises import declaration, find
from graders.judging.records import load_records
from graders.judging.testcells import hidden_calls
from graders.judging.verdict import LearnerCode, decide
from graders.integrity.host import confinement_unavailable, hand_over, plan, unconfined_notice


@dataclass
class CellResult:
    grade_id: str
    points: float
    max_points: float
    status: str          # passed | failed | error | timeout | crashed | missing-notebook
    message: str = ""
    mistake: str | None = None   # the key of the known mistake the message names, if it has one
    hidden_only: bool = False    # failed a hidden check after every visible one had passed


@dataclass
class NotebookResult:
    student: str
    notebook: str
    cells: list[CellResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)   # restored cells, renamed notebook, ...

    @property
    def score(self) -> float:
        return sum(c.points for c in self.cells)

    def to_json(self) -> dict:
        return {"student": self.student, "notebook": self.notebook, "flags": self.flags,
                "cells": [asdict(c) for c in self.cells]}


def prepare_inputs(wanted: dict[str, list[Check] | UnreadableTestCell], folder: Path) -> None:
    """Write each listed check's inputs (and nothing else) where the kernel will look, under its
    check id; a check with no inputs gets an empty file, so that a missing one is an error."""
    from safetensors.torch import save_file

    from graders.judging.cases import Case
    from graders.judging.session import inputs_name

    folder.mkdir(parents=True, exist_ok=True)
    for grade_id, checks in wanted.items():
        if isinstance(checks, UnreadableTestCell):
            continue
        for index, (key, fields) in enumerate(checks):
            tensors = {k: v.contiguous() for k, v in find(key).inputs(Case(**fields)).items()}
            save_file(tensors, folder / inputs_name(f"{grade_id}/{index}"))


def judge_cell(cell, wanted: list[Check] | UnreadableTestCell, records: dict[str, dict],
               problem: str | None, error: str, code: LearnerCode = LearnerCode()) -> CellResult:
    """A test cell's result: its points when every check it lists has a record that `decide`
    passes, judged with the learner's code above the cell."""
    from graders.judging.cases import Case

    grade_id, points = nbgrader_meta(cell)["grade_id"], points_of(cell)

    def failed(status: str, message: str, **verdict) -> CellResult:
        return CellResult(grade_id, 0.0, points, status, message, **verdict)

    if isinstance(wanted, UnreadableTestCell):
        return failed("error", f"the course's test cell cannot be graded: {wanted}")
    hidden = hidden_calls(cell.get("source", ""))
    # The visible checks first: a hidden one that fails then fails an answer that passed them all.
    for index in sorted(range(len(wanted)), key=lambda i: i in hidden):
        key, case = wanted[index]
        found = records.get(f"{grade_id}/{index}")
        if found is None or found.get("exercise") != list(key):
            status = "crashed" if problem else "error"
            if problem and problem.startswith("timeout"):
                status = "timeout"
            return failed(status, problem or error or f"{key[1]} did not run (an error before it?)")
        verdict = decide(find(key), Case(**case), found["outputs"], found.get("message", ""), code,
                         found.get("mistake"))
        if not verdict.passed:
            return failed("failed", verdict.message, mistake=verdict.mistake,
                          hidden_only=index in hidden and len(hidden) < len(wanted))
    if not wanted and error:
        return failed("error", error)
    return CellResult(grade_id, points, points, "passed")


def grade_notebook(student: str, name: str, path: Path | None, workdir: Path,
                   limits: TimeLimits = TimeLimits(), flags: list[str] | None = None,
                   kernels_at_once: int = 2) -> tuple[NotebookResult, object]:
    """Grade one student's notebook; returns the result and the executed, restored notebook.

    A notebook graded in several kernels runs up to `kernels_at_once` of them at the same time
    (each is one process in a sandbox of its own, with folders of its own); a class pipeline
    that already keeps every core busy passes 1."""
    source = source_notebook(name)
    result = NotebookResult(student, name, flags=list(flags or []))
    if path is None:
        result.cells = [CellResult(nbgrader_meta(c)["grade_id"], 0.0, points_of(c),
                                   "missing-notebook", f"{name}.ipynb was not submitted")
                        for c in test_cells(source)]
        return result, None
    try:
        submission = nbformat.read(path, as_version=4)
    except Exception as err:
        submission = nbformat.v4.new_notebook()
        result.flags.append(f"the notebook could not be read ({type(err).__name__}); graded as empty")
    notebook, restore_flags = restore(submission, source)
    released = released_notebook(name)
    result.flags += restore_flags
    inputs = workdir / "inputs"
    wanted = notebook_checks(name)
    prepare_inputs(wanted, inputs)
    kernels = plan(name, inputs, declaration(name).without_libraries if wanted else ())   # 00 declares nothing
    if kernels[0].confinement is None:
        warnings.warn(unconfined_notice(confinement_unavailable()), RuntimeWarning, stacklevel=2)
    before = graders_snapshot()
    # The kernels write outputs into their own copies; the first into `notebook`, which is returned.
    copies = [notebook] + [copy.deepcopy(notebook) for _ in kernels[1:]]
    groups = [kernel.tests for kernel in kernels]
    taken: list[dict[str, dict]] = [{} for _ in kernels]

    def run_kernel(number: int) -> dict[int, str]:
        # Each kernel has folders of its own: none sees, nor can prepare, another's.
        home, records, handed = (workdir / f"{what}-{number}" for what in ("kernel", "records", "deliveries"))
        for folder in (home, records, handed):
            folder.mkdir(parents=True)
        handed.chmod(0o755)   # read by the kernel's uid, written by this process only

        def take(grade_id: str) -> None:   # its records, before a later cell receives anything
            taken[number].update({check: record for check, record in load_records(records).items()
                                  if check.split("/")[0] == grade_id})

        return run(copies[number], records, home, limits, kernels[number], inputs,
                   around_test_cells=(lambda grade_id: hand_over(kernels[number], grade_id, handed), take),
                   deliveries=handed)

    sources = {nbgrader_meta(c)["grade_id"]: c for c in test_cells(source)}

    def judged(number: int, problems: dict[int, str]) -> dict[int, CellResult]:
        """The results of the test cells kernel `number` grades, from its records only (judged
        here as soon as it ends, while the others may still run)."""
        ran, results = copies[number], {}
        for index in _test_indices(ran, groups[number]):
            cell = ran.cells[index]
            grade_id = nbgrader_meta(cell)["grade_id"]
            results[index] = judge_cell(sources[grade_id], wanted[grade_id], taken[number], problems.get(index),
                                        cell_error(cell), learner_code(ran, released, grade_id))
        return results

    results: dict[int, CellResult] = {}
    answered = copy.deepcopy(notebook)   # before the first kernel writes its outputs into `notebook`
    with ThreadPoolExecutor(max_workers=max(1, kernels_at_once)) as pool:
        running = {pool.submit(run_kernel, number): number for number in range(len(kernels))}
        # Here, while the kernels run, and never beside the judging: both parse Python, and
        # ast.parse in two threads at once fails in Python 3.11 (a recursion-depth SystemError).
        result.flags += copy_flags(answered, released)
        for done in as_completed(running):
            results.update(judged(running[done], done.result()))
    for number in range(1, len(kernels)):   # a test cell shows what it printed in its own kernel
        for index in _test_indices(copies[number], groups[number]):
            notebook.cells[index]["outputs"] = copies[number].cells[index].get("outputs", [])
    tampered = changed_graders(before)
    if tampered:
        result.flags.append(f"grader files changed while this notebook ran: {tampered}. Its tests "
                            "were judged by the grader as loaded before it ran; check those files "
                            "(e.g. `git status graders/`) before grading more.")
    result.cells = [results[index] for index in sorted(results)]
    return result, notebook


def _test_indices(notebook, group: tuple[str, ...]) -> set[int]:
    return {i for i, c in enumerate(notebook.cells) if is_test_cell(c) and nbgrader_meta(c)["grade_id"] in group}


_PACKAGE = Path(__file__).resolve().parents[1]


def graders_snapshot() -> dict[Path, bytes]:
    """The bytes of every file of the graders package, compiled files included (a planted .pyc
    stamped like its source would be loaded by the next grading run). Every module is compiled
    first, so that this process's own later imports write nothing new."""
    import compileall

    compileall.compile_dir(_PACKAGE, quiet=2)
    return _package_files()


def _package_files() -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(_PACKAGE.rglob("*")) if p.is_file()}


def changed_graders(snapshot: dict[Path, bytes]) -> list[str]:
    """Paths (within graders/) of grader files that differ from `snapshot`.

    Nothing is written back: the judge of this run already imported every module it needs
    before learner code ran, and rewriting files could undo an instructor's own edit. The
    change is reported so that the instructor can see it and restore the files.
    """
    now = _package_files()
    return sorted({str(p.relative_to(_PACKAGE)) for p in snapshot.keys() | now.keys()
                   if snapshot.get(p) != now.get(p)})
