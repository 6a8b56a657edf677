"""Notebook 08's top-k and top-p graders (graders/exercises/nb08/filters.py): correct variants pass,
each catalogued mistake fails with its diagnosis."""
import pytest
import torch

from fix_last import fix_only_last
from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference
from graders.judging.compare import CheckFailed

from course_code import course_code_allowed
from catalog_helpers import fails_with, named_message
from catalog_08_shared import INF, passes


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


# --- top-k --------------------------------------------------------------------------------------

def _top_k_where(logits, k):
    k = min(k, logits.shape[-1])
    kth = torch.sort(logits, dim=-1, descending=True).values[:, k - 1:k]
    return torch.where(logits >= kth, logits, torch.full_like(logits, -INF))


def _top_k_large_negative(logits, k):
    k = min(k, logits.shape[-1])
    return logits.masked_fill(logits < logits.topk(k).values[:, [-1]], -1e9)


def _top_k_loop(logits, k):
    k = min(k, logits.shape[-1])
    out = logits.clone()
    for row in range(logits.shape[0]):
        kth = sorted(logits[row].tolist(), reverse=True)[k - 1]
        for token in range(logits.shape[1]):
            if logits[row, token] < kth:
                out[row, token] = -INF
    return out


def _top_k_kthvalue(logits, k):
    k = min(k, logits.shape[-1])
    kth = logits.kthvalue(logits.shape[-1] - k + 1, dim=-1, keepdim=True).values
    return logits.masked_fill(logits < kth, -INF)


@pytest.mark.parametrize("fn", [reference.apply_top_k, _top_k_where, _top_k_large_negative, _top_k_loop,
                                _top_k_kthvalue])
def test_top_k_correct_variants_pass(fn):
    passes(nb08.check_top_k, fn)


def _top_k_scatter(logits, k):
    k = min(k, logits.shape[-1])
    values, indices = logits.topk(k)
    return torch.full_like(logits, -INF).scatter(-1, indices, values)


def _top_k_probabilities(logits, k):
    k = min(k, logits.shape[-1])
    probs = logits.softmax(-1)
    return probs.masked_fill(logits < logits.topk(k).values[:, [-1]], 0.0)


def _top_k_no_keepdim(logits, k):                      # [batch] threshold: broadcasting fails
    return logits.masked_fill(logits < logits.topk(k).values[:, -1], -INF)


def _top_k_midpoint(logits, k):                        # right for k < d_vocab, crashes at k = d_vocab
    values = logits.sort(-1, descending=True).values
    return logits.masked_fill(logits < (values[:, k - 1] + values[:, k])[:, None] / 2, -INF)


def _top_k_sorted_mask_unscattered(logits, k):
    k = min(k, logits.shape[-1])
    sorted_logits, _ = logits.sort(-1, descending=True)
    return logits.masked_fill(sorted_logits < sorted_logits[:, k - 1:k], -INF)


def _top_k_returns_sorted(logits, k):
    k = min(k, logits.shape[-1])
    sorted_logits = torch.sort(logits, dim=-1, descending=True).values
    return sorted_logits.masked_fill(sorted_logits < sorted_logits[:, k - 1:k], -INF)


def _top_k_drops_ties_loop(logits, k):
    out = torch.full_like(logits, -INF)
    for row in range(logits.shape[0]):
        for token in logits[row].argsort(descending=True)[:k].tolist():
            out[row, token] = logits[row, token]
    return out


def _solution_function(grade_id: str, name: str):
    """The solution notebook's own answer cell, run on its own."""
    from jaxtyping import Float, Int
    from torch import Tensor

    from graders.course.example_class import solution_answers

    namespace = {"torch": torch, "Tensor": Tensor, "Float": Float, "Int": Int}
    exec(compile(solution_answers("08_sampling")[grade_id], grade_id, "exec"), namespace)
    return namespace[name]


def _hf_kept(warper, logits):
    return torch.isfinite(warper(None, logits.clone()))


