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


# What a learner's output that is not a tensor was, so that the judge sees it as the learner's
# kernel did (a numpy array stays one: a check that refuses it in the notebook refuses it here).
_KINDS = {"ndarray": lambda t: t.numpy(), "float": lambda t: float(t.item()), "int": lambda t: int(t.item()),
          "bool": lambda t: bool(t.item()), "list": lambda t: t.tolist(), "tuple": lambda t: tuple(t.tolist())}


def _as_tensor(value):
    """(the tensor to save, the kind of non-tensor it was, or None)."""
    import numpy
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().clone(), None
    kind = "ndarray" if isinstance(value, numpy.ndarray) else type(value).__name__
    exact = torch.float64 if kind == "float" else None   # Python floats are doubles
    return torch.as_tensor(value, dtype=exact).contiguous().clone(), (kind if kind in _KINDS else None)


def write_record(folder: Path, record: dict, outputs: dict | None) -> None:
    """Save one check's record as the next free `NNNNN.json` (+ `.safetensors` with `outputs`):
    a kernel restarted after a crash keeps the records of the one before."""
    from safetensors.torch import save_file

    number = len(list(folder.glob("*.json"))) + 1
    while (folder / f"{number:05d}.json").exists():
        number += 1
    stem = folder / f"{number:05d}"
    kinds = {}
    if outputs is not None:
        saved = {}
        for key, value in outputs.items():
            saved[key], kind = _as_tensor(value)
            if kind:
                kinds[key] = kind
        save_file(saved, f"{stem}.safetensors")
    stem.with_suffix(".json").write_text(json.dumps({**record, "tensors": outputs is not None, "kinds": kinds}))


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
                outputs = load(_regular_file(folder, tensors)) if record.get("tensors") else None
                for key, kind in (record.get("kinds") or {}).items() if outputs is not None else ():
                    outputs[key] = _KINDS[kind](outputs[key])
                record["outputs"] = outputs
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
