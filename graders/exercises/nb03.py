"""Grader for 03_attention: `Attention.apply_causal_mask` and the `Attention` forward pass.

Graded against the reference's blocks.{i}.attn: the pre-mask scores are rebuilt from hook_q / hook_k,
the masked scores are judged through their softmax (hook_pattern), so -inf and any large negative
constant both pass; the forward pass is fed blocks.{i}.ln1.hook_out and compared with
blocks.{i}.hook_attn_out.
"""
import difflib
import math

import einops
import torch
import torch.nn.functional as F
from torch import nn

from graders.reference import components
from functools import lru_cache

from graders.judging.cases import Case, rand_float, unseen_variant
from graders.judging.exercise import Exercise
from graders.judging.learner import loaded
from graders.reference.store import course_component, part
from graders.judging.cases import activations as _load_activations
from graders.reference.config import Config
from graders.judging.compare import CheckFailed, check_shape
from graders.exercises.diagnosis import compare, crash, diagnosis_first, is_crash, mismatched_sizes
from graders.judging.learner import Forbidden, run_learner
from graders.judging.tolerance import close
from graders.reference.weights import load_strict

DIMS = ("batch", "position", "d_model")
SCORE_DIMS = ("batch", "head", "query_pos", "key_pos")
PER_HEAD_POSITIONS = 8  # positions used to localise wrong heads
MASKED_AT_MOST = -1e4   # a masked score must be -inf or at most this (exp of it underflows to 0)

_FORBIDDEN_TARGETS = [
    (F, "scaled_dot_product_attention"), (nn.MultiheadAttention, "forward"),
    (F, "multi_head_attention_forward"),
    (components.Attention, "forward"), (components.Attention, "apply_causal_mask"),
]
# A bare word only matches when not preceded by "." (engine._mentions), so the dotted forms are listed too.
_FORBIDDEN_WORDS = ["scaled_dot_product_attention", "F.scaled_dot_product_attention",
                    "functional.scaled_dot_product_attention", "MultiheadAttention", "nn.MultiheadAttention",
                    "multi_head_attention_forward", "F.multi_head_attention_forward",
                    "graders.reference.components", "components.Attention"]
FORBIDDEN = Forbidden("attention", targets=_FORBIDDEN_TARGETS, source_words=_FORBIDDEN_WORDS)
FORBIDDEN_MASK = Forbidden("the causal mask", targets=_FORBIDDEN_TARGETS, source_words=_FORBIDDEN_WORDS)


@lru_cache(maxsize=4)
def activations(case: Case) -> dict:
    """The reference activations, read from disk once per case (never handed to learner code)."""
    return _load_activations(case)


def _prefix(case: Case) -> str:
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


def future_mask(n: int) -> torch.Tensor:
    """True where the key comes after the query (above the diagonal)."""
    return torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)


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


