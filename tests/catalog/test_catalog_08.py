"""Notebook 08's graders: correct variants pass, each catalogued mistake fails with its diagnosis."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from fix_last import fix_only_last
from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference
from graders.judging.compare import CheckFailed

from course_code import course_code_allowed
from catalog_helpers import fails_with, named_message

INF = float("inf")
# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


HIDDEN = {"seed": 5, "batch": 3}


def passes(check, fn):
    check(fn)
    check(fn, **HIDDEN)


# --- greedy -------------------------------------------------------------------------------------

def _greedy_loop(logits):
    return torch.tensor([max(range(len(row)), key=lambda t: row[t]) for row in logits.tolist()])


@pytest.mark.parametrize("fn", [lambda l: l.argmax(-1), lambda l: l.max(dim=-1).indices,
                                lambda l: l.topk(1, dim=-1).indices[:, 0], _greedy_loop])
def test_greedy_correct_variants_pass(fn):
    passes(nb08.check_greedy, fn)


@pytest.mark.parametrize("fn, message", [
    (lambda l: l.argmin(-1), "argmin instead of argmax"),
    (lambda l: l.argmax(0)[: l.shape[0]] if l.shape[0] > 1 else l.argmax(0),
     "Likely mistake: argmax over the batch dimension"),
    (lambda l: l.argmax(0), "Likely mistake: argmax over the batch dimension (dim=0)"),
    (lambda l: torch.max(l, 0).indices, "Likely mistake: argmax over the batch dimension (dim=0)"),
    (lambda l: l.argmax(-1, keepdim=True), "Likely mistake: keepdim=True"),
    (lambda l: l.topk(1).indices, "Likely mistake: keepdim=True (or topk's [batch, 1] indices)"),
    (lambda l: l.argmax(), "Likely mistake: argmax without dim"),
    (lambda l: l.max(-1).values, "return token ids (torch.long): the index of the largest logit"),
])
def test_greedy_mistakes_fail(fn, message):
    fails_with(nb08.check_greedy, fn, expected=message, first_line=True)


# --- temperature --------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda l, t: l / t, lambda l, t: l * (1.0 / t),
                                lambda l, t: torch.div(l, t) - l.max()])
def test_temperature_correct_variants_pass(fn):
    passes(nb08.check_temperature, fn)


def _in_place_temperature(l, t):
    l /= t
    return l


@pytest.mark.parametrize("fn, message", [
    (lambda l, t: l * t, "Likely mistake: multiplying by the temperature"),
    (lambda l, t: l.softmax(-1) / t, "Likely mistake: temperature applied after softmax"),
    (lambda l, t: l - t, "Likely mistake: the temperature is subtracted"),
    (_in_place_temperature, "in place"),
    (lambda l, t: (l / t).softmax(-1), "looks like probabilities"),
])
def test_temperature_mistakes_fail(fn, message):
    fails_with(nb08.check_temperature, fn, expected=message, first_line=True)


def test_a_named_temperature_mistake_ends_with_the_division():
    message = named_message(nb08.check_temperature, lambda l, t: l * t)
    assert message.endswith("\n  Show the fix: return logits / temperature"), message


# --- frequency penalty --------------------------------------------------------------------------

def _penalty_bincount(ids, logits, a):
    counts = torch.stack([torch.bincount(row, minlength=logits.shape[-1]) for row in ids])
    return logits - a * counts


def _penalty_one_hot(ids, logits, a):
    return logits - a * F.one_hot(ids, logits.shape[-1]).sum(1).float()


def _penalty_loop(ids, logits, a):
    out = logits.clone()
    for row in range(ids.shape[0]):
        for token in ids[row].tolist():
            out[row, token] -= a
    return out


@pytest.mark.parametrize("fn", [reference.apply_frequency_penalty, _penalty_bincount, _penalty_one_hot,
                                _penalty_loop])
def test_penalty_correct_variants_pass(fn):
    passes(nb08.check_frequency_penalty, fn)


def _presence(ids, logits, a):
    return logits - a * (F.one_hot(ids, logits.shape[-1]).sum(1) > 0).float()


def _whole_batch(ids, logits, a):
    return logits - a * torch.bincount(ids.flatten(), minlength=logits.shape[-1])


def _presence_loop(ids, logits, a):
    out = logits.clone()
    for row in range(ids.shape[0]):
        for token in set(ids[row].tolist()):
            out[row, token] -= a
    return out


def _penalty_in_place(ids, logits, a):
    logits -= a * F.one_hot(ids, logits.shape[-1]).sum(1)
    return logits


@pytest.mark.parametrize("fn, message", [
    (_presence, "Likely mistake: each token seen is penalised once"),
    (_whole_batch, "Likely mistake: tokens are counted over the whole batch"),
    (lambda ids, l, a: l + a * F.one_hot(ids, l.shape[-1]).sum(1), "Likely mistake: the penalty is added"),
    (lambda ids, l, a: l / (1 + a * F.one_hot(ids, l.shape[-1]).sum(1)), "Likely mistake: the logits are divided"),
    (_penalty_in_place, "in place"),
    (lambda ids, l, a: l - a * F.one_hot(ids[:, -1], l.shape[-1]),
     "Likely mistake: only the last token of each row is penalised"),
    (_presence_loop, "Likely mistake: each token seen is penalised once"),
    (lambda ids, l, a: l - a * (torch.bincount(ids.flatten(), minlength=l.shape[-1]) > 0),
     "a presence penalty over the whole batch"),
])
def test_penalty_mistakes_fail(fn, message):
    fails_with(nb08.check_frequency_penalty, fn, expected=message, first_line=True)


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


# --- the basic sampler -------------------------------------------------------------------------

def _gumbel_max(logits, generator):
    u = torch.rand(logits.shape, generator=generator)
    return (logits - (-u.log()).log()).argmax(-1)


def _inverse_cdf(logits, generator):
    cdf = logits.softmax(-1).cumsum(-1)
    u = torch.rand(logits.shape[0], 1, generator=generator)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=logits.shape[-1] - 1)[:, 0]


@pytest.mark.parametrize("fn", [reference.sample_basic, _gumbel_max, _inverse_cdf])
def test_sampler_correct_variants_pass(fn):
    passes(nb08.check_sampler, fn)


def _sampler_global_seed(logits, generator):
    torch.manual_seed(generator.initial_seed())
    return torch.multinomial(logits.softmax(-1), 1)[:, 0]


def _sampler_loop_argmax(logits, generator):
    return torch.tensor([int(row.argmax()) for row in logits])


@pytest.mark.parametrize("fn, message", [
    (lambda l, g: l.argmax(-1), "sample_basic always takes the most likely token (argmax)"),
    (_sampler_loop_argmax, "sample_basic always takes the most likely token (argmax)"),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1)[:, 0],
     "sample_basic draws from torch's global random generator, not from the generator it is given"),
    (_sampler_global_seed, "used or reseeded torch's global random generator"),
    (lambda l, g: torch.multinomial(l.softmax(0), 1, generator=g)[:, 0],
     "Likely mistake: softmax over the batch dimension"),
    (lambda l, g: torch.multinomial(F.softmax(l, dim=0), 1, generator=g).squeeze(-1),
     "Likely mistake: softmax over the batch dimension"),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1, generator=g),
     "Likely mistake: the [batch, 1] result of torch.multinomial"),
    (lambda l, g: torch.multinomial((l > -INF).float(), 1, generator=g)[:, 0],
     "Likely mistake: sampling uniformly"),
    (lambda l, g: torch.multinomial(l.softmax(-1).softmax(-1) * (l > -INF), 1, generator=g)[:, 0],
     "Likely mistake: the softmax is taken twice"),
    (lambda l, g: torch.multinomial((2 * l).softmax(-1), 1, generator=g)[:, 0],
     "Likely mistake: the logits are doubled"),
    (lambda l, g: torch.multinomial(torch.ones_like(l), 1, generator=g)[:, 0],
     ("probability 0", "Likely mistake: the logits are ignored")),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1, generator=torch.Generator().manual_seed(0))[:, 0],
     ("sample_basic ignores the generator's seed", "a generator of its own with a fixed seed")),
])
def test_sampler_mistakes_fail(fn, message):
    fails_with(nb08.check_sampler, fn, expected=message, first_line=True)


# --- sample_next_token ------------------------------------------------------------------------

def _pipeline(order="ptkq", zero="greedy", temper="divide"):
    """sample_next_token with its steps in `order`: p(enalty), t(emperature), k, q (top-p).
    `zero`: "greedy" (argmax of the penalised logits), "raw" (argmax of the raw logits, the
    penalty forgotten), "divide" (no special case: divides by 0)."""
    def sample(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
        if temperature == 0.0 and zero == "greedy":
            return reference.apply_frequency_penalty(input_ids, logits, freq_penalty).argmax(-1)
        if temperature == 0.0 and zero == "raw":
            return logits.argmax(-1)
        steps = {"p": lambda l: reference.apply_frequency_penalty(input_ids, l, freq_penalty),
                 "t": lambda l: l / temperature if temper == "divide" else l * temperature,
                 "k": lambda l: reference.apply_top_k(l, top_k) if top_k else l,
                 "q": lambda l: reference.apply_top_p(l, top_p) if top_p < 1 else l}
        for step in order:
            logits = steps[step](logits)
        return reference.sample_basic(logits, generator)
    return sample


def _pipeline_gumbel(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
    logits = reference.next_token_logits(input_ids, logits, max(temperature, 1e-8), top_k, top_p, freq_penalty)
    return _gumbel_max(logits, generator)


def _pipeline_greedy_first_loop(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0,
                                freq_penalty=0.0):
    """Correct, written with a per-row loop for the penalty and greedy_search at temperature 0."""
    logits = logits.clone()
    for row in range(input_ids.shape[0]):
        for token in input_ids[row].tolist():
            logits[row, token] -= freq_penalty
    if temperature == 0:
        return reference.greedy_search(logits)
    return reference.sample_next_token(input_ids, logits, generator, temperature, top_k, top_p, 0.0)


def _pipeline_zero_before_penalty(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0,
                                  freq_penalty=0.0):
    if temperature == 0:                 # greedy on the raw logits: the penalty is forgotten
        return reference.greedy_search(logits)
    return reference.sample_next_token(input_ids, logits, generator, temperature, top_k, top_p, freq_penalty)


@pytest.mark.parametrize("fn", [reference.sample_next_token, _pipeline(), _pipeline_gumbel,
                                _pipeline_greedy_first_loop])
def test_pipeline_correct_variants_pass(fn):
    passes(nb08.check_sample_next_token, fn)


@pytest.mark.parametrize("fn, message", [
    (_pipeline("pkqt"), "Likely mistake: the temperature is applied after top-k/top-p"),
    (_pipeline("tpkq"), "Likely mistake: the frequency penalty is applied after the temperature"),
    (_pipeline("tkq"), "Likely mistake: the frequency penalty is ignored"),
    (_pipeline("pkq"), "Likely mistake: the temperature is ignored"),
    (_pipeline("ptq"), "Likely mistake: top_k is ignored"),
    (_pipeline("ptk"), "Likely mistake: top_p is ignored"),
    (_pipeline(zero="divide"), "temperature 0 means greedy decoding"),
    (_pipeline(temper="multiply"), "Likely mistake: the temperature multiplies the logits instead of dividing"),
    (_pipeline(zero="raw"), "Likely mistake: at temperature 0 the frequency penalty is ignored"),
    (_pipeline_zero_before_penalty, "Likely mistake: at temperature 0 the frequency penalty is ignored"),
])
def test_pipeline_mistakes_fail(fn, message):
    fails_with(nb08.check_sample_next_token, fn, expected=message, first_line=True)


# --- generate ----------------------------------------------------------------------------------

def _generate(crop=True, position=-1, pass_sampling=True, stop="per-row", pad=None, new_only=False,
              crop_to=None):
    """`generate` with a mistake switched on. `stop`: "per-row" (right), "any" (stops when one
    row ends), "all-same-step" (the old rule: every row must sample end-of-text at once),
    "never", "before" (drops the end-of-text token), "unpadded" (finished rows keep sampling).
    `crop_to`: a literal context length in place of model.cfg.n_ctx."""
    def generate(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
        tokens = input_ids
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        for _ in range(max_new_tokens):
            context = tokens[:, -(crop_to or model.cfg.n_ctx):] if crop else tokens
            logits = model(context)[:, position]
            new = reference.sample_next_token(tokens, logits, generator, **(sampling if pass_sampling else {}))
            if eos_token_id is None or stop == "never":
                tokens = torch.cat([tokens, new[:, None]], dim=-1)
                continue
            if stop == "before" and bool((new == eos_token_id).all()):
                break
            if stop in ("per-row", "any"):
                new = new.masked_fill(finished, eos_token_id if pad is None else pad)
            finished = finished | (new == eos_token_id)
            tokens = torch.cat([tokens, new[:, None]], dim=-1)
            done = {"per-row": finished.all(), "unpadded": finished.all(), "any": finished.any(),
                    "all-same-step": (new == eos_token_id).all(), "before": (new == eos_token_id).all()}[stop]
            if bool(done):
                break
        return tokens[:, input_ids.shape[1]:] if new_only else tokens
    return generate


def _generate_cropping_first(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    tokens = input_ids
    for _ in range(max_new_tokens):
        new = reference.sample_next_token(tokens, model(tokens[:, :model.cfg.n_ctx])[:, -1], generator, **sampling)
        tokens = torch.cat([tokens, new[:, None]], dim=-1)
        if eos_token_id is not None and bool((new == eos_token_id).all()):
            break
    return tokens


def _generate_row_by_row(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    """Correct: each row generated alone until it ends, then the rows padded with end-of-text."""
    rows = []
    for row in input_ids:
        tokens = row[None]
        for _ in range(max_new_tokens):
            logits = model(tokens[:, -model.cfg.n_ctx:])[:, -1]
            new = reference.sample_next_token(tokens, logits, generator, **sampling)
            tokens = torch.cat([tokens, new[:, None]], dim=-1)
            if eos_token_id is not None and int(new) == eos_token_id:
                break
        rows.append(tokens[0])
    width = max(len(r) for r in rows)
    pad = eos_token_id if eos_token_id is not None else 0
    return torch.stack([torch.cat([r, torch.full((width - len(r),), pad)]) for r in rows])


def _generate_sampler_crash(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    tokens = input_ids
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -model.cfg.n_ctx:])          # every position: the sampler crashes
        new = reference.sample_next_token(tokens, logits, generator, **sampling)
        tokens = torch.cat([tokens, new[:, None]], dim=-1)
    return tokens


@pytest.mark.parametrize("fn", [reference.generate, _generate(), _generate_row_by_row])
def test_generate_correct_variants_pass(fn):
    passes(nb08.check_generate, fn)


@pytest.mark.parametrize("fn, message", [
    (_generate(crop=False), "Likely mistake: it runs for 10 new tokens (prompt + new = n_ctx) and crashes beyond"),
    (_generate_cropping_first, "Likely mistake: the context is cropped to the FIRST n_ctx tokens"),
    (_generate(position=0), "Likely mistake: the next token must come from the logits of the LAST position"),
    (_generate(pass_sampling=False), "Likely mistake: the sampling settings do not reach sample_next_token"),
    (_generate(new_only=True), "Likely mistake: only the new tokens are returned"),
    (_generate(stop="never"), "Likely mistake: generation never stops at end-of-text"),
    (_generate(stop="before"), "Likely mistake: the end-of-text token itself is dropped"),
    (_generate(stop="any"), "Likely mistake: generation stopped as soon as one row reached end-of-text"),
    (_generate(stop="all-same-step"), "Likely mistake: generation went on to max_new_tokens"),
    (_generate(stop="unpadded"), "Likely mistake: row 1 kept generating after its end-of-text token"),
    (_generate(pad=0), "Likely mistake: finished rows are padded with 0"),
])
def test_generate_mistakes_fail(fn, message):
    fails_with(nb08.check_generate, fn, expected=message, first_line=True)


def test_generate_rows_ending_at_different_steps_hidden_case():
    """The hidden case has three rows, ending after 4, 2 and 3 new tokens."""
    fails_with(nb08.check_generate, _generate(stop="any"), expected="after 4, 2, 3 new tokens", first_line=True,
               seed=18, batch=3)
    nb08.check_generate(reference.generate, seed=18, batch=3)


OTHER_N_CTX = dict(seed=11, n_ctx=20)   # the visible check's model has n_ctx 16


@pytest.mark.parametrize("fn", [reference.generate, _generate(), _generate_row_by_row])
def test_generate_correct_variants_crop_to_the_models_n_ctx(fn):
    nb08.check_generate(fn, **OTHER_N_CTX)


def test_a_crop_to_the_visible_models_n_ctx_is_named():
    nb08.check_generate(_generate(crop_to=16))   # the visible check's n_ctx: it passes
    fails_with(nb08.check_generate, _generate(crop_to=16),
               expected="(the model's n_ctx is 20, the prompt has 6 tokens). Likely mistake: the context is "
                        "cropped to a literal 16 tokens, not to the model's n_ctx (20 here)",
               first_line=True, **OTHER_N_CTX)


@pytest.mark.parametrize("limit", [64, 1024])   # the notebook-07 model's n_ctx, GPT-2's
def test_a_crop_to_a_literal_longer_than_the_context_is_named(limit):
    fails_with(nb08.check_generate, _generate(crop_to=limit),
               expected="(the model's n_ctx is 16). Likely mistake: the context is cropped to a literal "
                        f"{limit} tokens, not to the model's n_ctx (16 here)", first_line=True)
    fails_with(nb08.check_generate, _generate(crop_to=limit),
               expected="(the model's n_ctx is 20). Likely mistake: the context is cropped to a literal "
                        f"{limit} tokens, not to the model's n_ctx (20 here)", first_line=True, **OTHER_N_CTX)


def test_the_notebook_grades_generate_on_that_model():
    """The case above is the one the notebook's hidden check runs."""
    from graders.harness.manifest import notebook_checks

    graded = [fields for _, fields in notebook_checks("08_sampling")["generate_test"]]
    assert dataclasses.asdict(nb08.check_generate.exercise.case(**OTHER_N_CTX)) in graded


