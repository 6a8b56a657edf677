"""What both attention exercises use: the graded shapes, the forbidden shortcuts, the reference's
activations and its pre-mask scores, and its weights as heads of another config."""
import math
from functools import lru_cache

import einops
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises.common.config_cases import regrouped
from graders.judging.cases import Case
from graders.judging.cases import activations as _load_activations
from graders.judging.learner import Forbidden
from graders.reference import components
from graders.reference.store import part
from graders.integrity.library_kernels import ATTENTION_CODE, ATTENTION_KERNELS

DIMS = ("batch", "position", "d_model")
SCORE_DIMS = ("batch", "head", "query_pos", "key_pos")
PER_HEAD_POSITIONS = 8  # positions used to localise wrong heads
MASKED_AT_MOST = -1e4   # a masked score must be -inf or at most this (exp of it underflows to 0)

_FORBIDDEN_TARGETS = [
    (F, "scaled_dot_product_attention"), (nn.MultiheadAttention, "forward"),
    (F, "multi_head_attention_forward"),
    (components.Attention, "forward"), (components.Attention, "apply_causal_mask"),
]
# A bare word only matches when not preceded by "." (graders.judging.learner.mentions), so the
# dotted forms are listed too.
_FORBIDDEN_WORDS = ["scaled_dot_product_attention", "F.scaled_dot_product_attention",
                    "functional.scaled_dot_product_attention", "MultiheadAttention", "nn.MultiheadAttention",
                    "multi_head_attention_forward", "F.multi_head_attention_forward",
                    "graders.reference.components", "components.Attention"]
FORBIDDEN = Forbidden("attention", targets=_FORBIDDEN_TARGETS, source_words=_FORBIDDEN_WORDS,
                      kernels=ATTENTION_KERNELS, library_code=ATTENTION_CODE)
FORBIDDEN_MASK = Forbidden("the causal mask", targets=_FORBIDDEN_TARGETS, source_words=_FORBIDDEN_WORDS)


@lru_cache(maxsize=4)
def activations(case: Case) -> dict:
    """The reference activations, read from disk once per case (never handed to learner code)."""
    return _load_activations(case)


def prefix_of(case: Case) -> str:
    return f"blocks.{case.block}.attn"


# --- Reference quantities ---------------------------------------------------------------------

def reference_scores(case: Case) -> torch.Tensor:
    """Pre-mask scores [batch, n_heads, q, k]: the reference's where it kept them, q.k/sqrt(d_head) above."""
    acts = activations(case)
    b = f"blocks.{case.block}.attn"
    q, k = acts[f"{b}.hook_q"], acts[f"{b}.hook_k"]
    rebuilt = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(q.shape[-1])
    kept = acts[f"{b}.hook_attn_scores"]
    return torch.where(torch.isfinite(kept), kept, rebuilt).contiguous()


# The corrected line of a mask mistake (the notebook's names).
MASK_FIX = ("future = torch.triu(torch.ones(n_query, n_key, dtype=torch.bool, device=attn_scores.device), "
            "diagonal=1)")


def future_mask(n: int) -> torch.Tensor:
    """True where the key comes after the query (above the diagonal)."""
    return torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)


# --- Cases with other head settings ------------------------------------------------------------

def attention_weights(case: Case) -> dict:
    """The reference's weights of the case's block, as heads of the case's config: a config with
    other n_heads and d_head (same d_model) joins GPT-2's heads' dimensions in order, so that a
    head split other than GPT-2's still has trained weights."""
    w = part(prefix_of(case))
    cfg = case.config()
    return w if (cfg.n_heads, cfg.d_head) == tuple(w["W_Q"].shape[::2]) else regrouped(w, cfg.n_heads, cfg.d_head)


def course_attention(case: Case) -> nn.Module:
    """The course's Attention built with the case's config and `attention_weights(case)`."""
    from graders.reference.weights import load_strict

    return load_strict(components.Attention(case.config()), attention_weights(case), "Attention").eval()
