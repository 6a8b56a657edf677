"""03's `qk_ov_circuits(attn)`: each head's QK circuit W_Q W_K^T and OV circuit W_V W_O, judged
by what they do, against the course's own Attention.

In the kernel the learner's circuits are applied to seeded random residual vectors (no file
holds them): x W_QK x^T / sqrt(d_head) must be the head's attention scores without biases, and
x W_OV what the head writes for each key it attends to, before b_O. The 768 x 768 matrices stay
in the kernel; only these products are recorded. The judge recomputes
both from the reference weights, step by step, the way the course's Attention does.
"""
from __future__ import annotations

import math

import torch

from graders.judging.compare import CheckFailed, Mistake, check_shape, compare
from graders.judging.cases import Case, rand_float
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.reference.config import Config
from graders.reference.store import part

POSITIONS = 6
CIRCUIT_FORBIDDEN = Forbidden("the circuits", source_words=["components.Attention", "graders.reference"])


class AttentionWeights(torch.nn.Module):
    """One block's attention weights as attributes (`attn.W_Q`, ...): what the learner's circuits
    read. Not the course's Attention, which a grading kernel of 03 does not have."""

    def __init__(self, weights: dict):
        super().__init__()
        self.cfg = Config()
        for name, value in weights.items():
            self.register_buffer(name, value)


def _attention(case: Case) -> AttentionWeights:
    return AttentionWeights(part(f"blocks.{case.block}.attn")).eval()


def _residual(case: Case) -> torch.Tensor:
    return rand_float(case.seed + 500, POSITIONS, Config().d_model)       # [posn, d_model]


def produce(qk_ov_circuits, case: Case, inputs: dict) -> dict:
    if not callable(qk_ov_circuits):
        raise CheckFailed(f"qk_ov_circuits: expected your function, got {qk_ov_circuits!r}.")
    cfg = Config()
    result = run_learner("qk_ov_circuits", qk_ov_circuits, _attention(case), forbidden=CIRCUIT_FORBIDDEN)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed("qk_ov_circuits must return a pair (W_QK, W_OV).")
    shape = (cfg.n_heads, cfg.d_model, cfg.d_model)
    dims = ("head", "d_model (in)", "d_model (out)")
    for what, circuit in zip(("W_QK", "W_OV"), result):
        check_shape(f"qk_ov_circuits: {what}", circuit, shape, dims)
    W_QK, W_OV = (c.detach() for c in result)
    x = _residual(case)
    return {"scores": x @ W_QK @ x.T / math.sqrt(cfg.d_head),              # [n_heads, posn, posn]
            "writes": x @ W_OV}                                             # [n_heads, posn, d_model]


def _expected(case: Case, swap_qk: bool = False) -> dict:
    attn, x = _attention(case), _residual(case)
    with torch.no_grad():
        q = torch.einsum("pd,ndh->nph", x, attn.W_Q)                       # [n_heads, posn, d_head]
        k = torch.einsum("pd,ndh->nph", x, attn.W_K)
        v = torch.einsum("pd,ndh->nph", x, attn.W_V)
        scores = (k if swap_qk else q) @ (q if swap_qk else k).transpose(-1, -2) / math.sqrt(Config().d_head)
        return {"scores": scores, "writes": v @ attn.W_O}                   # [n_heads, posn, d_model]


def judge(case: Case, outputs: dict) -> None:
    d_head = Config().d_head
    right, swapped = _expected(case), _expected(case, swap_qk=True)
    compare(f"x W_QK x^T / sqrt(d_head) on {POSITIONS} random residual vectors (block {case.block})",
            outputs["scores"], right["scores"], ("head", "query_pos", "key_pos"),
            mistakes={Mistake("key_side_first", "W_QK is W_K W_Q^T: the query's side comes first, W_Q^h "
                              "(W_K^h)^T, so that x_q W_QK x_k^T is query q's score for key k"): swapped["scores"],
                      Mistake("circuit_scaled", "W_QK is already divided by sqrt(d_head): the scale belongs to "
                              "the scores, the circuit is the plain product W_Q^h (W_K^h)^T"):
                          right["scores"] / math.sqrt(d_head)},
            hint="a head's QK circuit is the product of its query and key weights, query side first: "
                 "[d_model, d_model] per head, no biases, no scale.",
            fix="W_QK = attn.W_Q @ attn.W_K.transpose(-1, -2)")
    compare(f"x W_OV on {POSITIONS} random residual vectors (block {case.block})", outputs["writes"],
            right["writes"], ("head", "position", "d_model"),
            hint="a head's OV circuit is the product of its value and output weights, value side first: "
                 "[d_model, d_model] per head, no biases.",
            fix="W_OV = attn.W_V @ attn.W_O")


circuits = Exercise("03_attention", "qk_ov_circuits", produce, judge,
                    defaults={"block": 1}, forbidden=(CIRCUIT_FORBIDDEN,))
check_qk_ov_circuits = circuits.checker(
    "Grade `qk_ov_circuits(attn) -> (W_QK, W_OV)` by what the circuits compute (visible: block 1).")