def test_a_crash_in_the_sampler_is_not_blamed_on_cropping():
    with pytest.raises(CheckFailed) as failure:
        nb08.check_generate(_generate_sampler_crash)
    message = str(failure.value)
    assert message.startswith("generate crashed on a prompt of shape [2, 6], max_new_tokens=20"), message
    assert "crop" not in message, message
    # The learner's own exception stays attached, so that their frames are shown with the message.
    assert isinstance(failure.value.__cause__, RuntimeError), repr(failure.value.__cause__)


def test_generate_ignoring_top_k_is_caught():
    def ignores_top_k(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
        sampling.pop("top_k", None)
        return reference.generate(model, input_ids, max_new_tokens, generator, eos_token_id, **sampling)
    fails_with(nb08.check_generate, ignores_top_k,
               expected=("is not among the 5 most likely", "Likely mistake: the sampling settings (top_k"),
               first_line=True)


def test_reference_generate_pads_finished_rows_with_end_of_text():
    chain = nb08.markov_model(71, 10)
    chain.table[:, 7] = -5.0
    for a, b in ((2, 5), (5, 8), (8, 3), (3, 7)):
        chain.table[a, b] = 10.0
    out = reference.generate(chain, torch.tensor([[1, 2], [1, 8]]), 40, None, eos_token_id=7, temperature=0.0)
    assert out.tolist() == [[1, 2, 5, 8, 3, 7], [1, 8, 3, 7, 7, 7]]


# --- beam search -------------------------------------------------------------------------------

def _beam_loop(model, input_ids, num_beams, max_new_tokens):
    """Beam search written with Python lists, in float32."""
    beams = [(input_ids[0].tolist(), 0.0)]
    for _ in range(max_new_tokens):
        candidates = []
        for tokens, score in beams:
            log_probs = model(torch.tensor([tokens]))[0, -1].log_softmax(-1)
            candidates += [(tokens + [t], score + float(lp)) for t, lp in enumerate(log_probs)]
        beams = sorted(candidates, key=lambda c: -c[1])[:num_beams]
    return torch.tensor([t for t, _ in beams]), torch.tensor([s for _, s in beams])


@pytest.mark.parametrize("fn", [reference.beam_search, _beam_loop])
def test_beam_search_correct_variants_pass(fn):
    passes(nb08.check_beam_search, fn)


def _beam(score_update="sum", rank_by_last=False, reverse=False, probabilities=False):
    def search(model, input_ids, num_beams, max_new_tokens):
        beams, scores = input_ids, torch.zeros(1)
        for _ in range(max_new_tokens):
            logits = model(beams)[:, -1]
            step = logits.softmax(-1) if probabilities else logits.log_softmax(-1)
            if rank_by_last:    # choose by this step's log-prob, but report the sums
                total = (scores[:, None] + step).flatten()
                _, best = step.flatten().topk(min(num_beams, step.numel()))
                scores = total[best]
                beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
                continue
            cand = (step + (scores[:, None] if score_update == "sum" else 0)).flatten()
            scores, best = cand.topk(min(num_beams, len(cand)))
            beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
        if reverse:
            return beams.flip(0), scores.flip(0)
        return beams, scores
    return search


def _beam_best_child(model, input_ids, num_beams, max_new_tokens):
    """Each beam extended by its own best token only (a single beam, from a single prompt)."""
    beams, scores = input_ids, torch.zeros(1)
    for _ in range(max_new_tokens):
        best, token = model(beams)[:, -1].log_softmax(-1).max(-1)
        beams, scores = torch.cat([beams, token[:, None]], -1), scores + best
    return beams, scores


def _beam_best_child_after_first_loop(model, input_ids, num_beams, max_new_tokens):
    """The first step keeps the num_beams best tokens; then each beam keeps only its best child."""
    first = model(input_ids)[0, -1].log_softmax(-1)
    top = first.topk(min(num_beams, first.numel()))
    beams = [(input_ids[0].tolist() + [t], float(s)) for s, t in zip(top.values, top.indices.tolist())]
    for _ in range(max_new_tokens - 1):
        extended = []
        for tokens, score in beams:
            log_probs = model(torch.tensor([tokens]))[0, -1].log_softmax(-1)
            extended.append((tokens + [int(log_probs.argmax())], score + float(log_probs.max())))
        beams = sorted(extended, key=lambda b: -b[1])
    return torch.tensor([t for t, _ in beams]), torch.tensor([s for _, s in beams])


def _beam_from_copies(model, input_ids, num_beams, max_new_tokens):
    """Starts from num_beams copies of the prompt, each scored 0: the first step's candidates
    come num_beams times each, and so do the beams kept."""
    beams, scores = input_ids.repeat(num_beams, 1), torch.zeros(num_beams)
    for _ in range(max_new_tokens):
        step = model(beams)[:, -1].log_softmax(-1)
        scores, best = (scores[:, None] + step).flatten().topk(num_beams)
        beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
    return beams, scores


def _beam_two_children(model, input_ids, num_beams, max_new_tokens):
    """Each beam offers only its two best children, so the beams double at each step at most."""
    beams, scores = input_ids, torch.zeros(1)
    for _ in range(max_new_tokens):
        top, token = model(beams)[:, -1].log_softmax(-1).topk(2, dim=-1)
        scores, best = (scores[:, None] + top).flatten().topk(min(num_beams, top.numel()))
        beams = torch.cat([beams[best // 2], token.flatten()[best][:, None]], -1)
    return beams, scores


def _beam_no_repeat(model, input_ids, num_beams, max_new_tokens):
    """Never extends a beam by its own last token: true scores, the right shape, other beams."""
    beams, scores = input_ids, torch.zeros(1)
    for _ in range(max_new_tokens):
        step = model(beams)[:, -1].log_softmax(-1).scatter(-1, beams[:, -1:], -INF)
        cand = (scores[:, None] + step).flatten()
        scores, best = cand.topk(min(num_beams, int(cand.isfinite().sum())))
        beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
    return beams, scores


@pytest.mark.parametrize("fn, message", [
    (_beam_from_copies, "(some beams are the same sequence). Likely mistake: the search starts from "
                        "num_beams copies of the prompt"),
    (_beam_two_children, "Likely mistake: each beam keeps only a few of its best children"),
    (_beam(score_update="last"), "Likely mistake: the scores are not accumulated"),
    (_beam(probabilities=True), "Likely mistake: the scores add probabilities"),
    (_beam(reverse=True), "the right beams, but return them best first"),
    (_beam(rank_by_last=True), "Likely mistake: the candidates are ranked by the new token's log-probability alone"),
    (_beam_best_child, "Likely mistake: only the best continuation is kept"),
    (_beam_best_child_after_first_loop, "Likely mistake: each beam keeps only its best child"),
    (lambda m, i, n, k: (reference.beam_search(m, i, n, k)[0], reference.beam_search(m, i, n, k)[1] / (i.shape[1] + k)),
     "Likely mistake: the score is divided by the length"),
    (lambda m, i, n, k: (reference.beam_search(m, i, n, k)[0],
                         reference.beam_search(m, i, n, k)[1] + m(i).log_softmax(-1)[0, 0, i[0, 1]]),
     "Likely mistake: the prompt's own log-probability is added to the score"),
    (lambda m, i, n, k: reference.beam_search(m, i, n, k)[0], "must return a pair"),
    (lambda m, i, n, k: (reference.beam_search(m, i, n, k)[0][:, i.shape[1]:], reference.beam_search(m, i, n, k)[1]),
     "Likely mistake: only the new tokens are returned"),
])
def test_beam_search_mistakes_fail(fn, message):
    fails_with(nb08.check_beam_search, fn, expected=message, first_line=True)


def test_beams_that_differ_unnamed_are_shown_side_by_side():
    """A search the catalog cannot name gets the first differing beam, expected and got, with
    their scores: the best scores alone can agree and read as a contradiction."""
    with pytest.raises(CheckFailed) as failure:
        nb08.check_beam_search(_beam_no_repeat)
    message = str(failure.value)
    assert "Likely mistake" not in message, message
    first = message.split("First difference in beam ")[1]
    expected, got = first.split("expected ")[1].split(" with ")[0], first.split("got ")[1].split(" with ")[0]
    assert expected.startswith("[") and got.startswith("[") and expected != got, message


# --- the KV cache ------------------------------------------------------------------------------

def _forward_dict_cache(model, new_tokens, cache, mask_new_tokens=True, new_first=False):
    """A correct variant: the cache as a dict of per-layer lists, matmul-based attention (with
    mask_new_tokens=False, a mistake: no mask among the new tokens; with new_first=True, one: the
    new keys and values before the cached ones)."""
    cache = cache or {"k": [None] * len(model.blocks), "v": [None] * len(model.blocks)}
    past = 0 if cache["k"][0] is None else cache["k"][0].shape[2]
    x = model.embed(new_tokens) + model.pos_embed.W_pos[past:past + new_tokens.shape[1]]
    for i, block in enumerate(model.blocks):
        a, h = block.attn, block.ln1(x)
        q = torch.einsum("bpd,ndh->bnph", h, a.W_Q) + a.b_Q[:, None]
        k = torch.einsum("bpd,ndh->bnph", h, a.W_K) + a.b_K[:, None]
        v = torch.einsum("bpd,ndh->bnph", h, a.W_V) + a.b_V[:, None]
        if cache["k"][i] is not None and new_first:
            k, v = torch.cat([k, cache["k"][i]], 2), torch.cat([v, cache["v"][i]], 2)
        elif cache["k"][i] is not None:
            k, v = torch.cat([cache["k"][i], k], 2), torch.cat([cache["v"][i], v], 2)
        cache["k"][i], cache["v"][i] = k, v
        scores = q @ k.transpose(-1, -2) / math.sqrt(a.W_Q.shape[-1])
        n_new, n_all = q.shape[2], k.shape[2]
        mask = torch.ones(n_new, n_all, dtype=torch.bool).triu(n_all - n_new + 1) & mask_new_tokens
        z = scores.masked_fill(mask, -1e5).softmax(-1) @ v               # [batch, head, new, d_head]
        x = x + torch.einsum("bnph,nhd->bpd", z, a.W_O) + a.b_O
        x = x + block.mlp(block.ln2(x))
    return model.unembed(model.ln_final(x)), cache


@pytest.mark.parametrize("fn", [reference.forward_with_cache, _forward_dict_cache])
def test_forward_with_cache_correct_variants_pass(fn):
    passes(nb08.check_forward_with_cache, fn)


@pytest.mark.parametrize("mistake", sorted(nb08.CACHE_MISTAKES))
def test_forward_with_cache_mistakes_are_named(mistake):
    fails_with(nb08.check_forward_with_cache,
               lambda m, t, c: reference.forward_with_cache(m, t, c, mistake=mistake),
               expected="Likely mistake: " + nb08.CACHE_MISTAKES[mistake][:40], first_line=True)


def test_forward_with_cache_that_forgets_the_cache_fails():
    """Named, and localised to the positions after the first call; the general hint on where the first
    call ends is left out under a named mistake."""
    message = fails_with(nb08.check_forward_with_cache, lambda m, t, c: reference.forward_with_cache(m, t, None),
                         expected=("Likely mistake: the cache passed in is never used",
                                   "position 6, 7, 8, 9, 10, 11 (6 of 12)"), first_line=True)
    assert "positions 0-5 are the first call" not in message


def _forward_cache_wrong_layout(model, new_tokens, cache):
    """Keys cached as [batch, n_heads, past, d_head], appended along the wrong dimension."""
    logits, new_cache = reference.forward_with_cache(model, new_tokens, None if cache is None else
                                                [(k.transpose(1, 2), v) for k, v in cache])
    return logits, new_cache


def test_forward_with_cache_without_a_mask_among_new_tokens_is_named():
    fails_with(nb08.check_forward_with_cache,
               lambda m, t, c: _forward_dict_cache(m, t, c, mask_new_tokens=False),
               expected="Likely mistake: the new tokens are not masked among themselves", first_line=True)


def test_forward_with_cache_with_the_new_keys_before_the_cached_ones_is_named_and_ends_with_the_fix():
    fails_with(nb08.check_forward_with_cache,
               lambda m, t, c: _forward_dict_cache(m, t, c, new_first=True),
               expected="Likely mistake: the new keys and values are put before the cached ones", first_line=True)
    with pytest.raises(CheckFailed) as failure:
        nb08.check_forward_with_cache(lambda m, t, c: _forward_dict_cache(m, t, c, new_first=True))
    assert str(failure.value).splitlines()[-1] == (
        "  Show the fix: k_all = torch.cat([past_k, k], dim=1)   # v_all likewise"), str(failure.value)


def test_forward_with_cache_crash_names_the_call_and_the_cache():
    fails_with(nb08.check_forward_with_cache, _forward_cache_wrong_layout,
               expected="forward_with_cache crashed on call 2: 1 new token(s) of shape [1, 1], a cache of 6 positions",
               first_line=True)


def _generate_cache_dict(model, input_ids, max_new_tokens, check_context=True):
    """A correct variant (a while loop over a dict cache); `check_context=False` forgets to
    refuse a request past n_ctx."""
    if check_context and input_ids.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"too long for n_ctx={model.cfg.n_ctx}")
    logits, cache = _forward_dict_cache(model, input_ids, None)
    tokens = input_ids
    while tokens.shape[1] < input_ids.shape[1] + max_new_tokens:
        new = logits[:, -1:].argmax(-1)
        tokens = torch.cat([tokens, new], -1)
        if tokens.shape[1] < input_ids.shape[1] + max_new_tokens:
            logits, cache = _forward_dict_cache(model, new, cache)
    return tokens


@pytest.mark.parametrize("fn", [reference.generate_with_cache, _generate_cache_dict])
def test_generate_with_cache_correct_variants_pass(fn):
    passes(nb08.check_generate_with_cache, fn)


def _generate_cache_unchecked(model, input_ids, max_new_tokens):
    """The classic loop: no check of the context, and a forward pass after every new token."""
    logits, cache = reference.forward_with_cache(model, input_ids)
    tokens = input_ids
    for _ in range(max_new_tokens):
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, new], dim=-1)
        logits, cache = reference.forward_with_cache(model, new, cache)
    return tokens


def test_generate_with_cache_that_refuses_to_fill_the_context_exactly_fails():
    def refuses_early(model, input_ids, max_new_tokens):
        if input_ids.shape[1] + max_new_tokens >= model.cfg.n_ctx:        # off by one
            raise ValueError("does not fit n_ctx")
        return _generate_cache_dict(model, input_ids, max_new_tokens)
    fails_with(nb08.check_generate_with_cache, refuses_early,
               expected="(filling the context, n_ctx = 128, to its last position) raised ValueError: does not "
                        "fit n_ctx. Generation that fills the context to its last position must work",
               first_line=True)


def test_generate_with_cache_past_n_ctx_must_be_refused():
    fails_with(nb08.check_generate_with_cache,
               lambda m, t, n: _generate_cache_dict(m, t, n, check_context=False),
               expected="returned tokens, but 129 positions do not fit the context (n_ctx = 128)", first_line=True)
    fails_with(nb08.check_generate_with_cache, _generate_cache_unchecked,
               expected="generate_with_cache(model, prompt of 5 tokens, 124) returned tokens, but 129 "
                        "positions do not fit", first_line=True)

    def refuses_vaguely(model, input_ids, max_new_tokens):
        if input_ids.shape[1] + max_new_tokens > model.cfg.n_ctx:
            raise RuntimeError("too long")
        return _generate_cache_dict(model, input_ids, max_new_tokens)
    fails_with(nb08.check_generate_with_cache, refuses_vaguely,
               expected="raised RuntimeError: too long. When prompt + max_new_tokens > model.cfg.n_ctx, raise "
                        "a ValueError whose message names n_ctx", first_line=True)


@pytest.mark.parametrize("fn", [reference.generate_with_cache, _generate_cache_dict])
def test_generate_with_cache_correct_variants_read_n_ctx_from_the_model(fn):
    nb08.check_generate_with_cache(fn, n_ctx=60)
    nb08.check_generate_with_cache(fn, seed=5, batch=3, n_ctx=60)


def _limit_written_as(limit):
    def generate_with_cache(model, input_ids, max_new_tokens):
        if input_ids.shape[1] + max_new_tokens > limit:
            raise ValueError(f"too long for n_ctx={limit}")
        return _generate_cache_dict(model, input_ids, max_new_tokens, check_context=False)
    return generate_with_cache


def test_a_context_limit_of_the_visible_models_n_ctx_is_named():
    nb08.check_generate_with_cache(_limit_written_as(128))   # the visible check's n_ctx: it passes
    fails_with(nb08.check_generate_with_cache, _limit_written_as(128),
               expected="returned tokens, but 61 positions do not fit the context (n_ctx = 60). Likely mistake: "
                        "the limit is not read from model.cfg.n_ctx", first_line=True, n_ctx=60)


def test_a_context_limit_of_gpt2s_n_ctx_is_named():
    fails_with(nb08.check_generate_with_cache, _limit_written_as(1024),
               expected="returned tokens, but 129 positions do not fit the context (n_ctx = 128). Likely "
                        "mistake: the limit is not read from model.cfg.n_ctx", first_line=True)


# After the prompt, generation feeds one token at a time: it sees every key, so their order
# ("new_first") cannot show there.
@pytest.mark.parametrize("mistake", sorted(set(nb08.CACHE_MISTAKES) - {"new_first"}))
def test_generate_with_cache_mistakes_are_named(mistake):
    fails_with(nb08.check_generate_with_cache,
               lambda m, t, n: reference.generate_with_cache(m, t, n, mistake=mistake),
               expected=("differs from greedy generation without a cache",
                         "Likely mistake: " + nb08.CACHE_MISTAKES[mistake][:40]), first_line=True)


def _generate_cache_whole_again(model, input_ids, max_new_tokens):
    logits, cache = reference.forward_with_cache(model, input_ids)
    tokens = input_ids
    for _ in range(max_new_tokens):
        tokens = torch.cat([tokens, logits[:, -1:].argmax(-1)], -1)
        logits, cache = reference.forward_with_cache(model, tokens, cache)     # the whole sequence again
    return tokens


def test_generate_with_cache_feeding_the_whole_sequence_again_is_named():
    fails_with(nb08.check_generate_with_cache, _generate_cache_whole_again,
               expected="Likely mistake: each step feeds the whole sequence again together with the cache",
               first_line=True)


def test_generate_with_cache_from_the_wrong_position_fails():
    def first_position(model, input_ids, max_new_tokens):
        logits, cache = reference.forward_with_cache(model, input_ids)
        tokens = input_ids
        for _ in range(max_new_tokens):
            new = logits[:, :1].argmax(-1)
            tokens = torch.cat([tokens, new], -1)
            logits, cache = reference.forward_with_cache(model, new, cache)
        return tokens
    fails_with(nb08.check_generate_with_cache, first_position, expected="at new token 0", first_line=True)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_k=20, freq_penalty=0.5)])
