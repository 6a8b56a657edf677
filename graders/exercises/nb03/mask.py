"""Notebook 03, exercise 1: `Attention.apply_causal_mask`, judged through the softmax of the
masked scores (so -inf and any large negative constant both pass), on the reference's scores, on
random scores, and on scores whose future entries are partly exactly 0.0."""
import difflib
import math

import torch
from torch import nn

from graders.exercises.nb03.common import (FORBIDDEN_MASK, MASK_FIX, MASKED_AT_MOST, SCORE_DIMS, activations,
                                           future_mask, prefix_of, reference_scores)
from graders.exercises.common.diagnosis import crash, is_crash, mismatched_sizes
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, mistake_key, with_fix
from graders.judging.cases import Case, rand_float
from graders.judging.exercise import Exercise
from graders.judging.learner import loaded, run_learner
from graders.judging.tolerance import close
from graders.reference.config import Config


def missing_mask_method(attn) -> Mistake | None:
    """The message for a class without `apply_causal_mask` (often misspelled), or None."""
    cls = type(attn)
    if callable(getattr(cls, "apply_causal_mask", None)):
        return None
    own = [name for klass in cls.__mro__ if klass not in nn.Module.__mro__
           for name, value in vars(klass).items() if callable(value) and not name.startswith("__")]
    near = difflib.get_close_matches("apply_causal_mask", own, n=1, cutoff=0.6)
    if near:
        return Mistake("mask_method_misspelled", f"{cls.__name__} has no method `apply_causal_mask`. Likely "
                       f"mistake: it is misspelled `{near[0]}`: rename the method to `apply_causal_mask` (and call "
                       "it by that name in forward), the name the notebook and the checks use.")
    return Mistake("no_mask_method", f"{cls.__name__} has no method `apply_causal_mask`: define it inside the "
                   "class (indented under `class Attention`), with the signature apply_causal_mask(self, "
                   "attn_scores).")


def _mask_crash_cause(failure: CheckFailed, scores: torch.Tensor) -> str:
    sizes = mismatched_sizes(failure)
    if sizes:
        foreign = [n for n in sizes if n not in scores.shape]
        if foreign:
            return Mistake("mask_size_hard_coded", f"the mask has a fixed size, {foreign[0]}, instead of the "
                           f"size of the scores it is given ({scores.shape[-1]}): build it from "
                           "attn_scores.shape[-1] (or attn_scores.size(-2), attn_scores.size(-1)).")
    if "out of bounds" in str(failure) or "out of range" in str(failure):
        return Mistake("positions_hard_coded", f"the mask assumes a fixed number of positions: a loop or an "
                       f"index goes past the size of the scores it is given ({scores.shape[-1]}): take the size "
                       "from attn_scores.shape[-1].")
    return ""


