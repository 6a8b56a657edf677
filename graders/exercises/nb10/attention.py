"""Notebook 10, exercise 4: grouped-query attention with a KV cache, `GQAttention(cfg)` with
`forward(x, cos, sin, past=None) -> (out, (keys, values))`, judged against transformers'
LlamaAttention (eager) loaded with the same seeded weights.

Every check runs three configs: GQA (8 query heads, 2 KV heads), MQA (1 KV head) and MHA (8):
`repeat` and `repeat_interleave` agree for the last two, so the first is the one that names
that mistake. Each config is run whole, then in three chunks through the learner's own cache
(the last chunk one token, as in generation), and the cache's shape is checked: KV heads only.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises.common.diagnosis import crash, is_crash, mismatched_sizes
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare
from graders.exercises.nb10 import reference as ref
from graders.exercises.nb10.norm_mlp import DEFAULTS, NOTEBOOK, hf_model, weights
from graders.exercises.common.properties import read_output
from graders.judging.cases import Case
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, build_module, run_learner
from graders.reference.weights import WeightLoadError, component, load_strict
from graders.integrity.library_kernels import ATTENTION_CODE, ATTENTION_KERNELS

DIMS = ("batch", "position", "d_model")
FORBIDDEN = Forbidden("grouped-query attention",
                      targets=[(F, "scaled_dot_product_attention"), (nn.MultiheadAttention, "forward")],
                      source_words=["scaled_dot_product_attention", "nn.MultiheadAttention", "repeat_kv"],
                      kernels=ATTENTION_KERNELS, library_code=ATTENTION_CODE)
# The course's RoPE under the notebook's names in the checks of the parts that call it: RoPE has a
# check of its own, so a mistake in it costs that check only.
ROPE_PARTS = {"rope_cos_sin": ref.rope_cos_sin, "apply_rope": ref.apply_rope}
AS_MANY_KV_HEADS = Mistake("as_many_kv_heads_as_query_heads", "the keys and values are used as if there were "
                           "n_heads of them: W_K and W_V have cfg.n_kv_heads heads, and each group of "
                           "n_heads // n_kv_heads query heads shares one")


def load_attention(cls, cfg: ref.ModernConfig, part: dict, what: str = "GQAttention",
                   course_parts=lambda module, cfg: module) -> nn.Module:
    """The learner's module built from `cfg` (its parts swapped by `course_parts`), with `part`'s
    weights loaded under the course's names."""
    module = course_parts(build_module(what, cls, cfg), cfg)
    try:
        return load_strict(module, part, what)
    except WeightLoadError as err:
        message, key = str(err), None
        if f"is [{cfg.n_heads}, {cfg.d_model}, {cfg.d_head}], expected [{cfg.n_kv_heads}," in message:
            first, rest = message.split("\n", 1)
            message, key = f"{first.rstrip(':')}. Likely mistake: {AS_MANY_KV_HEADS}.\n{rest}", AS_MANY_KV_HEADS.key
        raise CheckFailed(message, mistake=key) from None


def splits(seq: int) -> list[tuple[int, int]]:
    """The chunks a cached run feeds: the first half, the rest but one, then one token."""
    first = max(1, seq // 2)
    return [(0, first), (first, seq)] + ([(seq, seq + 1)])


def inputs_for(case: Case, cfg: ref.ModernConfig):
    """x [batch, seq + 1, d_model] (RMS-normed, as attention reads it) and its cos, sin."""
    x = ref.seeded_input(case.seed + 60 + cfg.n_kv_heads, case.batch, case.seq + 1, cfg.d_model)
    cos, sin = ref.rope_cos_sin(torch.arange(case.seq + 1), cfg.d_head, cfg.rope_theta)
    return x / x.pow(2).mean(-1, keepdim=True).sqrt(), cos, sin


def _run(what, attn, cfg, *args):
    try:
        result = run_learner(what, attn, *args, forbidden=FORBIDDEN)
    except CheckFailed as failure:
        sizes = mismatched_sizes(failure)
        if is_crash(failure) and cfg.n_kv_heads != cfg.n_heads and (
                sizes and set(sizes) == {cfg.n_heads, cfg.n_kv_heads} or "invalid for input of size" in str(failure)):
            raise crash(what, failure, "its inputs", AS_MANY_KV_HEADS) from failure.__cause__
        raise
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], tuple) and len(result[1]) == 2):
        raise CheckFailed(f"{what} returned {type(result).__name__}; return (out, (keys, values)).")
    return result