def test_reference_generate_with_cache_matches_without(sampling):
    """The notebook's demos use the reference generate with the cache: same tokens as without."""
    model = nb08._seeded_model(nb08.cache_config(), 3)
    prompt = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(3))
    runs = [reference.generate(model, prompt, 30, torch.Generator().manual_seed(9), use_cache=cache, **sampling)
            for cache in (False, True)]
    assert runs[0].shape == (2, 37)
    assert torch.equal(runs[0], runs[1])


def test_reference_generate_with_cache_refuses_to_overflow_the_context():
    model = nb08._seeded_model(nb08.cache_config(), 3)
    with pytest.raises(ValueError, match="must fit the context"):
        reference.generate(model, torch.zeros(1, 100, dtype=torch.long), 29, None, use_cache=True)


def test_sampler_verdicts_are_deterministic():
    """The same (wrong) sampler gets the same message twice: seeds are fixed, nothing is by luck."""
    wrong = lambda l, g: torch.multinomial((1.2 * l).softmax(-1), 1, generator=g)[:, 0]  # noqa: E731
    messages = []
    for _ in range(2):
        with pytest.raises(CheckFailed) as failure:
            nb08.check_sampler(wrong)
        messages.append(str(failure.value))
    assert messages[0] == messages[1] and "chi-square p-value" in messages[0]


