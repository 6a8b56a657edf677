"""Notebook 08's graders: correct variants pass, each catalogued mistake fails with its diagnosis."""
import math

import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb08
from graders.judging.compare import CheckFailed

INF = float("inf")


def fails_with(check, fn, *expected, **case):
    with pytest.raises(CheckFailed) as failure:
        check(fn, **case)
    for text in expected:
        assert text in str(failure.value), str(failure.value)


HIDDEN = {"seed": 5, "batch": 3}


def passes(check, fn):
    check(fn)
    check(fn, **HIDDEN)


# --- greedy -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda l: l.argmax(-1), lambda l: l.max(dim=-1).indices,
                                lambda l: l.topk(1, dim=-1).indices[:, 0]])
def test_greedy_correct_variants_pass(fn):
    passes(nb08.check_greedy, fn)


@pytest.mark.parametrize("fn, message", [
    (lambda l: l.argmin(-1), "argmin instead of argmax"),
    (lambda l: l.argmax(0)[: l.shape[0]] if l.shape[0] > 1 else l.argmax(0), "shape"),
    (lambda l: l.max(-1).values, "dtype"),
    (lambda l: l[:, :-1].argmax(-1) + 1, "expected the most likely token"),
])
def test_greedy_mistakes_fail(fn, message):
    fails_with(nb08.check_greedy, fn, message)


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
    fails_with(nb08.check_temperature, fn, message)


# --- frequency penalty --------------------------------------------------------------------------

def _penalty_bincount(ids, logits, a):
    counts = torch.stack([torch.bincount(row, minlength=logits.shape[-1]) for row in ids])
    return logits - a * counts


def _penalty_one_hot(ids, logits, a):
    return logits - a * F.one_hot(ids, logits.shape[-1]).sum(1).float()


@pytest.mark.parametrize("fn", [nb08.apply_frequency_penalty, _penalty_bincount, _penalty_one_hot])
def test_penalty_correct_variants_pass(fn):
    passes(nb08.check_frequency_penalty, fn)


def _presence(ids, logits, a):
    return logits - a * (F.one_hot(ids, logits.shape[-1]).sum(1) > 0).float()


def _whole_batch(ids, logits, a):
    return logits - a * torch.bincount(ids.flatten(), minlength=logits.shape[-1])


def _penalty_in_place(ids, logits, a):
    logits -= a * F.one_hot(ids, logits.shape[-1]).sum(1)
    return logits


@pytest.mark.parametrize("fn, message", [
    (_presence, "Likely mistake: each token seen is penalised once"),
    (_whole_batch, "Likely mistake: tokens are counted over the whole batch"),
    (lambda ids, l, a: l + a * F.one_hot(ids, l.shape[-1]).sum(1), "Likely mistake: the penalty is added"),
    (lambda ids, l, a: l / (1 + a * F.one_hot(ids, l.shape[-1]).sum(1)), "Likely mistake: the logits are divided"),
    (_penalty_in_place, "in place"),
    (lambda ids, l, a: l - a * F.one_hot(ids[:, -1], l.shape[-1]), "does not match"),
])
def test_penalty_mistakes_fail(fn, message):
    fails_with(nb08.check_frequency_penalty, fn, message)


# --- top-k --------------------------------------------------------------------------------------

def _top_k_where(logits, k):
    kth = torch.sort(logits, dim=-1, descending=True).values[:, k - 1:k]
    return torch.where(logits >= kth, logits, torch.full_like(logits, -INF))


def _top_k_large_negative(logits, k):
    return logits.masked_fill(logits < logits.topk(k).values[:, [-1]], -1e9)


@pytest.mark.parametrize("fn", [nb08.apply_top_k, _top_k_where, _top_k_large_negative])
def test_top_k_correct_variants_pass(fn):
    passes(nb08.check_top_k, fn)


