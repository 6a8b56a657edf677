"""Reading what the learner's code returns or leaves behind without trusting its types: a number
may come as a tensor, a NumPy scalar or something else altogether, and a dict's keys may not be
what they should. Each reader answers None (or "what is wrong") instead of raising, so that the
check, not a traceback from the course's code, tells the learner what to fix."""
from __future__ import annotations

import numbers
from collections.abc import Mapping

import torch


def whole_number(value) -> int | None:
    """An int from an int, a NumPy integer or a one-element integer CPU tensor; None otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.device.type != "cpu" or value.is_floating_point() or value.is_complex() \
                or value.dtype == torch.bool:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def real_number(value) -> float | None:
    """A float from a real number or a one-element real CPU tensor; None otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.device.type != "cpu" or value.is_complex() or value.dtype == torch.bool:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def real_tensor(value) -> torch.Tensor | None:
    """A real CPU tensor as it is (a tensor subclass as a plain tensor); None for anything else."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.is_complex():
        return None
    return value.detach().as_subclass(torch.Tensor) if type(value) is not torch.Tensor else value.detach()


def items_of(container) -> list[tuple] | None:
    """A mapping's (key, value) pairs, read without looking a key up (a learner's key may compare
    with ours in ways that raise); None when it is not a mapping or cannot be read."""
    if not isinstance(container, Mapping):
        return None
    try:
        return list(container.items())
    except Exception:   # a mapping of the learner's whose items() raises
        return None


def described_keys(keys) -> str:
    """Keys of any types, listed for a message."""
    return ", ".join(sorted(repr(key) if isinstance(key, str) else f"a {type(key).__name__}" for key in keys))


def shown(value) -> str:
    """A returned value for a message: a tensor by its dtype and shape, anything else by its repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
