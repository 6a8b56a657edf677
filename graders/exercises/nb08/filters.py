"""Notebook 08's filters, `apply_top_k` and `apply_top_p`: judged like every logit transform
(`transforms.transform_exercise`), with a rule that says which tokens a learner's filter keeps.

Fair to float32 code: each top_p below 1 is picked at least DECISION_MARGIN away from every
row's cumulative probabilities, so summing in float32 or float64 keeps the same tokens. The
exceptions are the edges the notebook states: top_p = 1.0 keeps every token, also on sharp
logits where a float32 running total reaches 1.0 early, and k >= d_vocab keeps every token.
"""
from __future__ import annotations

import torch

from graders.exercises.common.diagnosis import mismatched_sizes
from graders.exercises.nb08.reference import NEG_INF, apply_top_k, apply_top_p
from graders.exercises.nb08.transforms import TOP_TOKEN_REMOVED, VOCAB, logit_batch, transform_exercise
from graders.judging.cases import Case
from graders.judging.compare import Mistake
from graders.judging.tolerance import DECISION_MARGIN


# --- Exercise: top-k ------------------------------------------------------------------------------

TOP_K_FIX = ('k = min(k, logits.shape[-1]); kth_largest = logits.topk(k, dim=-1).values[..., -1:]; '
             'return logits.masked_fill(logits < kth_largest, float("-inf"))')

def _top_k_cases(case: Case):
    logits = logit_batch(case.seed + 30, max(case.batch, 3))
    k = 5
    # Row 0 has a tie at the k-th largest value: both tied tokens must stay.
    order = logits[0].argsort(descending=True)
    logits[0, order[k]] = logits[0, order[k - 1]]
    return [("k", (logits, k)), ("k1", (logits, 1)), ("kall", (logits, VOCAB)),
            ("kmore", (logits, VOCAB + 7))]


def top_k_mistakes(logits, k) -> dict:
    k = min(k, logits.shape[-1])
    ranked = logits.sort(dim=-1, descending=True, stable=True).indices

    def keep_first(n):
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, ranked[:, :max(n, 1)], True)
        return logits.masked_fill(~keep, NEG_INF)

    sorted_logits = logits.sort(dim=-1, descending=True).values
    unsorted_mask = sorted_logits < sorted_logits[:, k - 1:k]     # in sorted order
    return {
        Mistake("mask_in_sorted_order", "the mask was computed in sorted order and applied to the unsorted "
                "logits (it keeps the first k vocabulary ids): put the mask back in vocabulary order (scatter "
                "it with the sort's indices), or compare each logit with the k-th largest value"):
            logits.masked_fill(unsorted_mask, NEG_INF),
        Mistake("returned_sorted", "the logits are returned in sorted order (the sort is never undone): keep "
                "each logit at its token id"):
            sorted_logits.masked_fill(unsorted_mask, NEG_INF),
        Mistake("ties_broken", "ties at the k-th largest value are broken (torch.topk + scatter keeps exactly "
                "k): keep EVERY token whose logit is >= the k-th largest, so the result does not depend on the "
                "order of tied tokens"): keep_first(k),
        Mistake("one_too_few", "one token too few: the k-th largest must stay (remove only logits < the k-th "
                "value)"):
            logits.masked_fill(logits <= logits.topk(k, -1).values[..., -1:], NEG_INF)
            if k > 1 else keep_first(0),
        Mistake("one_too_many", "one token too many: keep the k largest, not k + 1"): keep_first(k + 1),
        Mistake("smallest_kept", "the k SMALLEST logits are kept: keep the largest"):
            logits.masked_fill(logits > (-logits).topk(k, -1).values[..., -1:].neg(), NEG_INF),
    }


