"""Grade one submitted notebook: run it in a sandboxed kernel, judge in this clean process.

1. Restore (graders.harness.cells): every locked cell of the source notebook replaces the
   submission's version, by nbgrader grade_id.
2. List (graders.harness.manifest): what each source test cell grades, read without running it.
   This imports every exercise module the judge needs before any learner code runs.
3. Prepare: each listed check's inputs, computed here from the reference and written where the
   kernel can read them. Expected outputs never leave this process.
4. Run (graders.harness.execute): the notebook in a fresh sandbox kernel; test cells record
   what the learner's code produced (graders.harness.records).
5. Judge: each recorded output with its exercise's `judge`. A test cell scores its points
   only if all its checks pass.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from graders.harness.cells import (cell_error, is_test_cell, learner_code, nbgrader_meta, points_of,
                                   released_notebook, restore, source_notebook, test_cells)
from graders.harness.copies import copy_flags
from graders.harness.execute import TimeLimits, run
from graders.harness.manifest import Check, UnreadableTestCell, notebook_checks
from graders.harness.records import load_records
from graders.harness.sandbox import confinement_unavailable, kernel_files


@dataclass
class CellResult:
    grade_id: str
    points: float
    max_points: float
    status: str          # passed | failed | error | timeout | crashed | missing-notebook
    message: str = ""


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
    """Write each listed check's inputs (and nothing else) where the kernel will look."""
    from safetensors.torch import save_file

    from graders.judging.cases import Case
    from graders.judging.exercise import find, inputs_file

    folder.mkdir(parents=True, exist_ok=True)
    for checks in wanted.values():
        if isinstance(checks, UnreadableTestCell):
            continue
        for key, fields in checks:
            exercise, case = find(key), Case(**fields)
            path = folder / inputs_file(key, case)
            tensors = {k: v.contiguous() for k, v in exercise.inputs(case).items()}
            if tensors and not path.exists():
                save_file(tensors, path)


def forbidden_use(key: tuple[str, str], code: str, own_code: str) -> str | None:
    """The first library shortcut or grader internal the learner's code names, if any: in
    `code` (the whole notebook's), or in `own_code` (the exercise's own answer cells) for words
    that other exercises of the notebook use rightly (Forbidden.notebook_wide)."""
    from graders.judging.exercise import find
    from graders.judging.learner import ALWAYS_FORBIDDEN_WORDS, mentions

    everywhere, own = set(ALWAYS_FORBIDDEN_WORDS) | {"graders"}, set()
    for forbidden in find(key).forbidden:
        (everywhere if forbidden.notebook_wide else own).update(forbidden.source_words)
    return next((w for w in sorted(everywhere) if mentions(code, w)), None) \
        or next((w for w in sorted(own) if mentions(own_code, w)), None)


def judge_cell(cell, wanted: list[Check] | UnreadableTestCell, records: list[dict],
               problem: str | None, error: str, code: str = "", own_code: str = "") -> CellResult:
    from graders.judging.cases import Case
    from graders.judging.compare import CheckFailed
    from graders.judging.exercise import find

    grade_id, points = nbgrader_meta(cell)["grade_id"], points_of(cell)

    def failed(status: str, message: str) -> CellResult:
        return CellResult(grade_id, 0.0, points, status, message)

    if isinstance(wanted, UnreadableTestCell):
        return failed("error", f"the course's test cell cannot be graded: {wanted}")
    for key, case in wanted:
        name = key[1]
        found = next((r for r in records if r.get("exercise") == list(key) and r.get("case") == case), None)
        if found is None:
            status = "crashed" if problem else "error"
            if problem and problem.startswith("timeout"):
                status = "timeout"
            return failed(status, problem or error or f"{name} did not run (an error before it?)")
        if found["outputs"] is None:
            return failed("failed", found.get("message", ""))
        used = forbidden_use(key, code, own_code)
        if used:
            return failed("failed", f"{name}: your code uses `{used}`. Build it yourself from "
                                    "tensor operations; library versions and the course's own "
                                    "graders are not allowed in answers.")
        try:
            find(key).judge(Case(**case), found["outputs"])
        except CheckFailed as failure:
            return failed("failed", str(failure))
        except Exception as err:  # malformed outputs (wrong keys, types): the learner's loss
            return failed("failed", f"{name}: the recorded outputs are unusable ({type(err).__name__}: {err})")
    if not wanted and error:
        return failed("error", error)
    return CellResult(grade_id, points, points, "passed")


def grade_notebook(student: str, name: str, path: Path | None, workdir: Path,
                   limits: TimeLimits = TimeLimits(), flags: list[str] | None = None) -> tuple[NotebookResult, object]:
    """Grade one student's notebook; returns the result and the executed, restored notebook."""
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
    result.flags += restore_flags + copy_flags(notebook, released_notebook(name))
    records, inputs = workdir / "records", workdir / "inputs"
    records.mkdir(parents=True, exist_ok=True)
    wanted = notebook_checks(name)
    prepare_inputs(wanted, inputs)
    unavailable = confinement_unavailable()
    if unavailable:
        warnings.warn(f"learner code runs unconfined, with this grader's file access "
                      f"(solutions/, the course cache, other students' files): {unavailable}. "
                      "Grade as root to confine it.", RuntimeWarning, stacklevel=2)
    files = None if unavailable else kernel_files(inputs)
    before = graders_snapshot()
    problems = run(notebook, records, workdir, limits, files, inputs)
    tampered = changed_graders(before)
    if tampered:
        result.flags.append(f"grader files changed while this notebook ran: {tampered}. Its tests "
                            "were judged by the grader as loaded before it ran; check those files "
                            "(e.g. `git status graders/`) before grading more.")
    recorded = load_records(records)
    code = learner_code(notebook, source)
    sources = {nbgrader_meta(c)["grade_id"]: c for c in test_cells(source)}
    for index, cell in enumerate(notebook.cells):
        if is_test_cell(cell):
            grade_id = nbgrader_meta(cell)["grade_id"]
            result.cells.append(judge_cell(sources[grade_id], wanted[grade_id], recorded.get(grade_id, []),
                                           problems.get(index), cell_error(cell), code,
                                           learner_code(notebook, source, up_to=grade_id)))
    return result, notebook


def graders_snapshot() -> dict[Path, bytes]:
    """The bytes of every file of the graders package."""
    package = Path(__file__).resolve().parents[1]
    return {p: p.read_bytes() for p in sorted(package.rglob("*.py"))}


def changed_graders(snapshot: dict[Path, bytes]) -> list[str]:
    """Paths (within graders/) of grader files that differ from `snapshot`.

    Nothing is written back: the judge of this run already imported every module it needs
    before learner code ran, and rewriting files could undo an instructor's own edit. The
    change is reported so that the instructor can see it and restore the files.
    """
    package = Path(__file__).resolve().parents[1]
    now = graders_snapshot()
    return sorted({str(p.relative_to(package)) for p in snapshot.keys() | now.keys()
                   if snapshot.get(p) != now.get(p)})
