"""Notebook 09's sinusoidal_encoding grader (graders/exercises/nb09/positions.py): correct variants (in
other styles) pass, each catalogued mistake fails with its name."""
import math

import pytest
import torch

from fix_last import fix_only_last
from graders.exercises import nb09
from graders.judging.compare import CheckFailed

from catalog_helpers import fails_with


# --- 1. sinusoidal_encoding ---------------------------------------------------------------------

def pe_solution(n_ctx, d_model):
    positions = torch.arange(n_ctx, dtype=torch.float32)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = positions / 10000 ** (two_i / d_model)
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)[:, :d_model]


def pe_slices(n_ctx, d_model):
    pe = torch.zeros(n_ctx, d_model)
    position = torch.arange(n_ctx).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe


def pe_loops(n_ctx, d_model):
    pe = torch.zeros(n_ctx, d_model, dtype=torch.float64)
    for pos in range(n_ctx):
        for j in range(d_model):
            angle = pos / 10000 ** (2 * (j // 2) / d_model)
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("fn", [pe_solution, pe_slices, pe_loops], ids=lambda f: f.__name__)
def test_sinusoidal_correct_variants_pass(fn):
    nb09.check_sinusoidal(fn)
    nb09.check_sinusoidal(fn, seq=50, seed=3)


def _pe(swap=False, exponent=2, first=0, halves=False, crash_on_odd=False):
    def fn(n_ctx, d_model):
        positions = torch.arange(first, first + n_ctx, dtype=torch.float32)[:, None]
        index = torch.arange(0, d_model, 2, dtype=torch.float32)
        angles = positions / 10000 ** (index * exponent / 2 / d_model)
        sin, cos = angles.sin(), angles.cos()
        if swap:
            sin, cos = cos, sin
        if halves:
            return torch.cat([sin, cos], dim=-1)[:, :d_model]
        pe = torch.zeros(n_ctx, d_model)
        pe[:, 0::2] = sin
        pe[:, 1::2] = cos if crash_on_odd else cos[:, : d_model // 2]
        return pe
    return fn


@pytest.mark.parametrize("fn, message", [
    (_pe(swap=True), "Likely mistake: sin and cos are swapped"),
    (_pe(exponent=1), "Likely mistake: the exponent uses i instead of 2i"),
    (_pe(first=1), "Likely mistake: positions start at 1"),
    (_pe(halves=True), "Likely mistake: sines and cosines are in two halves"),
    (_pe(crash_on_odd=True), "is odd"),
    (lambda n, d: pe_solution(n, d)[None], "without a batch dimension"),
])
def test_sinusoidal_mistakes_are_named(fn, message):
    fails_with(nb09.check_sinusoidal, fn, expected=message)


def test_a_named_sinusoidal_mistake_ends_with_the_line_it_corrects():
    from graders.exercises.nb09 import positions

    with pytest.raises(CheckFailed) as failure:
        nb09.check_sinusoidal(_pe(first=1))
    message = fix_only_last(str(failure.value))
    assert message.endswith(f"\n  Show the fix: {positions.POSITIONS}"), message
    assert "Hint:" not in message, message   # the mistake is named: no general recipe under it
