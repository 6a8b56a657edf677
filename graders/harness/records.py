"""The record format between a grading kernel and the judge: written in one, read in the other.

A check in the kernel saves what the learner's code produced as `NNNNN.json` (which exercise,
which case, a message) plus `NNNNN.safetensors` (tensors only: nothing executable). The judge
reads only regular files directly in the records folder, never following links.
"""
from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path


class Recorder:
    """Autograding mode: checks save what the learner's code produced instead of judging it.

    The harness turns this on inside the learner's kernel; a clean process that never ran
    learner code judges the saved tensors later. Whatever learner code does to this object can
    only change what gets recorded, never a verdict.
    """
    directory: Path | None = None
    cell: str | None = None
    count = 0

    @classmethod
    def start(cls, directory: str, cell: str) -> None:
        cls.directory, cls.cell = Path(directory), cell

    @classmethod
    def active(cls) -> bool:
        return cls.directory is not None

    @classmethod
    def save(cls, key: tuple[str, str], case, outputs: dict | None, message: str = "") -> None:
        import torch   # here, not at the top: `make check`'s own process never needs torch
        from safetensors.torch import save_file

        cls.count += 1
        while (cls.directory / f"{cls.count:05d}.json").exists():   # a restarted kernel's count
            cls.count += 1                                          # starts at 0 again: keep both
        stem = cls.directory / f"{cls.count:05d}"
        record = {"cell": cls.cell, "exercise": list(key), "case": dataclasses.asdict(case),
                  "message": message, "tensors": outputs is not None}
        if outputs is not None:
            save_file({k: torch.as_tensor(v).detach().cpu().contiguous().clone()
                       for k, v in outputs.items()}, f"{stem}.safetensors")
        stem.with_suffix(".json").write_text(json.dumps(record))


def recording_prelude(records: Path, grade_id: str) -> str:
    """The code the harness puts before a test cell in a grading kernel."""
    return (f"from graders.harness.records import Recorder as _Recorder\n"
            f"_Recorder.start({str(records)!r}, {grade_id!r})\n")


def load_records(records: Path) -> dict[str, list[dict]]:
    """Recorded outputs by test cell. Only JSON and safetensors are read: nothing executable.

    Only regular files directly in `records` count: a symlink planted there by a confined
    kernel would make this process read a file that the kernel itself could not.
    """
    from safetensors.torch import load

    by_cell: dict[str, list[dict]] = {}
    try:
        folder = os.open(records, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return by_cell
    try:
        for name in sorted(n for n in os.listdir(folder) if n.endswith(".json")):
            try:
                record = json.loads(_regular_file(folder, name))
                tensors = name[:-len(".json")] + ".safetensors"
                record["outputs"] = load(_regular_file(folder, tensors)) if record.get("tensors") else None
            except Exception:  # a malformed record counts as a missing one
                continue
            by_cell.setdefault(str(record.get("cell")), []).append(record)
    finally:
        os.close(folder)
    return by_cell


def _regular_file(folder: int, name: str) -> bytes:
    handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(handle, "rb") as f:
        if not stat.S_ISREG(os.fstat(handle).st_mode):  # a FIFO would block the grader
            raise OSError(f"{name} is not a regular file")
        return f.read()
