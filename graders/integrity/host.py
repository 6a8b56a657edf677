"""The grading host's side of integrity, for graders.harness: how a notebook's kernels are planned,
started confined and watched.

- `plan(notebook, inputs, without_libraries)`: one `KernelPlan` per kernel that grades the notebook
  (graders.integrity.kernel_plan says which test cells share one): the cells it grades, what it is
  handed as each starts, the torch kernels it has refused, and how it is confined.
- `kernel_argv(session_json)`: the command a grading kernel starts with.
- `confine(plan, ...)`: a confined kernel's environment and connection, and the host folders it
  writes (watched by `DiskWatch` while it runs).
- `hand_over(plan, grade_id, folder)`: the course code a test cell's checks run, put where the
  kernel takes it as the cell starts (graders.integrity.deliveries).
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from graders.integrity.allowed import given_part_names
from graders.integrity.disk_watch import DiskWatch
from graders.integrity.kernel_plan import graded_exercises, kernel_groups, refused_kernels
from graders.integrity.kernel_view import kernel_package
from graders.integrity.library_seals import sealed_mounts
from graders.integrity.sandbox import (SANDBOX_UIDS, confinement_unavailable, kernel_files, library_paths,
                                       sandbox_env, sandbox_plan, unconfined_notice)
from graders.integrity.sandbox_kernel import PLAN_ENV, SESSION_ARG, launcher_argv

__all__ = ["Confinement", "DiskWatch", "KernelPlan", "confine", "confinement_unavailable", "hand_over",
           "kernel_argv", "plan", "sandbox_env", "unconfined_notice"]


@dataclass(frozen=True)
class Confinement:
    """What a confined kernel sees of the grader's files (graders.integrity.sandbox)."""
    files: tuple[Path, ...]           # the grader's files it may read (weights, tokenizer, its inputs)
    view: Path                        # the graders package as it sees it (graders.integrity.kernel_view)
    without: tuple[Path, ...]         # installed packages it has empty
    sealed: tuple[tuple, ...]         # library modules it sees sealed (graders.integrity.library_seals)


@dataclass(frozen=True)
class KernelPlan:
    """One grading kernel of a notebook."""
    notebook: str
    tests: tuple[str, ...]                           # the grade_ids of the test cells it grades
    stop: bool                                       # no cell after the last of them runs
    given: tuple[str, ...]                           # the notebook's given parts, by name
    refused_kernels: tuple[tuple[str, str], ...]     # (operator pattern, refusal), for its whole life
    deliveries: dict[str, bytes | None]              # grade_id: the course code it receives as that cell starts
    confinement: Confinement | None                  # None where this machine cannot confine


def plan(notebook: str, inputs: Path, without_libraries: tuple[str, ...]) -> list[KernelPlan]:
    """The kernels that grade `notebook` (its checks' inputs in `inputs`), in order: the first runs
    the whole notebook, each later one stops after its last test cell."""
    groups = kernel_groups(notebook)
    # Made here, not in the kernels' threads (ast.parse is not thread-safe in Python 3.11).
    view, deliveries = kernel_package(notebook, tuple(g for group in groups for g in group))
    given = given_part_names(notebook)
    unconfined = confinement_unavailable()
    files = () if unconfined else (*kernel_files(inputs),)
    without = library_paths(without_libraries)
    return [KernelPlan(notebook, group, number > 0, given, refused_kernels(notebook, group),
                       {g: deliveries[g] for g in group},
                       None if unconfined else Confinement(files, view, without,
                                                           tuple(sealed_mounts(graded_exercises(notebook, group)))))
            for number, group in enumerate(groups)]


def kernel_argv(session_json: str) -> list[str]:
    """The kernelspec's command: the launcher that confines the kernel (where a plan says so) and
    arms its session before any learner code runs."""
    return launcher_argv(SESSION_ARG, session_json, "-f", "{connection_file}")


def confine(confinement: Confinement, env: dict, workdir: Path, records: Path, private: Path,
            handed: Path) -> tuple[dict, tuple[Path, ...]]:
    """Set `env` for a confined kernel with its own uid; (its connection config, the host folders
    it writes). `handed`: where its deliveries are left (read-only to it)."""
    uid = secrets.randbelow(SANDBOX_UIDS[1] - SANDBOX_UIDS[0]) + SANDBOX_UIDS[0]
    sockets = private / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:   # the kernel is this uid on the host too (sandbox_kernel)
        for folder in (workdir, records, sockets):
            os.chown(folder, uid, uid)
    env[PLAN_ENV] = json.dumps(sandbox_plan(workdir, records, [*confinement.files, handed], uid, sockets,
                                            confinement.view, confinement.without, list(confinement.sealed)))
    # The kernel has no network: it talks to this process over Unix sockets.
    return {"KernelManager": {"transport": "ipc", "ip": str(sockets / "kernel")}}, (records, sockets)


def hand_over(kernel: KernelPlan, grade_id: str, folder: Path) -> None:
    """Leave in `folder` the course code test cell `grade_id`'s checks run, if any."""
    if kernel.deliveries.get(grade_id) is not None:
        (folder / f"{grade_id}.delivery").write_bytes(kernel.deliveries[grade_id])
