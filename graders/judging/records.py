"""The record format between a grading kernel and the judge: written in one, read in the other.

A check in the kernel saves what the learner's code produced as `NNNNN.json` (its check id,
its exercise, a message) plus `NNNNN.safetensors` (tensors only: nothing executable). The judge
reads only regular files directly in the records folder, never following links.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path


def write_record(folder: Path, record: dict, outputs: dict | None) -> None:
    """Save one check's record as the next free `NNNNN.json` (+ `.safetensors` with `outputs`):
    a kernel restarted after a crash keeps the records of the one before."""
    import torch   # here, not at the top: `make check`'s own process never needs torch
    from safetensors.torch import save_file

    number = len(list(folder.glob("*.json"))) + 1
    while (folder / f"{number:05d}.json").exists():
        number += 1
    stem = folder / f"{number:05d}"
    if outputs is not None:
        save_file({k: torch.as_tensor(v).detach().cpu().contiguous().clone()
                   for k, v in outputs.items()}, f"{stem}.safetensors")
    stem.with_suffix(".json").write_text(json.dumps({**record, "tensors": outputs is not None}))


def load_records(records: Path) -> dict[str, dict]:
    """Recorded outputs by check id (the first record of each). Only JSON and safetensors are
    read: nothing executable.

    Only regular files directly in `records` count: a symlink planted there by a confined
    kernel would make this process read a file that the kernel itself could not.
    """
    from safetensors.torch import load

    by_check: dict[str, dict] = {}
    try:
        folder = os.open(records, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return by_check
    try:
        for name in sorted(n for n in os.listdir(folder) if n.endswith(".json")):
            try:
                record = json.loads(_regular_file(folder, name))
                tensors = name[:-len(".json")] + ".safetensors"
                record["outputs"] = load(_regular_file(folder, tensors)) if record.get("tensors") else None
            except Exception:  # a malformed record counts as a missing one
                continue
            by_check.setdefault(str(record.get("check")), record)
    finally:
        os.close(folder)
    return by_check


def _regular_file(folder: int, name: str) -> bytes:
    handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(handle, "rb") as f:
        if not stat.S_ISREG(os.fstat(handle).st_mode):  # a FIFO would block the grader
            raise OSError(f"{name} is not a regular file")
        return f.read()