def _top_k_scatter(logits, k):
    values, indices = logits.topk(k)
    return torch.full_like(logits, -INF).scatter(-1, indices, values)


def _top_k_probabilities(logits, k):
    probs = logits.softmax(-1)
    return probs.masked_fill(logits < logits.topk(k).values[:, [-1]], 0.0)


@pytest.mark.parametrize("fn, message", [
    (_top_k_scatter, "Likely mistake: ties at the k-th largest value are broken"),
    (lambda l, k: l.masked_fill(l <= l.topk(k).values[:, [-1]], -INF), "one token too few"),
    (lambda l, k: l.masked_fill(l < l.topk(min(k + 1, l.shape[-1])).values[:, [-1]], -INF),
     "Likely mistake: one token too many"),
    (lambda l, k: l.masked_fill(l > (-l).topk(k).values[:, [-1]].neg(), -INF),
     "Likely mistake: the k SMALLEST logits are kept"),
    (_top_k_probabilities, "looks like probabilities"),
])
def test_top_k_mistakes_fail(fn, message):
    fails_with(nb08.check_top_k, fn, message)


# --- top-p --------------------------------------------------------------------------------------

def _top_p_ascending_hf_style(logits, p):
    sorted_logits, order = logits.sort(dim=-1)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= 1 - p
    remove[:, -1] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), -1e9)


def _top_p_loop(logits, p):
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


@pytest.mark.parametrize("fn", [nb08.apply_top_p, _top_p_ascending_hf_style, _top_p_loop])
def test_top_p_correct_variants_pass(fn):
    passes(nb08.check_top_p, fn)


def _top_p(logits, p, keep_rule, force_first=True):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    keep = keep_rule(probs.cumsum(-1), probs, p)
    if force_first:
        keep[:, 0] = True
    return logits.masked_fill(~keep.scatter(-1, order, keep), -INF)


@pytest.mark.parametrize("fn, message", [
    (lambda l, p: _top_p(l, p, lambda c, q, p: c < p), "Likely mistake: one token too few"),
    (lambda l, p: _top_p(l, p, lambda c, q, p: (c - q - q.roll(1, -1) < p)), "one token too many"),
    (lambda l, p: _top_p(l, p, lambda c, q, p: c - q < p, force_first=False)
     if p > 1e-3 else l.masked_fill(torch.ones_like(l, dtype=torch.bool), -INF), "every token removed"),
    (lambda l, p: _top_p(l, p, lambda c, q, p: c <= p, force_first=False).nan_to_num(neginf=-INF)
     if p > 1e-3 else _top_p(l, p, lambda c, q, p: c - q < p), "one token too few"),
    (lambda l, p: l.masked_fill(~nb08._ascending_keep(l, p), -INF),
     "Likely mistake: the least likely tokens are kept"),
])
def test_top_p_mistakes_fail(fn, message):
    fails_with(nb08.check_top_p, fn, message)


# --- the basic sampler -------------------------------------------------------------------------

def _gumbel_max(logits, generator):
    u = torch.rand(logits.shape, generator=generator)
    return (logits - (-u.log()).log()).argmax(-1)


def _inverse_cdf(logits, generator):
    cdf = logits.softmax(-1).cumsum(-1)
    u = torch.rand(logits.shape[0], 1, generator=generator)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=logits.shape[-1] - 1)[:, 0]


@pytest.mark.parametrize("fn", [nb08.sample_basic, _gumbel_max, _inverse_cdf])
def test_sampler_correct_variants_pass(fn):
    passes(nb08.check_sampler, fn)