def _check_cache_heads(what: str, past, cfg: ref.ModernConfig) -> None:
    """A cache of the keys after they were repeated to every query head: named before the next
    call trips over it (torch.cat of n_heads and n_kv_heads heads)."""
    keys = past[0] if isinstance(past, tuple) and past and isinstance(past[0], torch.Tensor) else None
    if keys is not None and keys.ndim == 4 and keys.shape[1] == cfg.n_heads != cfg.n_kv_heads:
        raise CheckFailed(f"{what}: the cache it returned holds {cfg.n_heads} heads of keys; it holds the "
                          f"{cfg.n_kv_heads} KV heads. Likely mistake: the keys and values are cached after they "
                          "were repeated to every query head: cache them before repeat_interleave, and repeat "
                          "the whole (cached + new) keys for the scores.", mistake="cached_after_repeat")


def produce(GQAttention, case: Case, inputs: dict) -> dict:
    outputs = {}
    for cfg in ref.variants():
        tag = f"kv{cfg.n_kv_heads}"
        what = f"GQAttention (n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads})"
        attn = load_attention(GQAttention, cfg,
                              component(weights(case.seed, cfg.n_kv_heads), f"blocks.{case.block}.attn"))
        x, cos, sin = inputs_for(case, cfg)
        outputs[f"{tag}.full"] = _run(what, attn, cfg, x[:, :case.seq], cos[:case.seq], sin[:case.seq])[0]
        past, chunks = None, []
        for start, stop in splits(case.seq):
            _check_cache_heads(what, past, cfg)
            out, past = _run(what, attn, cfg, x[:, start:stop], cos[start:stop], sin[start:stop], past)
            chunks.append(out)
        outputs[f"{tag}.cached"] = torch.cat(chunks, dim=1)
        outputs[f"{tag}.keys"], outputs[f"{tag}.values"] = past
    return outputs


def attention_mistakes(x, w, cos, sin, cfg, seq: int | None = None) -> dict[str, torch.Tensor]:
    """What the catalogued mistakes output, whole (seq None) or through a cache in `splits(seq)`."""
    def run(**flags):
        if seq is None:
            return ref.attention(x, w, cos, sin, **flags)[0]
        past, chunks = None, []
        for start, stop in splits(seq):
            out, past = ref.attention(x[:, start:stop], w, cos[start:stop], sin[start:stop], past, **flags)
            chunks.append(out)
        return torch.cat(chunks, dim=1)

    found = {
        Mistake("repeat_not_interleave", "`repeat` where `repeat_interleave` is needed: query head h belongs to "
                "KV head h // (n_heads // n_kv_heads) (heads 0-3 share KV head 0), not h % n_kv_heads"):
            run(groups="repeat"),
        Mistake("scaled_by_sqrt_d_model", "the scores are scaled by sqrt(d_model): divide by sqrt(d_head)"):
            run(scale=math.sqrt(cfg.d_model)),
        Mistake("rope_on_values", "RoPE is applied to the values too: it rotates queries and keys only"):
            run(rope_values=True),
        Mistake("rope_on_queries_only", "RoPE is applied to the queries only: rotate the keys too (q·k then "
                "depends on m - n)"):
            run(rope_keys=False),
    }
    found[Mistake("divided_by_d_head", "the scores are divided by d_head: divide by sqrt(d_head)")] = \
        run(scale=float(cfg.d_head))
    found[Mistake("masked_scores_zero", "the masked scores are set to 0, not -inf: a 0 still gets weight after "
                  "the softmax")] = \
        run(masked_value=0.0)
    found[Mistake("no_causal_mask", "the causal mask is missing: query i may see keys 0 .. i only (scores above "
                  "the diagonal set to -inf before the softmax)")] = run(mask=False)
    found[Mistake("softmax_over_queries", "the softmax is over the queries (dim -2): each query's scores are "
                  "normalised over the keys, the last axis")] = run(softmax_dim=-2)
    found[Mistake("z_flattened_d_head_first", "z is flattened d_head first where W_O is read heads first: "
                  "flatten z as [n_heads, d_head], z.transpose(1, 2).reshape(batch, posn, n_heads * d_head), to "
                  "match W_O.reshape(n_heads * d_head, d_model)")] = run(z_d_head_first=True)
    if seq is not None:
        found[Mistake("cache_holds_new_only", "the cache returned holds this call's keys and values only: it is "
                      "the cached ones followed by the new ones (the concatenation the scores used)")] = \
            run(cache_new_only=True)
        found[Mistake("cached_before_rope", "the keys are cached before RoPE: the cache holds them rotated, as the "
                      "scores used them (a cached key is never rotated again)")] = run(cache_unrotated=True)
        found[Mistake("mask_ignores_cache", "the causal mask ignores the cache: new query i sits at position "
                      "past_len + i and may see every key up to it (torch.ones(n_q, n_k).triu(1 + n_k - n_q))")] = \
            run(offset_mask=False)
    return found