def _top_k_crash(failure, logits, k) -> str:
    sizes = mismatched_sizes(failure)
    if sizes and set(sizes) == {logits.shape[0], logits.shape[1]}:
        return Mistake("kth_value_lost_dimension", "the k-th largest value lost its last dimension ([batch] "
                       "instead of [batch, 1]), so it cannot be compared with logits [batch, d_vocab]: keep "
                       "that dimension (index the last value with a slice, or look up keepdim).")
    if k > logits.shape[-1]:
        return Mistake("k_not_clamped", f"k = {k} is larger than the vocabulary ({logits.shape[-1]}) here, "
                       "which torch.topk (and indexing the k-th value) refuses; with k >= d_vocab every "
                       "token stays: clamp k to the vocabulary size first.")
    if k == logits.shape[-1]:   # the other cases ran: only k = d_vocab crashes
        return Mistake("index_past_kth", f"k equals the vocabulary size ({k}) here, and the code reaches one "
                       "value past the k-th largest (index k, or topk(k + 1)), which does not exist: the k-th "
                       "largest value is at index k - 1, and with k = d_vocab every token stays.")
    return ""


def _top_k_rule(logits, k):
    k = min(k, logits.shape[-1])

    def rule(row: int, kept: torch.Tensor) -> str:
        ranked = kept[logits[row].argsort(descending=True, stable=True)]
        n = int(kept.sum())
        if not bool(ranked[:n].all()):
            return Mistake("mask_in_sorted_order", "Likely mistake: the kept tokens are not the largest logits "
                           "(a smaller one is kept while a larger one is removed): a mask computed on sorted "
                           "logits must be put back in vocabulary order before it is applied.")
        kth = float(logits[row].topk(k).values[-1])
        if n == k and int((logits[row] >= kth).sum()) > k:
            return Mistake("ties_broken", "Likely mistake: ties at the k-th largest value are broken (exactly "
                           "k tokens kept): keep EVERY token whose logit is >= the k-th largest, so the result "
                           "does not depend on the order of tied tokens.")
        return (f"Your rule keeps the {n} largest logits; top-k keeps every token whose logit is "
                f">= the k-th largest ({kth:.4g}), here {int((logits[row] >= kth).sum())}.")
    return rule


top_k_exercise = transform_exercise(
    "apply_top_k", _top_k_cases, apply_top_k, top_k_mistakes,
    lambda logits, k: f"logits, k={k}" + (", the vocabulary size" if k == logits.shape[-1] else
                                          ", more than the vocabulary" if k > logits.shape[-1] else ""),
    hint="top-k keeps every token whose logit is at least the k-th largest of its row, ties included, and "
         "sets the others to -inf; k at least the vocabulary size keeps every token (look up torch.topk).",
    crash_cause=_top_k_crash, rule=_top_k_rule, fix=TOP_K_FIX)
check_top_k = top_k_exercise.checker(
    "Grade `apply_top_k(logits, k)` (includes a tie at the k-th value, k = 1, k = vocab and k > vocab).")


# --- Exercise: top-p ------------------------------------------------------------------------------

SHARP = 30.0
# The corrected lines of top-p (the notebook's names), and which a named mistake gets.
KEEP_ALL = "if top_p >= 1.0: return logits.clone()"
SORT = "sorted_logits, order = logits.sort(dim=-1, descending=True)"
MASS_BEFORE = "mass_before = probs.cumsum(dim=-1) - probs; remove_sorted = mass_before >= top_p"
KEEP_TOP = "remove_sorted[..., 0] = False"
UNSORT = ('remove = remove_sorted.scatter(-1, order, remove_sorted); '
          'return logits.masked_fill(remove, float("-inf"))')
FLOAT32_TOTAL = Mistake(
    "float32_total",
    "top_p = 1.0 must keep every token, but the running total of the probabilities, summed in "
    "float32, reaches 1.0 while tokens remain (the top token alone rounds to probability 1), "
    "so the rest were removed: return the logits unchanged when top_p >= 1, and sum the "
    "probabilities in float64 (.double())")
