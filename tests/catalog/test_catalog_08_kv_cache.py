"""Notebook 08's KV-cache graders (graders/exercises/nb08/kv_cache.py): correct variants pass, each
catalogued mistake fails with its diagnosis."""
import math

import pytest
import torch

from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference
from graders.judging.compare import CheckFailed

from course_code import course_code_allowed
from catalog_helpers import fails_with
from catalog_08_shared import passes


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


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