def judge(case: Case, outputs: dict) -> None:
    for cfg in ref.variants():
        tag, n = f"kv{cfg.n_kv_heads}", case.seq + 1
        x, cos, sin = inputs_for(case, cfg)
        w = component(weights(case.seed, cfg.n_kv_heads), f"blocks.{case.block}.attn")
        hf_attn = hf_model(case.seed, cfg.n_kv_heads).model.layers[case.block].self_attn
        with torch.no_grad():
            expected = hf_attn(hidden_states=x, position_embeddings=(cos[None], sin[None]),
                               attention_mask=ref.causal_mask(n, n))[0]
        what = f"GQAttention (n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads})"
        _judge_first_query_alone(f"{what} on {case.seq} positions at once", outputs.get(f"{tag}.full"))
        compare(f"{what} on {case.seq} positions at once", outputs.get(f"{tag}.full"), expected[:, :case.seq],
                DIMS, mistakes=lambda: attention_mistakes(x[:, :case.seq], w, cos[:case.seq], sin[:case.seq], cfg),
                hint="scores = q @ k.T / sqrt(d_head) with each query head reading its group's KV head.",
                reading=lambda actual: read_output(actual, expected[:, :case.seq], x[:, :case.seq], "attention",
                                                   DIMS, {"n_heads": cfg.n_heads, "d_head": cfg.d_head,
                                                          "d_model": cfg.d_model}))
        compare(f"{what} through your cache, in chunks {splits(case.seq)} (the same positions at once are "
                "right: the difference comes with the cache)", outputs.get(f"{tag}.cached"),
                expected, DIMS, mistakes=lambda: attention_mistakes(x, w, cos, sin, cfg, case.seq),
                hint="concatenate the cached keys and values before the new ones (dim 2), and let new "
                     "query i see keys 0 .. past_len + i.")
        for part in ("keys", "values"):
            check_shape(f"{what}: the cached {part} after {n} positions", outputs.get(f"{tag}.{part}"),
                        (case.batch, cfg.n_kv_heads, n, cfg.d_head), ("batch", "kv_head", "position", "d_head"))


def _judge_first_query_alone(what: str, out) -> None:
    """NaN or inf at the first position only: the one query whose only key is itself."""
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or not out.is_floating_point():
        return
    bad = (~torch.isfinite(out)).any(dim=0).any(dim=-1).nonzero().flatten().tolist()
    if bad == [0]:
        raise CheckFailed(f"{what}: NaN or infinite values at position 0 only. Likely mistake: the mask hides the "
                          "diagonal too, so the first query has no key left and a softmax over scores that are "
                          "all -inf gives NaN. A query may see itself: mask the keys after it, "
                          "torch.ones(n_q, n_k).triu(1) (shifted by the cache's length).", mistake="diagonal_masked")


exercise = Exercise(NOTEBOOK, "GQAttention", produce, judge,
                    forbidden=(FORBIDDEN,),
                    defaults=DEFAULTS, course_parts=ROPE_PARTS)
check_gq_attention = exercise.checker(
    "Grade `GQAttention` against transformers' LlamaAttention (GQA, MQA and MHA; whole and cached).")