EACH_ABOVE_P = Mistake("each_prob_above_p", "each token's own probability is compared with top_p (a threshold on "
                       "each probability): top-p keeps the most likely tokens until their CUMULATIVE probability "
                       "reaches top_p")
EACH_ABOVE_1_MINUS_P = Mistake("each_prob_above_1_minus_p", "each token's own probability is compared with 1 - top_p "
                               "(a threshold on each probability): top-p keeps the most likely tokens until their "
                               "CUMULATIVE probability reaches top_p")
EACH_BELOW_P = Mistake("each_prob_below_p", "each token's own probability is compared with top_p, keeping the "
                       "UNLIKELY ones: top-p keeps the most likely tokens until their cumulative probability "
                       "reaches top_p")
MASK_IN_SORTED_ORDER = Mistake("mask_in_sorted_order", "the mask was computed in sorted order and applied to the "
                               "unsorted logits (it keeps the first vocabulary ids): put the mask back in "
                               "vocabulary order (scatter it with the sort's indices) before it is applied")
RETURNED_SORTED = Mistake("returned_sorted", "the logits are returned in sorted order (the sort is never undone): "
                          "keep each logit at its token id")
TOTAL_UNSORTED = Mistake("total_unsorted", "the cumulative probabilities are summed over the batch or in vocabulary "
                         "order, not in decreasing order of probability: sort descending first, then cumsum")
ONE_TOO_FEW = Mistake("one_too_few", "one token too few: the token that takes the total past top_p must be "
                      "kept too (keep a token while the probability BEFORE it is < top_p)")
ONE_TOO_MANY = Mistake("one_too_many", "one token too many: stop at the first token that brings the total to top_p")
ASCENDING = Mistake("ascending_sort", "the least likely tokens are kept (sorted in ascending order): sort descending")
TOP_P_FIXES = {
    FLOAT32_TOTAL: KEEP_ALL, EACH_ABOVE_P: MASS_BEFORE, EACH_ABOVE_1_MINUS_P: MASS_BEFORE,
    EACH_BELOW_P: MASS_BEFORE, MASK_IN_SORTED_ORDER: UNSORT, RETURNED_SORTED: UNSORT, TOTAL_UNSORTED: SORT,
    ONE_TOO_FEW: MASS_BEFORE, ONE_TOO_MANY: MASS_BEFORE, ASCENDING: SORT, TOP_TOKEN_REMOVED: KEEP_TOP,
}


def _clear_p(logits: torch.Tensor, candidates) -> float:
    """The first p in `candidates` at least DECISION_MARGIN (1e-3) away from every row's
    cumulative probabilities, so that the nucleus is decided far above fp32 rounding error
    (~1e-7)."""
    cumulative = logits.double().softmax(-1).sort(-1, descending=True).values.cumsum(-1)
    return next(p for p in candidates if bool(((cumulative - p).abs() > DECISION_MARGIN).all()))


def _top_p_cases(case: Case):
    batch = max(case.batch, 3)
    logits = logit_batch(case.seed + 40, batch)
    gentle = logit_batch(case.seed + 41, batch, scale=2.0)
    mid = _clear_p(logits, [0.5 + 0.013 * i for i in range(30)])
    high = _clear_p(logits, [0.9 + 0.003 * i for i in range(30)])
    return [("mid", (logits, mid)), ("high", (logits, high)),
            ("tiny", (logits, 1e-4)), ("one", (gentle, 1.0)), ("one_sharp", (sharp_logits(logits), 1.0))]


def sharp_logits(logits: torch.Tensor) -> torch.Tensor:
    """`logits` with each row's top token raised by SHARP: its probability is 1 - ~1e-12, which
    float32 rounds to 1.0, so a float32 running total reaches 1 while tokens remain."""
    return logits.scatter_add(-1, logits.argmax(-1, keepdim=True),
                              torch.full((logits.shape[0], 1), SHARP))


