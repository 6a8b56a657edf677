"""Notebook 09, exercise 1: the original Transformer's sinusoidal positional encoding.

    PE[pos, 2i]     = sin(pos / 10000^(2i / d_model))
    PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))

judged against this formula in float64 on several sizes, one of them with an odd d_model (its
last column is a sine without a cosine partner). Positions start at 0.
"""
from __future__ import annotations

import torch

from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, compare
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.marks import course_answer

DIMS = ("position", "d_model")
BASE = 10_000.0
FORBIDDEN = Forbidden("the sinusoidal encoding")   # torch has none; `transformers` is always refused


@course_answer("sinusoidal_encoding")
def sinusoidal(n_ctx: int, d_model: int, first: int = 0, exponent: str = "2i", swap: bool = False,
               layout: str = "interleaved") -> torch.Tensor:
    """The encoding (float64), or a named mistake's version of it.

    exponent: "2i" (right: 2i/d for the pair i), "i" (the pair index without the 2), "column"
    (the column index j for both columns of a pair). layout: "interleaved" (right: sin on even
    columns, cos on odd) or "halves" (all sines, then all cosines)."""
    pos = torch.arange(first, first + n_ctx, dtype=torch.float64)[:, None]    # [n_ctx, 1]
    column = torch.arange(d_model, dtype=torch.float64)
    if layout == "halves":
        n_sin = (d_model + 1) // 2
        pair = torch.cat([torch.arange(n_sin), torch.arange(d_model - n_sin)]).double()
        is_sin = column < n_sin
    else:
        pair, is_sin = (column // 2), (column % 2 == 0)
    power = {"2i": 2 * pair, "i": pair, "column": column}[exponent] / d_model
    angle = pos / BASE ** power                                               # [n_ctx, d_model]
    if swap:
        is_sin = ~is_sin
    return torch.where(is_sin, angle.sin(), angle.cos())


SWAPPED = Mistake("sin_cos_swapped", "sin and cos are swapped: even columns (2i) hold the sine, odd columns "
                  "(2i + 1) the cosine")
EXPONENT_I = Mistake("exponent_i_not_2i", "the exponent uses i instead of 2i: the frequency of pair i is "
                     "1 / 10000^(2i / d_model), so the wavelengths go from 2*pi up to 10000 * 2*pi across the "
                     "columns")
EXPONENT_COLUMN = Mistake("exponent_column_index", "the exponent uses the column index: both columns of pair i "
                          "(2i and 2i + 1) share the frequency 1 / 10000^(2i / d_model)")
FROM_ONE = Mistake("positions_from_one", "positions start at 1: the first position is 0 (its encoding is "
                   "sin 0 = 0, cos 0 = 1)")
HALVES = Mistake("sin_cos_in_halves", "sines and cosines are in two halves: they interleave, sin in column 2i "
                 "and cos in column 2i + 1")
MISTAKES = {SWAPPED: dict(swap=True), EXPONENT_I: dict(exponent="i"), EXPONENT_COLUMN: dict(exponent="column"),
            FROM_ONE: dict(first=1), HALVES: dict(layout="halves")}
# The solution's lines (the notebook's names), and which a named mistake gets.
POSITIONS = "positions = torch.arange(n_ctx, dtype=torch.float32)[:, None]"
TWO_I = "two_i = torch.arange(0, d_model, 2, dtype=torch.float32)"
ANGLES = "angles = positions / 10000 ** (two_i / d_model)"
INTERLEAVE = ("pe = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1); "
              "return pe.flatten(start_dim=1)[:, :d_model]")
FIX = f"{POSITIONS}; {TWO_I}; {ANGLES}; {INTERLEAVE}"
FIXES = {SWAPPED: INTERLEAVE, EXPONENT_I: ANGLES, EXPONENT_COLUMN: f"{TWO_I}; {ANGLES}", FROM_ONE: POSITIONS,
         HALVES: INTERLEAVE}
HINT = ("each pair of columns holds the sine and the cosine of one angle, the position times a frequency "
        "that falls along the pairs; positions start at 0: see the notebook's formula.")


def shapes(case: Case) -> list[tuple[int, int]]:
    """(n_ctx, d_model) pairs a case runs: an even d_model, an odd one, and d_model = 1."""
    return [(case.seq, 16 + 2 * case.seed), (case.seq // 2 + 1, 9 + 2 * case.seed), (3, 1)]


def produce(fn, case: Case, inputs: dict) -> dict:
    outputs = {}
    for i, (n_ctx, d_model) in enumerate(shapes(case)):
        try:
            outputs[f"pe_{i}"] = run_learner("sinusoidal_encoding", fn, n_ctx, d_model, forbidden=FORBIDDEN)
        except CheckFailed as failure:
            if getattr(failure, "unwritten", False):
                raise
            hint = (f"\n  Hint: d_model = {d_model} is odd, so there are {(d_model + 1) // 2} sine columns "
                    f"(0, 2, ..., {d_model - 1}) and only {d_model // 2} cosine columns: the last pair has "
                    "no cosine. Slice the frequencies for the cosines to d_model // 2."
                    if d_model % 2 and " raised " in str(failure) else "")
            raise CheckFailed(f"{failure}\n  (called as sinusoidal_encoding({n_ctx}, {d_model}))"
                              + hint, mistake=failure.mistake) from None
    return outputs


def judge(case: Case, outputs: dict) -> None:
    for i, (n_ctx, d_model) in enumerate(shapes(case)):
        expected = sinusoidal(n_ctx, d_model)
        mistakes = {d: sinusoidal(n_ctx, d_model, **kw) for d, kw in MISTAKES.items()}
        mistakes = {d: m for d, m in mistakes.items() if not torch.allclose(m, expected)}
        actual = outputs.get(f"pe_{i}")
        if isinstance(actual, torch.Tensor) and actual.shape == (1, n_ctx, d_model):
            raise CheckFailed(f"sinusoidal_encoding({n_ctx}, {d_model}) returned shape {list(actual.shape)}: "
                              f"return [n_ctx, d_model] = [{n_ctx}, {d_model}], without a batch dimension.")
        compare(f"sinusoidal_encoding({n_ctx}, {d_model})", actual, expected.float(), DIMS,
                mistakes=mistakes, hint=HINT, fix=FIX, fixes=FIXES)


exercise = Exercise("09_transformer_family", "sinusoidal_encoding", produce, judge,
                    forbidden=(FORBIDDEN,), defaults={"text": None})
check_sinusoidal = exercise.checker(
    "Grade `sinusoidal_encoding(n_ctx, d_model) -> [n_ctx, d_model]` against the formula, on an "
    "even d_model, an odd one and d_model = 1.")