@pytest.mark.parametrize("scale, spike", [(1.0, 0.0), (3.0, 0.0), (8.0, 0.0), (3.0, 30.0)])
def test_the_solutions_filters_agree_with_hugging_face(scale, spike):
    """apply_top_p and apply_top_k of solutions/08 keep exactly the tokens transformers'
    TopPLogitsWarper / TopKLogitsWarper keep (float64 logits for the warper, so that its own
    running total is exact), on 400 rows, p = 1.0 and k >= vocabulary included."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    top_p, top_k = _solution_function("top_p_answer", "apply_top_p"), _solution_function("top_k_answer", "apply_top_k")
    generator = torch.Generator().manual_seed(int(10 * scale + spike))
    logits = scale * torch.randn(400, 1000, generator=generator)
    logits[torch.arange(400), logits.argmax(-1)] += spike
    ps = torch.rand(400, generator=generator).tolist()
    for row, p in enumerate(ps + [1.0]):
        row %= 400
        mine = torch.isfinite(top_p(logits[row:row + 1], p))
        assert torch.equal(mine, _hf_kept(TopPLogitsWarper(p), logits[row:row + 1].double())), (row, p)
    for k in (1, 7, 999, 1000, 1500):
        assert torch.equal(torch.isfinite(top_k(logits, k)), _hf_kept(TopKLogitsWarper(k), logits)), k


def test_top_k_without_clamping_k_is_named():
    fails_with(nb08.check_top_k, lambda l, k: l.masked_fill(l < l.topk(k).values[..., -1:], -INF),
               expected=("apply_top_k crashed on apply_top_k(logits, k=57, more than the vocabulary)",
                         "Likely mistake: k = 57 is larger than the vocabulary (50)"), first_line=True)


@pytest.mark.parametrize("fn, message", [
    (_top_k_scatter, "Likely mistake: ties at the k-th largest value are broken"),
    (_top_k_drops_ties_loop, "Likely mistake: ties at the k-th largest value are broken"),
    (_top_k_no_keepdim, "Likely mistake: the k-th largest value lost its last dimension"),
    (_top_k_midpoint, "Likely mistake: k equals the vocabulary size (50) here"),
    (_top_k_sorted_mask_unscattered, "Likely mistake: the mask was computed in sorted order"),
    (_top_k_returns_sorted, "Likely mistake: the logits are returned in sorted order"),
    (lambda l, k: l.masked_fill(l <= l.topk(min(k, l.shape[-1])).values[:, [-1]], -INF),
     "one token too few"),
    (lambda l, k: l.masked_fill(l < l.topk(min(k + 1, l.shape[-1])).values[:, [-1]], -INF),
     "Likely mistake: one token too many"),
    (lambda l, k: l.masked_fill(l > (-l).topk(min(k, l.shape[-1])).values[:, [-1]].neg(), -INF),
     "Likely mistake: the k SMALLEST logits are kept"),
    (_top_k_probabilities, "looks like probabilities"),
])
def test_top_k_mistakes_fail(fn, message):
    fails_with(nb08.check_top_k, fn, expected=message, first_line=True)


def test_a_named_top_k_mistake_ends_with_the_solutions_lines():
    message = named_message(nb08.check_top_k, _top_k_scatter)
    assert message.endswith(f"\n  Show the fix: {filters.TOP_K_FIX}"), message


def test_a_top_k_crash_of_a_known_cause_ends_with_the_solutions_lines():
    with pytest.raises(CheckFailed) as failure:
        nb08.check_top_k(_top_k_no_keepdim)
    assert fix_only_last(str(failure.value)).endswith(f"\n  Show the fix: {filters.TOP_K_FIX}"), str(failure.value)


# --- top-p --------------------------------------------------------------------------------------

def _top_p_ascending_hf_style(logits, p):
    sorted_logits, order = logits.sort(dim=-1)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= 1 - p
    remove[:, -1] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), -1e9)


def _top_p_loop(logits, p):
    if p >= 1.0:
        return logits.clone()
    out = torch.full_like(logits, -INF)
    for row in range(logits.shape[0]):
        probs = logits[row].softmax(-1)
        total = 0.0
        for token in probs.argsort(descending=True).tolist():
            out[row, token] = logits[row, token]
            total += probs[token].item()
            if total >= p:
                break
    return out


@pytest.mark.parametrize("fn", [reference.apply_top_p, _top_p_ascending_hf_style, _top_p_loop])
def test_top_p_correct_variants_pass(fn):
    passes(nb08.check_top_p, fn)


def _top_p(logits, p, keep_rule, force_first=True):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    keep = keep_rule(probs.cumsum(-1), probs, p)
    if force_first:
        keep[:, 0] = True
    return logits.masked_fill(~keep.scatter(-1, order, keep), -INF)


def _top_p_unscattered(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    keep = probs.cumsum(-1) - probs < p
    keep[:, 0] = True
    return logits.masked_fill(~keep, -INF)          # sorted-order mask on unsorted logits


def _top_p_returns_sorted(logits, p):
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    keep = probs.cumsum(-1) - probs < p
    keep[:, 0] = True
    return sorted_logits.masked_fill(~keep, -INF)


def _top_p_threshold_each(logits, p):
    probs = logits.softmax(-1)
    keep = probs >= p
    keep |= probs == probs.max(-1, keepdim=True).values
    return logits.masked_fill(~keep, -INF)


def _top_p_threshold_loop(logits, p):
    out = logits.clone()
    for row in range(logits.shape[0]):
        probs = logits[row].softmax(-1)
        for token in range(logits.shape[1]):
            if probs[token] <= 1 - p and token != int(probs.argmax()):
                out[row, token] = -INF
    return out


def _top_p_vocabulary_order(logits, p):
    probs = logits.softmax(-1)
    keep = probs.cumsum(-1) - probs < p
    keep |= probs == probs.max(-1, keepdim=True).values
    return torch.where(keep, logits, torch.full_like(logits, -INF))


@pytest.mark.parametrize("fn, message", [
    (lambda l, p: _top_p(l, p, lambda c, q, p: c < p), "Likely mistake: one token too few"),
    (_top_p_unscattered, "Likely mistake: the mask was computed in sorted order"),
    (_top_p_returns_sorted, "Likely mistake: the logits are returned in sorted order"),
    (_top_p_threshold_each, "Likely mistake: each token's own probability is compared with top_p"),
    (_top_p_threshold_loop, "Likely mistake: each token's own probability is compared with"),
    (_top_p_vocabulary_order, "Likely mistake: the cumulative probabilities are summed"),
    (lambda l, p: _top_p(l, p, lambda c, q, p: (c - q - q.roll(1, -1) < p)), "Likely mistake: one token too many"),
    (lambda l, p: _top_p(l, p, lambda c, q, p: c - q < p, force_first=False)
     if p > 1e-3 else l.masked_fill(torch.ones_like(l, dtype=torch.bool), -INF),
     "Likely mistake: the most likely token is not forced to stay"),
    (lambda l, p: _top_p(l, p, lambda c, q, p: c <= p, force_first=False).nan_to_num(neginf=-INF)
     if p > 1e-3 else _top_p(l, p, lambda c, q, p: c - q < p), "Likely mistake: one token too few"),
    (lambda l, p: l.masked_fill(~nb08.ascending_keep(l, p), -INF),
     "Likely mistake: the least likely tokens are kept"),
])
def test_top_p_mistakes_fail(fn, message):
    fails_with(nb08.check_top_p, fn, expected=message, first_line=True)


@pytest.mark.parametrize("fn, fix", [
    (lambda l, p: _top_p(l, p, lambda c, q, p: c < p), filters.MASS_BEFORE),
    (_top_p_unscattered, filters.UNSORT),
    (lambda l, p: l.masked_fill(~nb08.ascending_keep(l, p), -INF), filters.SORT),
])
def test_a_named_top_p_mistake_ends_with_the_line_it_corrects(fn, fix):
    assert named_message(nb08.check_top_p, fn).endswith(f"\n  Show the fix: {fix}")
