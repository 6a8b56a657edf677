"""Strings, lists of byte strings and lists of ids as the tensors a record holds (safetensors: a
check's inputs and outputs cross between the kernel and the judge as tensors only)."""
from __future__ import annotations

import torch


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