@pytest.mark.parametrize("fn, message", [
    (lambda l, g: l.argmax(-1), "different seeds gave the same tokens"),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1)[:, 0], "seeded the same gave different tokens"),
    (lambda l, g: torch.multinomial((l > -INF).float(), 1, generator=g)[:, 0],
     "Likely mistake: sampling uniformly"),
    (lambda l, g: torch.multinomial(l.softmax(-1).softmax(-1) * (l > -INF), 1, generator=g)[:, 0],
     "Likely mistake: the softmax is taken twice"),
    (lambda l, g: torch.multinomial((2 * l).softmax(-1), 1, generator=g)[:, 0],
     "Likely mistake: the logits are doubled"),
    (lambda l, g: torch.multinomial(torch.ones_like(l), 1, generator=g)[:, 0], "probability 0"),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1, generator=torch.Generator().manual_seed(0))[:, 0],
     "different seeds gave the same tokens"),
])
def test_sampler_mistakes_fail(fn, message):
    fails_with(nb08.check_sampler, fn, message)


# --- sample_next_token ------------------------------------------------------------------------

def _pipeline(order="ptkq", zero="greedy", temper="divide"):
    """sample_next_token with its steps in `order`: p(enalty), t(emperature), k, q (top-p)."""
    def sample(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
        if temperature == 0.0 and zero == "greedy":
            return nb08.apply_frequency_penalty(input_ids, logits, freq_penalty).argmax(-1)
        steps = {"p": lambda l: nb08.apply_frequency_penalty(input_ids, l, freq_penalty),
                 "t": lambda l: l / temperature if temper == "divide" else l * temperature,
                 "k": lambda l: nb08.apply_top_k(l, top_k) if top_k else l,
                 "q": lambda l: nb08.apply_top_p(l, top_p) if top_p < 1 else l}
        for step in order:
            logits = steps[step](logits)
        return nb08.sample_basic(logits, generator)
    return sample


def _pipeline_gumbel(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
    logits = nb08.next_token_logits(input_ids, logits, max(temperature, 1e-8), top_k, top_p, freq_penalty)
    return _gumbel_max(logits, generator)


@pytest.mark.parametrize("fn", [nb08.sample_next_token, _pipeline(), _pipeline_gumbel])
def test_pipeline_correct_variants_pass(fn):
    passes(nb08.check_sample_next_token, fn)


@pytest.mark.parametrize("fn, message", [
    (_pipeline("pkqt"), "Likely mistake: the temperature is applied after top-k/top-p"),
    (_pipeline("tpkq"), "Likely mistake: the frequency penalty is applied after the temperature"),
    (_pipeline("tkq"), "Likely mistake: the frequency penalty is ignored"),
    (_pipeline("pkq"), "temperature"),
    (_pipeline(zero="divide"), "temperature 0 means greedy"),
    (_pipeline(temper="multiply"), "multiplies the logits instead of dividing"),
])
def test_pipeline_mistakes_fail(fn, message):
    fails_with(nb08.check_sample_next_token, fn, message)


# --- generate ----------------------------------------------------------------------------------

def _generate(crop=True, position=-1, pass_sampling=True, stop="after"):
    def generate(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
        tokens = input_ids
        for _ in range(max_new_tokens):
            context = tokens[:, -model.cfg.n_ctx:] if crop else tokens
            logits = model(context)[:, position]
            new = nb08.sample_next_token(tokens, logits, generator, **(sampling if pass_sampling else {}))
            if stop == "before" and eos_token_id is not None and bool((new == eos_token_id).all()):
                break
            tokens = torch.cat([tokens, new[:, None]], dim=-1)
            if stop == "after" and eos_token_id is not None and bool((new == eos_token_id).all()):
                break
        return tokens
    return generate


def _generate_cropping_first(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    tokens = input_ids
    for _ in range(max_new_tokens):
        new = nb08.sample_next_token(tokens, model(tokens[:, :model.cfg.n_ctx])[:, -1], generator, **sampling)
        tokens = torch.cat([tokens, new[:, None]], dim=-1)
        if eos_token_id is not None and bool((new == eos_token_id).all()):
            break
    return tokens


@pytest.mark.parametrize("fn", [nb08.generate, _generate()])
def test_generate_correct_variants_pass(fn):
    passes(nb08.check_generate, fn)


@pytest.mark.parametrize("fn, message", [
    (_generate(crop=False), "did you crop the context"),
    (_generate_cropping_first, "not cropped to the LAST n_ctx tokens"),
    (_generate(position=0), "the logits of the LAST position"),
    (_generate(pass_sampling=False), "temperature=0.0) differs from greedy"),
    (_generate(stop="never"), "must stop right after the end-of-text"),
    (_generate(stop="before"), "(and include it)"),
])
def test_generate_mistakes_fail(fn, message):
    fails_with(nb08.check_generate, fn, message)


def test_generate_ignoring_top_k_is_caught():
    def ignores_top_k(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
        sampling.pop("top_k", None)
        return nb08.generate(model, input_ids, max_new_tokens, generator, eos_token_id, **sampling)
    fails_with(nb08.check_generate, ignores_top_k, "is not among the 5 most likely")


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


@pytest.mark.parametrize("fn", [nb08.beam_search, _beam_loop])
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


@pytest.mark.parametrize("fn, message", [
    (_beam(score_update="last"), "Likely mistake: the scores are not accumulated"),
    (_beam(probabilities=True), "log-probabilities, not probabilities"),
    (_beam(reverse=True), "the right beams, but return them best first"),
    (lambda m, i, n, k: (nb08.beam_search(m, i, n, k)[0], nb08.beam_search(m, i, n, k)[1] / (i.shape[1] + k)),
     "Likely mistake: the score is divided by the length"),
    (lambda m, i, n, k: (nb08.beam_search(m, i, n, k)[0],
                         nb08.beam_search(m, i, n, k)[1] + m(i).log_softmax(-1)[0, 0, i[0, 1]]),
     "over the new tokens only"),
    (lambda m, i, n, k: nb08.beam_search(m, i, n, k)[0], "must return a pair"),
    (lambda m, i, n, k: (nb08.beam_search(m, i, n, k)[0][:, i.shape[1]:], nb08.beam_search(m, i, n, k)[1]),
     "tokens: shape"),
])
def test_beam_search_mistakes_fail(fn, message):
    fails_with(nb08.check_beam_search, fn, message)


def test_beam_search_ranking_by_the_last_step_only_fails():
    fails_with(nb08.check_beam_search, _beam(rank_by_last=True), "differ from")


# --- the KV cache ------------------------------------------------------------------------------

def _forward_dict_cache(model, new_tokens, cache):
    """A correct variant: the cache as a dict of per-layer lists, matmul-based attention."""
    cache = cache or {"k": [None] * len(model.blocks), "v": [None] * len(model.blocks)}
    past = 0 if cache["k"][0] is None else cache["k"][0].shape[2]
    x = model.embed(new_tokens) + model.pos_embed.W_pos[past:past + new_tokens.shape[1]]
    for i, block in enumerate(model.blocks):
        a, h = block.attn, block.ln1(x)
        q = torch.einsum("bpd,ndh->bnph", h, a.W_Q) + a.b_Q[:, None]
        k = torch.einsum("bpd,ndh->bnph", h, a.W_K) + a.b_K[:, None]
        v = torch.einsum("bpd,ndh->bnph", h, a.W_V) + a.b_V[:, None]
        if cache["k"][i] is not None:
            k, v = torch.cat([cache["k"][i], k], 2), torch.cat([cache["v"][i], v], 2)
        cache["k"][i], cache["v"][i] = k, v
        scores = q @ k.transpose(-1, -2) / math.sqrt(a.W_Q.shape[-1])
        n_new, n_all = q.shape[2], k.shape[2]
        mask = torch.ones(n_new, n_all, dtype=torch.bool).triu(n_all - n_new + 1)
        z = scores.masked_fill(mask, -1e5).softmax(-1) @ v               # [batch, head, new, d_head]
        x = x + torch.einsum("bnph,nhd->bpd", z, a.W_O) + a.b_O
        x = x + block.mlp(block.ln2(x))
    return model.unembed(model.ln_final(x)), cache


@pytest.mark.parametrize("fn", [nb08.forward_with_cache, _forward_dict_cache])
def test_forward_with_cache_correct_variants_pass(fn):
    passes(nb08.check_forward_with_cache, fn)


@pytest.mark.parametrize("mistake", sorted(nb08.CACHE_MISTAKES))
def test_forward_with_cache_mistakes_are_named(mistake):
    fails_with(nb08.check_forward_with_cache,
               lambda m, t, c: nb08.forward_with_cache(m, t, c, mistake=mistake),
               "Likely mistake: " + nb08.CACHE_MISTAKES[mistake][:40])


def test_forward_with_cache_that_forgets_the_cache_fails():
    fails_with(nb08.check_forward_with_cache, lambda m, t, c: nb08.forward_with_cache(m, t, None),
               "does not match", "positions 0-5 are the first call")


def _generate_cache_dict(model, input_ids, max_new_tokens):
    logits, cache = _forward_dict_cache(model, input_ids, None)
    tokens = input_ids
    for _ in range(max_new_tokens):
        new = logits[:, -1:].argmax(-1)
        tokens = torch.cat([tokens, new], -1)
        logits, cache = _forward_dict_cache(model, new, cache)
    return tokens


@pytest.mark.parametrize("fn", [nb08.generate_with_cache, _generate_cache_dict])
def test_generate_with_cache_correct_variants_pass(fn):
    passes(nb08.check_generate_with_cache, fn)


@pytest.mark.parametrize("mistake", sorted(nb08.CACHE_MISTAKES))
def test_generate_with_cache_mistakes_are_named(mistake):
    fails_with(nb08.check_generate_with_cache,
               lambda m, t, n: nb08.generate_with_cache(m, t, n, mistake=mistake),
               "differs from greedy generation without a cache",
               "Likely mistake: " + nb08.CACHE_MISTAKES[mistake][:40])


def test_generate_with_cache_from_the_wrong_position_fails():
    def first_position(model, input_ids, max_new_tokens):
        logits, cache = nb08.forward_with_cache(model, input_ids)
        tokens = input_ids
        for _ in range(max_new_tokens):
            new = logits[:, :1].argmax(-1)
            tokens = torch.cat([tokens, new], -1)
            logits, cache = nb08.forward_with_cache(model, new, cache)
        return tokens
    fails_with(nb08.check_generate_with_cache, first_position, "at new token 0")


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_k=20, freq_penalty=0.5)])
def test_reference_generate_with_cache_matches_without(sampling):
    """The notebook's demos use the reference generate with the cache: same tokens as without."""
    model = nb08._seeded_model(nb08.cache_config(), 3)
    prompt = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(3))
    runs = [nb08.generate(model, prompt, 30, torch.Generator().manual_seed(9), use_cache=cache, **sampling)
            for cache in (False, True)]
    assert runs[0].shape == (2, 37)
    assert torch.equal(runs[0], runs[1])


def test_reference_generate_with_cache_refuses_to_overflow_the_context():
    model = nb08._seeded_model(nb08.cache_config(), 3)
    with pytest.raises(ValueError, match="must fit the context"):
        nb08.generate(model, torch.zeros(1, 100, dtype=torch.long), 29, None, use_cache=True)


def test_sampler_verdicts_are_deterministic():
    """The same (wrong) sampler gets the same message twice: seeds are fixed, nothing is by luck."""
    wrong = lambda l, g: torch.multinomial((1.2 * l).softmax(-1), 1, generator=g)[:, 0]  # noqa: E731
    messages = []
    for _ in range(2):
        with pytest.raises(CheckFailed) as failure:
            nb08.check_sampler(wrong)
        messages.append(str(failure.value))
    assert messages[0] == messages[1] and "chi-square p-value" in messages[0]