def attention_mistakes(x, w) -> dict:
    d_model, d_head = w["W_Q"].shape[1], w["W_Q"].shape[2]
    return {
        "scaling the scores by 1/sqrt(d_model); divide by sqrt(d_head) (the size of each dot product)":
            attention_variant(x, w, scale=d_model),
        "the scores are divided by d_head instead of its square root: divide q.k by sqrt(d_head)":
            attention_variant(x, w, scale=d_head ** 2),
        "the scores are not scaled: divide q.k by sqrt(d_head)": attention_variant(x, w, scale=1),
        "the mask hides the diagonal too (a token must be able to attend to itself: torch.triu(..., "
        "diagonal=1))": attention_variant(x, w, mask="future+diagonal", ignore=-1e5),
        "the mask hides the past instead of the future (tril and triu swapped, or query/key axes "
        "swapped: rows are queries, columns are keys)": attention_variant(x, w, mask="past"),
        "softmax over the query axis; normalise over key positions (dim=-1 of [batch, n_heads, "
        "query_pos, key_pos])": attention_variant(x, w, softmax_dim=-2),
        "the causal mask is not applied (call self.apply_causal_mask on the scores before the softmax)":
            attention_variant(x, w, mask="none"),
        "the causal mask is applied after the softmax: mask the SCORES, then take the softmax, so "
        "that each row of the pattern sums to 1 over the allowed keys":
            attention_variant(x, w, softmax_first=True, ignore=-1e5),
        "the future is zeroed after the softmax, so the rows of the pattern no longer sum to 1: "
        "mask the scores with -inf (self.IGNORE) before the softmax":
            attention_variant(x, w, softmax_first=True, ignore=0.0),
        "b_Q is not added to the queries": attention_variant(x, w, drop=("b_Q",)),
        "b_V is not added to the values": attention_variant(x, w, drop=("b_V",)),
        "b_O is not added to the output": attention_variant(x, w, drop=("b_O",)),
        "heads mixed up: z of shape [batch, n_heads, posn, d_head] was reshaped to [batch, posn, "
        "n_heads*d_head] without first moving the heads axis after posn":
            attention_variant(x, w, z_order="heads-first"),
        "heads mixed up: z was flattened as (d_head n_heads) instead of (n_heads d_head) before W_O":
            attention_variant(x, w, z_order="d_head-major"),
    }


# --- apply_causal_mask ------------------------------------------------------------------------

def missing_mask_method(attn) -> str | None:
    """The message for a class without `apply_causal_mask` (often misspelled), or None."""
    cls = type(attn)
    if callable(getattr(cls, "apply_causal_mask", None)):
        return None
    own = [name for klass in cls.__mro__ if klass not in nn.Module.__mro__
           for name, value in vars(klass).items() if callable(value) and not name.startswith("__")]
    near = difflib.get_close_matches("apply_causal_mask", own, n=1, cutoff=0.6)
    if near:
        return (f"{cls.__name__} has no method `apply_causal_mask`. Likely mistake: it is misspelled "
                f"`{near[0]}`: rename the method to `apply_causal_mask` (and call it by that name "
                "in forward), the name the notebook and the checks use.")
    return (f"{cls.__name__} has no method `apply_causal_mask`: define it inside the class (indented "
            "under `class Attention`), with the signature apply_causal_mask(self, attn_scores).")


def _mask_crash_cause(failure: CheckFailed, scores: torch.Tensor) -> str:
    sizes = mismatched_sizes(failure)
    if sizes:
        foreign = [n for n in sizes if n not in scores.shape]
        if foreign:
            return (f"the mask has a fixed size, {foreign[0]}, instead of the size of the scores it "
                    f"is given ({scores.shape[-1]}): build it from attn_scores.shape[-1] (or "
                    "attn_scores.size(-2), attn_scores.size(-1)).")
    if "out of bounds" in str(failure) or "out of range" in str(failure):
        return (f"the mask assumes a fixed number of positions: a loop or an index goes past the "
                f"size of the scores it is given ({scores.shape[-1]}): take the size from "
                "attn_scores.shape[-1].")
    return ""


def _call_mask(attn, scores: torch.Tensor, on: str = "") -> torch.Tensor:
    # The unbound function, so the source check sees the learner's method; a clone, so that an
    # in-place masked_fill_ (harmless here) cannot touch the grader's tensor.
    missing = missing_mask_method(attn)
    if missing:
        raise CheckFailed(missing)
    try:
        return run_learner("apply_causal_mask", type(attn).apply_causal_mask, attn, scores.clone(),
                           forbidden=FORBIDDEN_MASK)
    except CheckFailed as failure:
        if not is_crash(failure):
            raise
        raise crash("apply_causal_mask", failure, on or f"scores of shape {list(scores.shape)}",
                    _mask_crash_cause(failure, scores)) from failure.__cause__


