"""Attention computed with the reference's weights and one classic mistake each, so that a wrong
output can be named."""
import math

import einops
import torch

from graders.exercises.common.config_cases import regrouped
from graders.exercises.nb03.common import future_mask
from graders.judging.compare import Mistake
from graders.reference.config import Config


def attention_variant(x, w, *, scale=None, mask="future", softmax_dim=-1, drop=(), z_order="right",
                      ignore=float("-inf"), softmax_first=False):
    """Attention on x [batch, posn, d_model] with reference weights `w`, optionally with a mistake."""
    n_heads, d_model, d_head = w["W_Q"].shape
    b = {name: (torch.zeros_like(w[name]) if name in drop else w[name])
         for name in ("b_Q", "b_K", "b_V", "b_O")}
    q = einops.einsum(x, w["W_Q"], "b p d, n d h -> b p n h") + b["b_Q"]
    k = einops.einsum(x, w["W_K"], "b p d, n d h -> b p n h") + b["b_K"]
    v = einops.einsum(x, w["W_V"], "b p d, n d h -> b p n h") + b["b_V"]
    scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(scale or d_head)
    n = x.shape[1]
    hide = {"future": future_mask(n),
            "future+diagonal": torch.triu(torch.ones(n, n, dtype=torch.bool)),
            "past": torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1),
            "none": torch.zeros(n, n, dtype=torch.bool)}[mask]
    if softmax_first:   # the mask applied to the probabilities, after the softmax
        pattern = scores.softmax(dim=softmax_dim).masked_fill(hide, ignore)
    else:
        pattern = scores.masked_fill(hide, ignore).softmax(dim=softmax_dim)
    if z_order == "heads-first":   # z as [batch, n_heads, posn, d_head] reshaped without a transpose
        z = einops.einsum(pattern, v, "b n q k, b k n h -> b n q h").reshape(x.shape[0], n, n_heads * d_head)
        return z @ w["W_O"].reshape(n_heads * d_head, d_model) + b["b_O"]
    z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")
    if z_order == "d_head-major":  # flattening (d_head n_heads) instead of (n_heads d_head)
        flat = einops.rearrange(z, "b q n h -> b q (h n)")
        return flat @ w["W_O"].reshape(n_heads * d_head, d_model) + b["b_O"]
    return einops.einsum(z, w["W_O"], "b q n h, n h d -> b q d") + b["b_O"]


MASKS_THE_DIAGONAL = Mistake("masks_diagonal", "the mask hides the diagonal too (a token must be able to attend "
                             "to itself: mask only the keys after the query)")


def attention_mistakes(x, w) -> dict:
    d_model, d_head = w["W_Q"].shape[1], w["W_Q"].shape[2]
    return {
        Mistake("scaled_by_d_model", "scaling the scores by 1/sqrt(d_model); divide by sqrt(d_head) (the size "
                "of each dot product)"):
            attention_variant(x, w, scale=d_model),
        Mistake("divided_by_d_head", "the scores are divided by d_head instead of its square root: divide q.k "
                "by sqrt(d_head)"):
            attention_variant(x, w, scale=d_head ** 2),
        Mistake("not_scaled", "the scores are not scaled: divide q.k by sqrt(d_head)"):
            attention_variant(x, w, scale=1),
        MASKS_THE_DIAGONAL: attention_variant(x, w, mask="future+diagonal", ignore=-1e5),
        Mistake("masks_past", "the mask hides the past instead of the future (tril and triu swapped, or "
                "query/key axes swapped: rows are queries, columns are keys)"): attention_variant(x, w, mask="past"),
        Mistake("softmax_over_queries", "softmax over the query axis; normalise over key positions (dim=-1 of "
                "[batch, n_heads, query_pos, key_pos])"): attention_variant(x, w, softmax_dim=-2),
        Mistake("no_causal_mask", "the causal mask is not applied (call self.apply_causal_mask on the scores "
                "before the softmax)"):
            attention_variant(x, w, mask="none"),
        Mistake("mask_after_softmax", "the causal mask is applied after the softmax: mask the SCORES, then take "
                "the softmax, so that each row of the pattern sums to 1 over the allowed keys"):
            attention_variant(x, w, softmax_first=True, ignore=-1e5),
        Mistake("future_zeroed_after_softmax", "the future is zeroed after the softmax, so the rows of the "
                "pattern no longer sum to 1: mask the scores with -inf (self.IGNORE) before the softmax"):
            attention_variant(x, w, softmax_first=True, ignore=0.0),
        Mistake("no_b_q", "b_Q is not added to the queries"): attention_variant(x, w, drop=("b_Q",)),
        Mistake("no_b_v", "b_V is not added to the values"): attention_variant(x, w, drop=("b_V",)),
        Mistake("no_b_o", "b_O is not added to the output"): attention_variant(x, w, drop=("b_O",)),
        Mistake("heads_reshaped_without_transpose", "heads mixed up: z of shape [batch, n_heads, posn, d_head] "
                "was reshaped to [batch, posn, n_heads*d_head] without first moving the heads axis after posn"):
            attention_variant(x, w, z_order="heads-first"),
        Mistake("heads_flattened_d_head_first", "heads mixed up: z was flattened as (d_head n_heads) instead of "
                "(n_heads d_head) before W_O"):
            attention_variant(x, w, z_order="d_head-major"),
    }


def head_settings_not_read(case, x, w, global_cfg: bool) -> dict:
    """On a case whose config splits d_model into other heads than GPT-2's 12 of 64 (`w` regrouped
    so): what an Attention that keeps GPT-2's head settings outputs on `x`, by description."""
    cfg, gpt2 = case.config(), Config()
    if (cfg.n_heads, cfg.d_head) == (gpt2.n_heads, gpt2.d_head):
        return {}
    global_read = ": your code reads the notebook's global `cfg`, not `self.cfg`, the config the module was built with"
    as_gpt2 = regrouped(w, gpt2.n_heads, gpt2.d_head)
    split = (f"the heads are split as GPT-2's {gpt2.n_heads} heads of {gpt2.d_head}, not as this check's "
             f"config's {cfg.n_heads} heads of {cfg.d_head}: read n_heads and d_head from self.cfg"
             + (global_read if global_cfg else ", not literals"))
    return {
        Mistake("d_head_not_from_config",
                f"d_head is not read from cfg: the scores are divided by sqrt({gpt2.d_head}) (GPT-2's d_head); "
                f"this check's config has d_head {cfg.d_head}: divide by the square root of self.cfg.d_head"
                + (global_read if global_cfg else ", not a literal")):
            attention_variant(x, w, scale=gpt2.d_head),
        Mistake("head_split_not_from_config", split): attention_variant(x, as_gpt2),
        Mistake("head_split_not_from_config", split + " (only the scale reads this config's d_head)"):
            attention_variant(x, as_gpt2, scale=cfg.d_head),
    }