# --- kv_cache_bytes -------------------------------------------------------------------------------

def _solution_kv_cache_bytes():
    from graders.course.example_class import solution_answers
    from graders.reference.config import Config

    namespace = {"torch": torch, "Config": Config}
    exec(compile(solution_answers("08_sampling")["kv_bytes_answer"], "kv_bytes_answer", "exec"), namespace)
    return namespace["kv_cache_bytes"]


def test_solution_kv_cache_bytes_passes_on_measured_caches():
    size = _solution_kv_cache_bytes()
    nb08.check_kv_cache_bytes(size, reference.forward_with_cache)
    nb08.check_kv_cache_bytes(size, reference.forward_with_cache, seed=5, batch=4, seq=11)
    # Without a working forward_with_cache of the learner's, the course's cache still decides.
    nb08.check_kv_cache_bytes(size, lambda *args: (_ for _ in ()).throw(NotImplementedError()))


def _bytes(cfg, batch, seq_len, dtype):
    return 2 * cfg.n_layers * batch * seq_len * cfg.n_heads * cfg.d_head * torch.finfo(dtype).bits // 8


@pytest.mark.parametrize("wrong, message, seed", [
    (lambda c, b, s, d: _bytes(c, b, s, d) // 2, "only the keys are counted", 0),
    (lambda c, b, s, d: _bytes(c, b, s, d) // c.n_layers, "one layer is counted", 0),
    (lambda c, b, s, d: _bytes(c, b, s, d) * 8, "bits, not bytes", 0),
    (lambda c, b, s, d: _bytes(c, b, s, torch.float32), "the dtype is ignored", 0),
    (lambda c, b, s, d: _bytes(c, 1, s, d), "the batch is left out", 5),
    (lambda c, b, s, d: _bytes(c, b, s, d) // c.n_layers, "one layer is counted", 5),
    (lambda c, b, s, d: 2 * c.n_layers * b * s * c.d_model * torch.finfo(d).bits // 8, "d_model is used", 5),
], ids=["keys_only", "keys_only_or_one_layer", "bits", "dtype_ignored", "no_batch", "one_layer", "d_model"])
def test_kv_cache_bytes_mistakes_are_named(wrong, message, seed):
    with pytest.raises(CheckFailed) as failure:
        nb08.check_kv_cache_bytes(wrong, reference.forward_with_cache, seed=seed, batch=4, seq=11)
    assert message in str(failure.value), str(failure.value)


def test_kv_cache_bytes_that_matches_a_wrong_cache_says_so():
    """A forward_with_cache that keeps only the keys builds half a cache: an answer that matches
    it is told to fix forward_with_cache."""
    def keys_only_forward(model, tokens, cache=None):
        logits, kv = reference.forward_with_cache(model, tokens, cache)
        return logits, [k for k, _ in kv]

    with pytest.raises(CheckFailed, match="fix forward_with_cache first"):
        nb08.check_kv_cache_bytes(lambda c, b, s, d: _bytes(c, b, s, d) // 2, keys_only_forward)


def test_kv_cache_bytes_that_measures_a_cache_is_refused():
    def measuring(cfg, batch, seq_len, dtype):
        return sum(t.numel() for t in reference.forward_with_cache)

    with pytest.raises(CheckFailed, match="without building a cache"):
        nb08.check_kv_cache_bytes(measuring, reference.forward_with_cache)


# --- One mistake, one exercise -------------------------------------------------------

WRONG_PARTS = '''
def greedy_search(logits):
    return logits.argmin(dim=-1)


def apply_temperature(logits, temperature):
    return logits * temperature


def apply_frequency_penalty(input_ids, logits, freq_penalty):
    return logits


def apply_top_k(logits, k):
    return logits


def apply_top_p(logits, top_p):                  # the example class's: one token too few
    if top_p >= 1.0:
        return logits.clone()
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    remove_sorted = sorted_logits.double().softmax(dim=-1).cumsum(dim=-1) >= top_p
    remove_sorted[..., 0] = False
    return logits.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))


def sample_basic(logits, generator):
    return logits.argmax(dim=-1)


def forward_with_cache(model, new_tokens, cache=None):
    return reference.forward_with_cache(model, new_tokens, cache, mistake="offset")
'''

SOLUTION_COMPOSITES = '''
def sample_next_token(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
    logits = apply_frequency_penalty(input_ids, logits, freq_penalty)
    if temperature == 0.0:
        return greedy_search(logits)
    logits = apply_temperature(logits, temperature)
    if top_k > 0:
        logits = apply_top_k(logits, top_k)
    if top_p < 1.0:
        logits = apply_top_p(logits, top_p)
    return sample_basic(logits, generator)


@torch.no_grad()
def generate(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    tokens = input_ids
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        next_id = sample_next_token(tokens, model(tokens[:, -model.cfg.n_ctx:])[:, -1], generator, **sampling)
        if eos_token_id is not None:
            next_id = next_id.masked_fill(finished, eos_token_id)
            finished = finished | (next_id == eos_token_id)
        tokens = torch.cat([tokens, next_id[:, None]], dim=-1)
        if eos_token_id is not None and bool(finished.all()):
            break
    return tokens


@torch.no_grad()
def generate_with_cache(model, input_ids, max_new_tokens):
    if input_ids.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"prompt + max_new_tokens exceed the context, n_ctx = {model.cfg.n_ctx}")
    logits, cache = forward_with_cache(model, input_ids)
    tokens = input_ids
    for step in range(max_new_tokens):
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, next_id], dim=-1)
        if step + 1 < max_new_tokens:
            logits, cache = forward_with_cache(model, next_id, cache)
    return tokens
'''


def test_a_wrong_part_costs_only_its_own_check():
    """A notebook whose every part is wrong, its composites right: each part fails its own check,
    and sample_next_token, generate and generate_with_cache pass theirs, which run the course's
    parts under the notebook's names (08 charged the example class's top-p twice), and
    give the learner's back afterwards."""
    notebook = {"torch": torch, "reference": reference}
    exec(WRONG_PARTS + SOLUTION_COMPOSITES, notebook)
    parts = {name: notebook[name] for name in (*reference.GENERATION_PARTS, "forward_with_cache")}
    fails_with(nb08.check_top_p, parts["apply_top_p"], expected="one token too few", first_line=True)
    for check, name in ((nb08.check_greedy, "greedy_search"), (nb08.check_temperature, "apply_temperature"),
                        (nb08.check_frequency_penalty, "apply_frequency_penalty"),
                        (nb08.check_top_k, "apply_top_k"), (nb08.check_sampler, "sample_basic"),
                        (nb08.check_forward_with_cache, "forward_with_cache")):
        with pytest.raises(CheckFailed):
            check(parts[name])
    nb08.check_sample_next_token(notebook["sample_next_token"])
    nb08.check_generate(notebook["generate"])
    nb08.check_generate_with_cache(notebook["generate_with_cache"])
    assert all(notebook[name] is part for name, part in parts.items())


def test_the_cache_timing_demo_times_both_on_one_thread_and_restores_the_threads():
    """On a busy machine several threads wait for one another, which can hide what the cache saves."""
    import time
    import types

    import nbformat

    from graders.layout import SOLUTIONS

    cell = next(c.source for c in nbformat.read(SOLUTIONS / "08_sampling.ipynb", as_version=4).cells
                if c.cell_type == "code" and "generate_with_cache(model, ids" in c.source
                and "perf_counter" in c.source)
    threads_seen = []

    def generating(model, ids, n_new, *args, **kwargs):
        threads_seen.append(torch.get_num_threads())
        return torch.zeros(1, ids.shape[1] + n_new, dtype=torch.long)

    before = torch.get_num_threads()
    namespace = {"torch": torch, "time": time, "ready": lambda *answers: True, "prompt": "x",
                 "model": types.SimpleNamespace(cfg=types.SimpleNamespace(n_ctx=1024)),
                 "to_ids": lambda text: torch.zeros(1, 11, dtype=torch.long),
                 "generate": generating, "generate_with_cache": generating}
    exec(compile(cell, "08's timing cell", "exec"), namespace)
    assert threads_seen and set(threads_seen) == {1} and torch.get_num_threads() == before