def zero_future_scores(seed: int) -> torch.Tensor:
    """Random scores [2, 3, 6, 6] whose future entries are exactly 0.0 in every other column:
    a mask built from the scores' values (torch.triu(scores, 1).bool()) misses exactly those."""
    scores = rand_float(seed + 7, 2, 3, 6, 6)
    zero = future_mask(6) & (torch.arange(6) % 2 == 0)[None, :]
    return scores.masked_fill(zero, 0.0)


def inputs_mask(case: Case) -> dict:
    return {"scores": reference_scores(case)}


def produce_mask(Attention, case: Case, inputs: dict) -> dict:
    attn = loaded("Attention", Attention, _prefix(case))
    return {
        "random_out": _call_mask(attn, rand_float(case.seed, 2, 3, 5, 5), "random scores of shape [2, 3, 5, 5]"),
        "out": _call_mask(attn, inputs["scores"]),
        "zero_future_out": _call_mask(attn, zero_future_scores(case.seed),
                                      "scores [2, 3, 6, 6] with some future entries exactly 0.0"),
    }


def _positions(where: torch.Tensor, limit: int = 6) -> str:
    pairs = [f"(query {q}, key {k})" for q, k in where.nonzero().tolist()]
    return ", ".join(pairs[:limit]) + (f" ... ({len(pairs)} in all)" if len(pairs) > limit else "")


def _judge_mask_pattern(actual: torch.Tensor, scores: torch.Tensor, what: str) -> None:
    """Masked entries exactly the future ones; say which mistake when not."""
    n = scores.shape[-1]
    future = future_mask(n)
    hidden = actual <= MASKED_AT_MOST                     # -inf counts too
    hidden_qk = hidden.all(dim=0).all(dim=0)              # hidden for every batch row and head
    if bool((hidden == future).all()):
        return
    lines = [f"{what}: the masked entries are not exactly the future keys (above the diagonal)."]
    if torch.equal(hidden_qk, torch.triu(torch.ones(n, n, dtype=torch.bool))):
        lines.append("  Likely mistake: the mask hides the diagonal too. A token may attend to "
                     "itself: mask with torch.triu(..., diagonal=1).")
    elif bool((hidden_qk & torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)).any()) and \
            not bool((hidden_qk & future).any()):
        lines.append("  Likely mistake: the mask hides the past instead of the future (tril and triu "
                     "swapped, or the mask transposed). Row = query, column = key: the future keys "
                     "are above the diagonal, torch.triu(..., diagonal=1).")
    elif not bool(hidden.any()):
        kept_future = actual[..., future]
        if bool(torch.allclose(kept_future, scores[..., future].double())):
            lines.append("  Likely mistake: nothing was masked; the future scores came back unchanged "
                         "(masked_fill returns a new tensor: use its result).")
        elif bool((kept_future == 0).all()):
            lines.append("  Likely mistake: the future scores were set to 0, not to -inf. exp(0) = 1, "
                         "so a softmax still gives them weight: use self.IGNORE (or a large negative "
                         "number like -1e5).")
        else:
            lines.append(f"  Likely mistake: the future scores were changed but not made negative enough (largest "
                         f"{kept_future.max().item():.3g}): set them to self.IGNORE (-inf) or a "
                         f"constant <= {MASKED_AT_MOST:g}.")
    missed = future & ~hidden_qk
    extra = hidden_qk & ~future
    zero_future = future & (scores == 0).all(dim=0).all(dim=0)
    if bool(missed.any()) and bool(zero_future.any()) and torch.equal(missed, zero_future):
        lines.insert(1, "  Likely mistake: the mask is built from the scores' values (e.g. "
                        "torch.triu(attn_scores, 1).bool(), or attn_scores.triu(1) != 0), so a future "
                        "score that is exactly 0.0 is not masked. Build it from the positions only: "
                        "torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1).")
    elif bool(missed.any()) and not bool(extra.any()) and torch.equal(
            missed, future & ~torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=2)):
        lines.insert(1, "  Likely mistake: the mask starts one diagonal too high (diagonal=2): the next "
                        "key, key = query + 1, is in the future too. Use torch.triu(..., diagonal=1).")
    if bool(missed.any()):
        lines.append(f"  Future entries left unmasked: {_positions(missed)}.")
    if bool(extra.any()):
        lines.append(f"  Entries masked that must stay (the query itself or earlier keys): "
                     f"{_positions(extra)}.")
    if not bool(missed.any()) and not bool(extra.any()):
        lines.append("  The mask differs between batch rows or heads: build one [query_pos, key_pos] "
                     "mask and broadcast it.")
    raise CheckFailed("\n".join(lines))


