"""Strings, lists of byte strings and lists of ids as the tensors a record holds (safetensors: a
check's inputs and outputs cross between the kernel and the judge as tensors only), and the
one-line failure of a learner's function that returns something else than a list."""
from __future__ import annotations

import torch

from graders.judging.compare import CheckFailed


def as_list(what: str, values, kind: type, wanted: str) -> list:
    """`values` as a list of `kind`, or a one-line failure naming what the learner's code returned."""
    if isinstance(values, (list, tuple)) and all(isinstance(v, kind) for v in values):
        return list(values)
    wrong = [v for v in values if not isinstance(v, kind)] if isinstance(values, (list, tuple)) else []
    inner = f" holding a {type(wrong[0]).__name__}" if wrong else ""
    raise CheckFailed(f"{what}: return {wanted}; got a {type(values).__name__}{inner}.")


def text_tensor(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)


def tensor_text(values: torch.Tensor) -> str:
    return bytes(values.tolist()).decode("utf-8", errors="replace")


def pieces_tensors(pieces: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """(their bytes one after another, their lengths)."""
    flat = b"".join(pieces)
    return (torch.tensor(list(flat), dtype=torch.uint8),
            torch.tensor([len(p) for p in pieces], dtype=torch.int64))


def tensors_pieces(flat: torch.Tensor, lengths: torch.Tensor) -> list[bytes]:
    data, pieces, start = bytes(flat.tolist()), [], 0
    for length in lengths.tolist():
        pieces.append(data[start:start + length])
        start += length
    return pieces


def ids_tensor(ids) -> torch.Tensor:
    return torch.tensor(list(ids), dtype=torch.int64)