def _call_mask(attn, scores: torch.Tensor, on: str = "") -> torch.Tensor:
    # The unbound function, so the source check sees the learner's method; a clone, so that an
    # in-place masked_fill_ (harmless here) cannot touch the grader's tensor.
    missing = missing_mask_method(attn)
    if missing:
        raise CheckFailed(missing, mistake=mistake_key(missing))
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
    attn = loaded("Attention", Attention, prefix_of(case))
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
    lines, fix = [f"{what}: the masked entries are not exactly the future keys (above the diagonal)."], MASK_FIX
    key = None
    if torch.equal(hidden_qk, torch.triu(torch.ones(n, n, dtype=torch.bool))):
        key = "masks_diagonal"
        lines.append("  Likely mistake: the mask hides the diagonal too. A token may attend to "
                     "itself: mask only the keys after the query (from the first diagonal above it).")
    elif bool((hidden_qk & torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)).any()) and \
            not bool((hidden_qk & future).any()):
        key = "masks_past"
        lines.append("  Likely mistake: the mask hides the past instead of the future (tril and triu "
                     "swapped, or the mask transposed). Row = query, column = key: the future keys "
                     "are above the diagonal.")
    elif not bool(hidden.any()):
        kept_future = actual[..., future]
        if bool(torch.allclose(kept_future, scores[..., future].double())):
            key = "nothing_masked"
            lines.append("  Likely mistake: nothing was masked; the future scores came back unchanged "
                         "(masked_fill returns a new tensor: use its result).")
            fix = "return attn_scores.masked_fill(future, self.IGNORE)"
        elif bool((kept_future == 0).all()):
            key = "future_set_to_zero"
            lines.append("  Likely mistake: the future scores were set to 0, not to -inf. exp(0) = 1, "
                         "so a softmax still gives them weight: use self.IGNORE (or a large negative "
                         "number like -1e5).")
            fix = "return attn_scores.masked_fill(future, self.IGNORE)"
        else:
            key = "not_negative_enough"
            lines.append(f"  Likely mistake: the future scores were changed but not made negative enough (largest "
                         f"{kept_future.max().item():.3g}): set them to self.IGNORE (-inf) or a "
                         f"constant <= {MASKED_AT_MOST:g}.")
            fix = "return attn_scores.masked_fill(future, self.IGNORE)"
    missed = future & ~hidden_qk
    extra = hidden_qk & ~future
    zero_future = future & (scores == 0).all(dim=0).all(dim=0)
    if bool(missed.any()) and bool(zero_future.any()) and torch.equal(missed, zero_future):
        key = "mask_from_score_values"
        lines.insert(1, "  Likely mistake: the mask is built from the scores' values (e.g. "
                        "torch.triu(attn_scores, 1).bool(), or attn_scores.triu(1) != 0), so a future "
                        "score that is exactly 0.0 is not masked. Build it from the positions only "
                        "(a boolean matrix of the scores' size).")
    elif bool(missed.any()) and not bool(extra.any()) and torch.equal(
            missed, future & ~torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=2)):
        key = "mask_starts_at_diagonal_2"
        lines.insert(1, "  Likely mistake: the mask starts one diagonal too high (diagonal=2): the next "
                        "key, key = query + 1, is in the future too: the mask starts just above the diagonal.")
    if bool(missed.any()):
        lines.append(f"  Future entries left unmasked: {_positions(missed)}.")
    if bool(extra.any()):
        lines.append(f"  Entries masked that must stay (the query itself or earlier keys): "
                     f"{_positions(extra)}.")
    if not bool(missed.any()) and not bool(extra.any()):
        lines.append("  The mask differs between batch rows or heads: build one [query_pos, key_pos] "
                     "mask and broadcast it.")
    raise CheckFailed(with_fix("\n".join(lines), fix), mistake=key)


def judge_mask(case: Case, outputs: dict) -> None:
    check_shape("apply_causal_mask output on random scores [2, 3, 5, 5]", outputs["random_out"],
                (2, 3, 5, 5), SCORE_DIMS)
    scores = reference_scores(case)
    actual = outputs["out"]
    check_shape(f"apply_causal_mask output ({prefix_of(case)})", actual, scores.shape, SCORE_DIMS)
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
                          "The softmax comes afterwards, in forward.", mistake="returns_probabilities")
    _judge_mask_pattern(actual, scores, f"apply_causal_mask ({prefix_of(case)})")
    keep = ~future
    compare(f"apply_causal_mask output at the kept entries (key <= query) ({prefix_of(case)})",
            actual.masked_fill(~keep, 0.0), scores.masked_fill(~keep, 0.0), SCORE_DIMS,
            mistakes={Mistake("scaled_again", "the scores were scaled again inside apply_causal_mask (the caller "
                              "already divided by sqrt(d_head)); only mask here"):
                      (scores / math.sqrt(Config().d_head)).masked_fill(~keep, 0.0)},
            hint="return the scores unchanged except above the diagonal.")
    compare(f"softmax of your masked scores vs the reference pattern ({prefix_of(case)})",
            actual.softmax(-1), pattern, SCORE_DIMS)
    _judge_mask_pattern(outputs["random_out"].detach().double(), rand_float(case.seed, 2, 3, 5, 5),
                        "apply_causal_mask on random scores [2, 3, 5, 5]")
    zero = outputs["zero_future_out"]
    check_shape("apply_causal_mask output on scores [2, 3, 6, 6] with some future entries exactly 0.0",
                zero, (2, 3, 6, 6), SCORE_DIMS)
    _judge_mask_pattern(zero.detach().double(), zero_future_scores(case.seed),
                        "apply_causal_mask on scores [2, 3, 6, 6] whose future entries are partly exactly 0.0")


causal_mask = Exercise("03_attention", "apply_causal_mask", produce_mask, judge_mask,
                        inputs=inputs_mask, forbidden=(FORBIDDEN_MASK,))
check_apply_causal_mask = causal_mask.checker(
    "Grade the learner's `Attention.apply_causal_mask` (visible check: block 0, reference text).")