def judge_mask(case: Case, outputs: dict) -> None:
    check_shape("apply_causal_mask output on random scores [2, 3, 5, 5]", outputs["random_out"],
                (2, 3, 5, 5), SCORE_DIMS)
    scores = reference_scores(case)
    actual = outputs["out"]
    check_shape(f"apply_causal_mask output ({_prefix(case)})", actual, scores.shape, SCORE_DIMS)
    if not actual.is_floating_point():
        raise CheckFailed(f"apply_causal_mask output: dtype {actual.dtype}, expected floating point.")
    actual = actual.detach().double()
    if bool(torch.isnan(actual).any()):
        raise CheckFailed("apply_causal_mask output contains NaN. Masked entries should be -inf "
                          "(self.IGNORE) or a large negative constant; nothing should be NaN.")
    acts = activations(case)
    pattern = acts[f"blocks.{case.block}.attn.hook_pattern"]
    future = future_mask(scores.shape[-1])
    probs = scores.double().masked_fill(future, float("-inf")).softmax(-1)
    if close(actual, probs):
        raise CheckFailed("apply_causal_mask returned probabilities: it should only mask the scores. "
                          "The softmax comes afterwards, in forward.")
    _judge_mask_pattern(actual, scores, f"apply_causal_mask ({_prefix(case)})")
    keep = ~future
    compare(f"apply_causal_mask output at the kept entries (key <= query) ({_prefix(case)})",
            actual.masked_fill(~keep, 0.0), scores.masked_fill(~keep, 0.0), SCORE_DIMS,
            mistakes={"the scores were scaled again inside apply_causal_mask (the caller already "
                      "divided by sqrt(d_head)); only mask here":
                      (scores / math.sqrt(Config().d_head)).masked_fill(~keep, 0.0)},
            hint="return the scores unchanged except above the diagonal.")
    compare(f"softmax of your masked scores vs the reference pattern ({_prefix(case)})",
            actual.softmax(-1), pattern, SCORE_DIMS)
    _judge_mask_pattern(outputs["random_out"].detach().double(), rand_float(case.seed, 2, 3, 5, 5),
                        "apply_causal_mask on random scores [2, 3, 5, 5]")
    zero = outputs["zero_future_out"]
    check_shape("apply_causal_mask output on scores [2, 3, 6, 6] with some future entries exactly 0.0",
                zero, (2, 3, 6, 6), SCORE_DIMS)
    _judge_mask_pattern(zero.detach().double(), zero_future_scores(case.seed),
                        "apply_causal_mask on scores [2, 3, 6, 6] whose future entries are partly exactly 0.0")


causal_mask = Exercise("03_attention", "apply_causal_mask", produce_mask, diagnosis_first(judge_mask),
                        inputs=inputs_mask, forbidden=(FORBIDDEN_MASK,))
check_apply_causal_mask = causal_mask.checker(
    "Grade the learner's `Attention.apply_causal_mask` (visible check: block 0, reference text).")


# --- Attention forward --------------------------------------------------------------------------

