"""Notebook 10, exercise 2: rotary position embedding, `rope_cos_sin(positions, d_head, theta)` and
`apply_rope(x, cos, sin)`, judged against transformers' LlamaRotaryEmbedding and
apply_rotary_pos_emb, for Llama 2's base (10,000) and Llama 3's (500,000).

First the frequency table; then a property of the learner's two functions together: shifting
every position by the same offset leaves the scores q·k unchanged (they depend on m - n only);
then the rotation itself.
"""
from __future__ import annotations

import math

from dataclasses import replace

import torch

from graders.exercises.diagnosis import compare, diagnosis_first
from graders.exercises.modern import reference as ref
from graders.exercises.modern.norm_mlp import DEFAULTS, NOTEBOOK
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner

THETAS = (10000.0, 500000.0)
D_HEAD, N_HEADS = 32, 4
FORBIDDEN = Forbidden("RoPE", source_words=["apply_rotary_pos_emb", "LlamaRotaryEmbedding", "rotary_emb"])
TABLE_DIMS, X_DIMS = ("position", "d_head"), ("batch", "head", "position", "d_head")


def offset(case: Case) -> int:
    return 7 + 3 * case.seed


def _qk(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(800 + case.seed)
    return tuple(torch.randn(case.batch, N_HEADS, case.seq, D_HEAD, generator=generator) for _ in range(2))


def produce(learner, case: Case, inputs: dict) -> dict:
    rope_cos_sin, apply_rope = learner
    positions = torch.arange(case.seq)
    q, k = _qk(case)
    outputs = {}
    for theta in THETAS:
        cos, sin = _pair(run_learner("RoPE (rope_cos_sin)", rope_cos_sin, positions, D_HEAD, theta,
                                     forbidden=FORBIDDEN))
        outputs[f"cos_{theta:g}"], outputs[f"sin_{theta:g}"] = cos, sin
    cos, sin = ref.rope_cos_sin(positions, D_HEAD, THETAS[0])
    outputs["q_rotated"] = run_learner("RoPE (apply_rope)", apply_rope, q, cos, sin, forbidden=FORBIDDEN)
    for name, start in (("scores", 0), ("scores_shifted", offset(case))):
        cos, sin = _pair(run_learner("RoPE (rope_cos_sin)", rope_cos_sin, positions + start, D_HEAD, THETAS[0],
                                     forbidden=FORBIDDEN))
        q_rot = run_learner("RoPE (apply_rope)", apply_rope, q, cos, sin, forbidden=FORBIDDEN)
        k_rot = run_learner("RoPE (apply_rope)", apply_rope, k, cos, sin, forbidden=FORBIDDEN)
        outputs[name] = q_rot @ k_rot.transpose(-1, -2)
    return outputs


def _pair(result) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"rope_cos_sin returned {type(result).__name__}; return a pair (cos, sin), "
                          "each [posn, d_head].")
    return result


def table_mistakes(positions: torch.Tensor, theta: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(cos, sin) of the usual mistakes in the frequency table, by description."""
    def table(base=theta, exponent=2, interleaved=False, unit=1.0, first=0, swapped=False):
        index = torch.arange(0, D_HEAD, 2, dtype=torch.float32) * exponent / 2
        angles = (positions.float()[:, None] + first) / base ** (index / D_HEAD) * unit
        angles = angles.repeat_interleave(2, -1) if interleaved else torch.cat([angles, angles], -1)
        return (angles.sin(), angles.cos()) if swapped else (angles.cos(), angles.sin())

    found = {"the frequency exponent is off by a factor of 2: theta ** (-2i / d_head) for i = 0 .. "
             "d_head/2 - 1, i.e. torch.arange(0, d_head, 2) / d_head": table(exponent=1),
             "the frequencies are interleaved (f0, f0, f1, f1, ...) as in the paper's pairs: "
             "transformers' Llama rotates halves, so the table holds them twice in a row, "
             "cat([freqs, freqs])": table(interleaved=True),
             "cos and sin are swapped: return (cos, sin), in that order": table(swapped=True),
             "the angles are in degrees: torch.cos and torch.sin take radians, m * theta ** (-2i / d_head)":
                 table(unit=180 / math.pi),
             "the positions start at 1: the first position is 0, with angle 0": table(first=1)}
    if theta != 10000.0:
        found["a wrong base: the frequencies use 10000, not the theta you are given"] = table(base=10000.0)
    return found


def rotation_mistakes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict[str, torch.Tensor]:
    half = D_HEAD // 2
    return {
        "pairs interleaved where transformers' Llama rotates halves: dimension j turns with "
        "j + d_head/2, not with its neighbour j + 1": ref.apply_rope_interleaved(x, cos, sin),
        "the rotation turns the wrong way: rotate_half(x) is cat([-x2, x1]), not cat([x2, -x1])":
            x * cos - ref.rotate_half(x) * sin,
        "the halves are not swapped: x * cos + rotate_half(x) * sin needs rotate_half(x) = "
        "cat([-x2, x1])": x * cos + torch.cat([-x[..., :half], x[..., half:]], -1) * sin,
        "the sin term is missing: x * cos + rotate_half(x) * sin": x * cos,
        "cos and sin are swapped in the rotation: x * cos + rotate_half(x) * sin": x * sin + ref.rotate_half(x) * cos,
    }


def judge(case: Case, outputs: dict) -> None:
    positions = torch.arange(case.seq)
    for theta in THETAS:
        expected = ref.hf_rope(replace(ref.ModernConfig(), d_head=D_HEAD, rope_theta=theta), positions)
        mistakes = table_mistakes(positions, theta)
        for i, name in enumerate(("cos", "sin")):
            compare(f"rope_cos_sin(positions 0..{case.seq - 1}, d_head={D_HEAD}, theta={theta:g}): {name}",
                    outputs.get(f"{name}_{theta:g}"), expected[i], TABLE_DIMS,
                    mistakes={why: pair[i] for why, pair in mistakes.items()},
                    hint="angle[m, j] = m * theta ** (-2i / d_head) with i = j mod (d_head / 2).")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = _qk(case)
    cos, sin = ref.hf_rope(replace(ref.ModernConfig(), d_head=D_HEAD), positions)
    expected, _ = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    compare(f"apply_rope(q {list(q.shape)}, cos, sin)", outputs.get("q_rotated"), expected, X_DIMS,
            mistakes=lambda: rotation_mistakes(q, cos, sin), hint="x * cos + rotate_half(x) * sin.")
    compare(f"q·k after RoPE, every position shifted by {offset(case)} (rope_cos_sin and apply_rope "
            "together)", outputs.get("scores_shifted"), outputs["scores"].double(), ("batch", "head", "query", "key"),
            hint="RoPE rotates q at position m by m·θ_i and k at n by n·θ_i, so q·k depends on m - n "
                 "only: the same rotation for both, a pure rotation of each pair.")


exercise = Exercise(NOTEBOOK, "RoPE", produce, diagnosis_first(judge), forbidden=(FORBIDDEN,), defaults=DEFAULTS)
check_rope = exercise.checker(
    "Grade `rope_cos_sin` and `apply_rope` against transformers' Llama rotary embedding.",
    learner=lambda rope_cos_sin, apply_rope: (rope_cos_sin, apply_rope))