def _float32_total_keep(logits, p):
    """What the descending rule keeps when the running total is summed in float32."""
    sorted_logits, order = logits.float().sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    keep = (probs.cumsum(-1) - probs) < p
    keep[..., 0] = True
    return keep.scatter(-1, order, keep)


def top_p_mistakes(logits, p) -> dict:
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    cumulative = probs.cumsum(-1)

    def keep_sorted(keep):
        keep = keep.clone()
        keep[..., 0] |= True
        return logits.masked_fill(~keep.scatter(-1, order, keep), NEG_INF)

    in_sorted_slots = (cumulative - probs < p) | (torch.arange(logits.shape[-1]) == 0)
    plain = logits.softmax(-1)
    rounding = {} if p < 1.0 else {FLOAT32_TOTAL: logits.masked_fill(~_float32_total_keep(logits, p), NEG_INF)}
    return {**rounding,
        EACH_ABOVE_P: keep_any(logits, plain >= p),
        EACH_ABOVE_1_MINUS_P: keep_any(logits, plain > 1 - p),
        EACH_BELOW_P: keep_any(logits, plain < p),
        MASK_IN_SORTED_ORDER: logits.masked_fill(~in_sorted_slots, NEG_INF),
        RETURNED_SORTED: sorted_logits.masked_fill(~in_sorted_slots, NEG_INF),
        TOTAL_UNSORTED: keep_any(logits, plain.cumsum(-1) - plain < p),
        ONE_TOO_FEW: keep_sorted(cumulative < p),
        ONE_TOO_MANY: keep_sorted(((cumulative - probs) < p).roll(1, -1) | ((cumulative - probs) < p)),
        ASCENDING: logits.masked_fill(~ascending_keep(logits, p), NEG_INF),
    }


def keep_any(logits, keep):
    """`logits` with the tokens outside `keep` removed, the most likely one always kept."""
    keep = keep | (torch.arange(logits.shape[-1]) == logits.argmax(-1, keepdim=True))
    return logits.masked_fill(~keep, NEG_INF)


def _top_p_rule(logits, p):
    def rule(row: int, kept: torch.Tensor) -> str:
        probs = logits[row].double().softmax(-1)
        order = probs.argsort(descending=True, stable=True)
        n = int(kept.sum())
        if not bool(kept[order][:n].all()):
            return Mistake("mask_in_sorted_order", "Likely mistake: the kept tokens are not the most likely "
                           "ones (a less likely token is kept while a more likely one is removed): a mask "
                           "computed on sorted probabilities must be put back in vocabulary order before it is "
                           "applied.")
        cumulative = probs[order].cumsum(-1)
        need = int((cumulative - probs[order] < p).sum().clamp(min=1))
        return (f"Your rule keeps the {n} most likely tokens, total probability "
                f"{float(cumulative[n - 1]):.4f}; top-p keeps the fewest most likely tokens whose "
                f"total reaches top_p = {p:.4g}: {need}, total {float(cumulative[need - 1]):.4f}.")
    return rule


def ascending_keep(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=False, stable=True)
    probs = sorted_logits.softmax(-1)
    keep = (probs.cumsum(-1) - probs) < p
    return keep.scatter(-1, order, keep)


top_p_exercise = transform_exercise(
    "apply_top_p", _top_p_cases, apply_top_p, top_p_mistakes,
    lambda logits, p: f"logits, top_p={p:.4g}",
    hint="follow the notebook's steps: the probabilities sorted from the most likely, their running total "
         "(in float64), the tokens after the total reaches top_p removed but never the top one, the mask "
         "put back in vocabulary order; top_p = 1 keeps every token.",
    rule=_top_p_rule, fixes=TOP_P_FIXES)
check_top_p = top_p_exercise.checker(
    "Grade `apply_top_p(logits, top_p)` (includes top_p = 1.0, on gentle and on sharp logits, and a "
    "tiny top_p).")