def _causal_split(seq: int) -> int:
    return max(1, seq // 2)


def _other_input(case: Case, x: torch.Tensor, seed_offset: int, rows: int, positions: int) -> torch.Tensor:
    return rand_float(case.seed * 1000 + seed_offset, rows, positions, x.shape[-1]) * x.std()


def inputs_attention(case: Case) -> dict:
    return {"x": activations(case)[f"blocks.{case.block}.ln1.hook_out"]}


def produce_attention(Attention, case: Case, inputs: dict) -> dict:
    prefix = _prefix(case)
    attn = loaded("Attention", Attention, prefix)
    x = inputs["x"].clone()   # the learner's own copy
    x_before = x.clone()
    seen = []
    method = getattr(attn, "apply_causal_mask", None)

    def recording(attn_scores, *args, **kwargs):
        if isinstance(attn_scores, torch.Tensor):
            seen.append(attn_scores.detach().clone())
        return method(attn_scores, *args, **kwargs)

    if method is not None:
        attn.apply_causal_mask = recording  # instance attribute: records the scores forward passes it
    try:
        out = run_learner("Attention", attn, x, forbidden=FORBIDDEN)
    except CheckFailed as failure:
        missing = missing_mask_method(attn)
        if missing and "apply_causal_mask" in str(failure):
            raise CheckFailed(missing + " (Your forward calls self.apply_causal_mask.)") from failure.__cause__
        raise
    finally:
        if method is not None:
            del attn.apply_causal_mask
    outputs = {
        "random_out": run_learner("Attention", attn, rand_float(case.seed, 2, 4, Config().d_model),
                                  forbidden=FORBIDDEN),
        "out": out,
        "input_modified": torch.tensor(not torch.equal(x, x_before)),
        "unseen_out": run_learner("Attention", attn, unseen_variant(x, case.seed), forbidden=FORBIDDEN),
        "mask_calls": torch.tensor(len(seen)),
        "scores_seen": seen[0] if seen else torch.zeros(0),
    }
    # Causality: replace every position >= t; outputs before t must not move.
    t = _causal_split(x.shape[1])
    changed = x.clone()
    changed[:, t:] = _other_input(case, x, 1, x.shape[0], x.shape[1] - t)
    outputs["changed_later_out"] = run_learner("Attention", attn, changed, forbidden=FORBIDDEN)
    # Batch independence: [this input, another one] together vs each alone.
    other = _other_input(case, x, 2, 1, x.shape[1])
    outputs["other_alone_out"] = run_learner("Attention", attn, other, forbidden=FORBIDDEN)
    outputs["pair_out"] = run_learner("Attention", attn, torch.cat([x[:1], other]), forbidden=FORBIDDEN)
    # One head at a time (W_O of the other heads and b_O zeroed), to say which heads are wrong;
    # on the first row and first positions only, to keep it cheap (attention is causal).
    weights = part(prefix)
    head_input = x[:1, :PER_HEAD_POSITIONS].clone()
    per_head = []
    for h in range(weights["W_O"].shape[0]):
        only = dict(weights)
        only["W_O"] = torch.zeros_like(weights["W_O"])
        only["W_O"][h] = weights["W_O"][h]
        only["b_O"] = torch.zeros_like(weights["b_O"])
        load_strict(attn, only, "Attention")
        per_head.append(run_learner("Attention", attn, head_input, forbidden=FORBIDDEN))
    outputs["per_head_out"] = torch.stack(per_head) if all(
        isinstance(p, torch.Tensor) and p.shape == head_input.shape for p in per_head) else torch.zeros(0)
    return outputs


def _indented(failure: CheckFailed) -> list[str]:
    return ["    " + line for line in str(failure).splitlines()]


def _localise(case: Case, outputs: dict) -> list[str]:
    """Where inside the learner's forward the difference starts, from what produce recorded."""
    prefix, lines, cfg = _prefix(case), [], Config()
    acts, w = activations(case), part(_prefix(case))
    scores = reference_scores(case)
    if int(outputs["mask_calls"]) == 0:
        lines.append("  Your forward never called self.apply_causal_mask: mask the scores with it "
                     "before the softmax.")
    else:
        seen = outputs["scores_seen"]
        x = acts[f"blocks.{case.block}.ln1.hook_out"]
        try:
            compare("The scores your forward passed to apply_causal_mask", seen, scores, SCORE_DIMS,
                    mistakes={
                        "scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head)":
                            scores * math.sqrt(cfg.d_head / cfg.d_model),
                        "not scaled by 1/sqrt(d_head)": scores * math.sqrt(cfg.d_head),
                        "divided by d_head instead of sqrt(d_head)": scores / math.sqrt(cfg.d_head),
                        "these are already probabilities: the softmax was taken before the mask":
                            scores.softmax(-1),
                        "b_Q missing from the queries": _scores_without(x, w, "b_Q"),
                    })
            lines.append("  The scores your forward passed to apply_causal_mask are right, so the "
                         "difference comes later: the mask, the softmax, z, W_O or b_O.")
        except CheckFailed as failed:
            lines.append("  The difference starts before the mask:")
            lines += _indented(failed)
    per_head = outputs["per_head_out"]
    n_heads = w["W_O"].shape[0]
    if per_head.shape[:1] == (n_heads,):
        z = acts[f"blocks.{case.block}.attn.hook_z"]
        z = z[:1, :per_head.shape[2]]
        wrong = [h for h in range(n_heads)
                 if not close(per_head[h], einops.einsum(z[:, :, h], w["W_O"][h], "b p h, h d -> b p d"))]
        if not wrong:
            lines.append("  With W_O and b_O kept to one head at a time, every head's contribution is "
                         "right: look at what you add after summing the heads (b_O).")
        elif len(wrong) < n_heads:
            lines.append(f"  Likely mistake: heads whose own contribution (z[:, :, h] @ W_O[h]) is wrong: "
                         f"{', '.join(map(str, wrong))} (the others are right); look for a head "
                         "dropped, or indexed wrongly, when the heads are split or summed.")
        else:
            lines.append("  Every head's own contribution (z[:, :, h] @ W_O[h]) is wrong.")
    return lines


def _scores_without(x, w, bias: str) -> torch.Tensor:
    zero = {k: (torch.zeros_like(v) if k == bias else v) for k, v in w.items()}
    q = einops.einsum(x, zero["W_Q"], "b p d, n d h -> b p n h") + zero["b_Q"]
    k = einops.einsum(x, zero["W_K"], "b p d, n d h -> b p n h") + zero["b_K"]
    return einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(q.shape[-1])


def judge_attention(case: Case, outputs: dict) -> None:
    prefix = _prefix(case)
    d_model = Config().d_model
    check_shape("Attention output on a random [2, 4, d_model] input", outputs["random_out"],
                (2, 4, d_model), DIMS)
    if bool(outputs["input_modified"]):
        raise CheckFailed("Attention changed its input tensor in place. Compute new tensors instead: "
                          "the residual stream must not be modified by reading it.")
    acts, w = activations(case), part(prefix)
    x = acts[f"blocks.{case.block}.ln1.hook_out"]
    expected = acts[f"blocks.{case.block}.hook_attn_out"]
    out = outputs["out"]
    check_shape(f"Attention output ({prefix})", out, expected.shape, DIMS)
    seen = outputs["scores_seen"]
    if seen.shape == x.shape[:1] + (w["W_Q"].shape[0], x.shape[1], x.shape[1]) and not (
            out.is_floating_point() and close(out, expected)) and close(seen, reference_scores(case).softmax(-1)):
        raise CheckFailed(
            f"Attention output ({prefix}) is wrong. Likely mistake: the causal mask is applied after "
            "the softmax: your forward passes probabilities (rows summing to 1) to "
            "self.apply_causal_mask. Mask the SCORES first, then take the softmax, so that each "
            "query's weights sum to 1 over the keys it may see.")
    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        bad = (~torch.isfinite(out)).any(dim=0).any(dim=-1).nonzero().flatten().tolist()
        lines = [f"Attention output ({prefix}) has NaN or infinite values at positions "
                 f"{', '.join(map(str, bad[:10]))}."]
        if bad == [0]:
            lines.append("  Likely mistake: the mask hides the diagonal too, so the first token has no "
                         "key left and softmax over all -inf gives NaN. Mask with torch.triu(..., "
                         "diagonal=1): a token may attend to itself.")
        elif bad == [x.shape[1] - 1]:
            lines.append("  Likely mistake: the mask hides the past and the diagonal (tril instead of "
                         "triu), so the last token has no key left. Rows are queries, columns keys: "
                         "the future is above the diagonal.")
        else:
            lines.append("  A row of scores that is entirely -inf gives NaN after softmax; look for a "
                         "mask that hides every key of some query, or a division by zero.")
        raise CheckFailed("\n".join(lines + _localise(case, outputs)))
    try:
        compare(f"Attention output ({prefix})", out, expected, DIMS,
                mistakes=attention_mistakes(x, w),
                hint="q, k, v = x @ W + b per head; scores = q.k / sqrt(d_head); mask the future; "
                     "softmax over keys; z = pattern @ v; out = sum over heads of z @ W_O, + b_O.")
    except CheckFailed as failed:
        raise CheckFailed("\n".join([str(failed)] + _localise(case, outputs))) from None
    t = _causal_split(x.shape[1])
    later = outputs["changed_later_out"]
    check_shape("Attention output with later positions changed", later, expected.shape, DIMS)
    moved = ((later[:, :t].double() - out[:, :t].double()).abs() > _tol(out[:, :t])).any(dim=0).any(dim=-1)
    if bool(moved.any()):
        raise CheckFailed(
            f"Attention is not causal: replacing the input at positions >= {t} changed your output at "
            f"earlier positions {', '.join(map(str, moved.nonzero().flatten().tolist()[:10]))}. A query "
            "must only read its own and earlier keys: mask every key after the query.")
    pair, alone = outputs["pair_out"], outputs["other_alone_out"]
    check_shape("Attention output on a batch of 2", pair, (2, x.shape[1], d_model), DIMS)
    for row, single, name in ((0, out[:1], "the graded input"), (1, alone, "another input")):
        if not close(pair[row:row + 1], single):
            raise CheckFailed(
                f"Attention mixes the batch: on a batch of two different inputs, row {row} ({name}) "
                "differs from running it alone. Keep the batch axis separate in every einsum/matmul "
                "(no sum over batch, no reshape that merges batch with positions or heads).")
    # Inputs no file holds: the expected outputs are computed here, with the course's Attention.
    course = course_component("Attention", prefix)
    for key, what, inp in (("random_out", "a random [2, 4, d_model] input", rand_float(case.seed, 2, 4, d_model)),
                           ("unseen_out", "a rescaled, noisy input that no file holds", unseen_variant(x, case.seed))):
        with torch.no_grad():
            expected = course(inp)
        compare(f"Attention output ({prefix}) on {what}", outputs[key], expected, DIMS,
                mistakes=attention_mistakes(inp, w))


def _tol(expected: torch.Tensor) -> torch.Tensor:
    from graders.judging.tolerance import tolerance

    return tolerance(expected)


attention = Exercise("03_attention", "Attention", produce_attention, diagnosis_first(judge_attention),
                      inputs=inputs_attention, forbidden=(FORBIDDEN,))
check_attention = attention.checker(
    "Grade the learner's `Attention` forward pass (visible check: block 0, reference text).")


# The classic mistake of the example class's buggy student (scores scaled by sqrt(d_model)):
# (answer cell, text in the solution, replacement).
EXAMPLE_BUG = ('attention_answer', 'math.sqrt(self.cfg.d_head)', 'math.sqrt(self.cfg.d_model)')
