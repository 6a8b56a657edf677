"""Notebook 08's KV cache: `forward_with_cache` and `generate_with_cache`, judged against forward
passes and generation without a cache."""
from __future__ import annotations

import torch

from graders.exercises.nb08.reference import forward_with_cache, generate, generate_with_cache
from graders.exercises.common.small_models import cache_config, fed_lengths, seeded_model
from graders.judging.cases import Case
from graders.exercises.common.diagnosis import crash, is_crash, judge_generated
from graders.judging.compare import CheckFailed, Mistake, compare, mistake_key, require_tensor, with_fix
from graders.judging.exercise import Exercise
from graders.judging.learner import recorded_text, run_learner, text_record

CACHE_CHUNKS = (6, 1, 3, 1, 1)
CACHE_MISTAKES = {    # the reference's name of each mistake (forward_with_cache's `mistake`) -> its Mistake
    "offset": Mistake("positions_restart", with_fix(
        "the new tokens get position embeddings 0, 1, ... instead of continuing after "
        "the cached positions: they take the rows of W_pos from past_len on",
        "model.pos_embed.W_pos[past_len : past_len + n_new]")),
    "no_append": Mistake("cache_not_extended", "the cache is not extended: the new keys and values must be "
                         "appended to the cached ones and returned for the next call"),
    "mask": Mistake("mask_ignores_cache", "the causal mask ignores the cached positions: new query i sits at "
                    "position past_len + i and may attend to every key up to that position"),
    "no_mask": Mistake("new_tokens_unmasked", "the new tokens are not masked among themselves: when several new "
                       "tokens come at once, new query i may attend to the cached keys and new keys 0..i only "
                       "(mask key j > past_len + i)"),
    "only_new": Mistake("only_new_cached", with_fix(
        "the cache returned holds only the new keys and values: return the cached "
        "ones with the new ones appended, so that the next call sees every earlier "
        "position", "k_all = torch.cat([past_k, k], dim=1)   # v_all likewise; return (k_all, v_all)")),
    "ignored": Mistake("cache_ignored", "the cache passed in is never used: each call attends only to its own "
                       "tokens, and embeds them at positions 0, 1, ...; read the cached keys and values, and "
                       "continue the positions after them"),
    "new_first": Mistake("new_before_cached", with_fix(
        "the new keys and values are put before the cached ones: keys must stay in "
        "position order, the cached positions first, for key j to be position j "
        "as the causal mask assumes (a single new token sees every key, so only "
        "the calls with several new tokens go wrong, and later calls read their "
        "wrong keys)", "k_all = torch.cat([past_k, k], dim=1)   # v_all likewise")),
}


def _cache_tokens(case: Case) -> torch.Tensor:
    return torch.randint(0, cache_config().d_vocab, (max(case.batch, 1), sum(CACHE_CHUNKS)),
                         generator=torch.Generator().manual_seed(case.seed + 90))


def _chunked_logits(forward, model, tokens, **kwargs) -> torch.Tensor:
    cache, pieces, start = None, [], 0
    for size in CACHE_CHUNKS:
        logits, cache = forward(model, tokens[:, start:start + size], cache, **kwargs)
        pieces.append(logits)
        start += size
    return torch.cat(pieces, dim=1)


def produce_forward_cache(fn, case: Case, inputs: dict) -> dict:
    model = seeded_model(cache_config(), case.seed).eval()
    tokens = _cache_tokens(case)
    calls = [0]

    def learner_forward(m, chunk, cache):
        try:
            result = run_learner("forward_with_cache", fn, m, chunk, cache)
        except CheckFailed as failure:
            if not is_crash(failure):
                raise
            past = sum(CACHE_CHUNKS[:calls[0]])
            raise crash("forward_with_cache", failure,
                        f"call {calls[0] + 1}: {chunk.shape[1]} new token(s) of shape {list(chunk.shape)}, "
                        + ("no cache (cache=None)" if cache is None else f"a cache of {past} positions"),
                        "" if cache is None else Mistake(
                            "crash_with_cache", "the first call (no cache) worked, so the crash is "
                            "in the code that reads or extends the cache: the new keys and values are "
                            "appended to the cached ones along the positions, the mask is [new, "
                            "past_len + new], and the positions continue at past_len")) from failure.__cause__
        calls[0] += 1
        if not (isinstance(result, tuple) and len(result) == 2):
            raise CheckFailed("forward_with_cache must return a pair (logits, cache).")
        require_tensor("forward_with_cache logits", result[0])
        return result

    return {"logits": _chunked_logits(learner_forward, model, tokens)}


def judge_forward_cache(case: Case, outputs: dict) -> None:
    model = seeded_model(cache_config(), case.seed).eval()
    tokens = _cache_tokens(case)
    with torch.no_grad():
        expected = model(tokens)

    @torch.no_grad()
    def mistakes():
        return {d: _chunked_logits(forward_with_cache, model, tokens, mistake=m) for m, d in CACHE_MISTAKES.items()}

    compare(f"forward_with_cache fed {len(tokens[0])} tokens in chunks of {list(CACHE_CHUNKS)} "
            "(logits of every position, against one uncached forward pass)",
            outputs["logits"], expected, ("batch", "position", "d_vocab"), mistakes=mistakes,
            depth=model.cfg.n_layers,
            hint="positions 0-5 are the first call (no cache); a mismatch from position 6 on is "
                 "in how the cache is reused.")


forward_cache_exercise = Exercise("08_sampling", "forward_with_cache", produce_forward_cache,
                                  judge_forward_cache, defaults={"text": None})
check_forward_with_cache = forward_cache_exercise.checker(
    "Grade `forward_with_cache(model, new_tokens, cache) -> (logits, cache)`.")


CACHE_STEPS = 50
# A prompt longer than any context a literal limit could have been written for (the visible
# check's 128, GPT-2's 1024): whether the learner's limit is a literal or model.cfg.n_ctx. A
# long prompt and one new token, not a long generation: code without a limit then crashes (or
# stops) at once, where a generation past n_ctx could loop on empty logits forever.
FAR_PAST_N_CTX = 2048


def _cache_prompt(case: Case) -> torch.Tensor:
    return _cache_tokens(case)[:, :5]


def _cache_model(case: Case):
    """The seeded model of the generation checks: cache_config(), with the case's n_ctx if it
    sets one (a hidden case, so that a limit written as a literal fails)."""
    return seeded_model(case.config(cache_config()), case.seed).eval()


def _steps(model, prompt: torch.Tensor) -> int:
    """New tokens of the main run: CACHE_STEPS, or fewer on a model whose context is shorter."""
    return min(CACHE_STEPS, _steps_to_fill(model, prompt))


WHOLE_AGAIN = Mistake("whole_sequence_fed", "each step feeds the whole sequence again together with the cache: "
                      "after the first call (the prompt), feed only the newest token, shape [batch, 1]; the "
                      "cache already holds the keys and values of everything before it")


def produce_generate_cache(fn, case: Case, inputs: dict) -> dict:
    model, prompt = _cache_model(case), _cache_prompt(case)
    steps = _steps(model, prompt)
    with fed_lengths(model) as fed:
        try:
            out = run_learner("generate_with_cache", fn, model, prompt.clone(), steps)
        except CheckFailed as failure:
            if not is_crash(failure):
                raise
            on = (f"a prompt of shape {list(prompt.shape)}, max_new_tokens={steps}, at call "
                  f"{len(fed)} of the model's embedding (token counts fed: {fed[:6]})")
            raise crash("generate_with_cache", failure, on,
                        WHOLE_AGAIN if len(fed) > 1 and fed[1] > 1 else "") from failure.__cause__
    require_tensor("generate_with_cache(...)", out)
    outputs = {"tokens": out, "fed": torch.tensor(fed[:steps + 1], dtype=torch.long)}
    # At the edge of the context: up to n_ctx exactly must work, one token more must be refused;
    # when it is not, whether a request far past any context is (a limit written as a literal).
    fill = _steps_to_fill(model, prompt)
    outputs.update(_edge_run(fn, model, prompt, "to_n_ctx", fill))
    outputs.update(_edge_run(fn, model, prompt, "past_n_ctx", fill + 1))
    if "past_n_ctx_error" not in outputs:
        long_prompt = prompt.repeat(1, FAR_PAST_N_CTX // prompt.shape[1] + 1)[:, :FAR_PAST_N_CTX]
        outputs.update({key: value for key, value in _edge_run(fn, model, long_prompt, "far_past_n_ctx", 1).items()
                        if key.endswith("_error")})
    return outputs


def _edge_run(fn, model, prompt: torch.Tensor, key: str, n_new: int) -> dict:
    """{key: the tokens} of the learner's generation of `n_new` tokens, or {key_error: what it raised}."""
    try:
        return {key: run_learner("generate_with_cache", fn, model, prompt.clone(), n_new)}
    except CheckFailed as failure:
        if not is_crash(failure):
            raise
        return {f"{key}_error": text_record(f"{type(failure.__cause__).__name__}: {failure.__cause__}")}


def _steps_to_fill(model, prompt: torch.Tensor) -> int:
    """How many new tokens bring `prompt` to exactly n_ctx positions."""
    return model.cfg.n_ctx - prompt.shape[1]


def _judge_context_edge(model, prompt: torch.Tensor, outputs: dict) -> None:
    """Generation that fills the context exactly must work; asking for more must raise a
    ValueError that names n_ctx (a cache cannot slide the window the way `generate` crops)."""
    n_ctx, fill = model.cfg.n_ctx, _steps_to_fill(model, prompt)
    where = (f"generate_with_cache(model, prompt of {prompt.shape[1]} tokens, {fill}) (filling the "
             f"context, n_ctx = {n_ctx}, to its last position)")
    if "to_n_ctx_error" in outputs:
        raise CheckFailed(f"{where} raised {recorded_text(outputs['to_n_ctx_error'])}. Generation "
                          "that fills the context to its last position must work (the last new "
                          "token needs no forward pass of its own).")
    judge_generated(where, outputs["to_n_ctx"], prompt, fill)
    with torch.no_grad():
        expected = generate_with_cache(model, prompt, fill)
    if not torch.equal(outputs["to_n_ctx"], expected):
        raise CheckFailed(f"{where}: differs from greedy generation without a cache.")
    where = f"generate_with_cache(model, prompt of {prompt.shape[1]} tokens, {fill + 1})"
    if "past_n_ctx_error" not in outputs:
        head = (f"{where} returned tokens, but {prompt.shape[1] + fill + 1} positions do not fit "
                f"the context (n_ctx = {n_ctx}).")
        far = outputs.get("far_past_n_ctx_error")
        if far is not None and recorded_text(far).startswith("ValueError:"):
            raise CheckFailed(f"{head} Likely mistake: the limit is not read from model.cfg.n_ctx: "
                              f"your generate_with_cache refuses a prompt of {FAR_PAST_N_CTX} tokens, "
                              f"but not these, on a model whose n_ctx is {n_ctx}. Compare prompt + "
                              "max_new_tokens with model.cfg.n_ctx, not a literal (the visible "
                              "check's 128, or GPT-2's 1024).", mistake="literal_n_ctx_limit")
        raise CheckFailed(f"{head} Raise a ValueError that names n_ctx when prompt + max_new_tokens "
                          "> model.cfg.n_ctx, before generating anything.")
    raised = recorded_text(outputs["past_n_ctx_error"])
    if not (raised.startswith("ValueError:") and "n_ctx" in raised):
        raise CheckFailed(f"{where} raised {raised}. When prompt + max_new_tokens > "
                          "model.cfg.n_ctx, raise a ValueError whose message names n_ctx, before "
                          "generating anything.")


def judge_generate_cache(case: Case, outputs: dict) -> None:
    model, prompt = _cache_model(case), _cache_prompt(case)
    steps = _steps(model, prompt)
    out = outputs["tokens"]
    where = f"generate_with_cache(model, prompt of shape {list(prompt.shape)}, {steps})"
    judge_generated(where, out, prompt, steps)
    with torch.no_grad():
        expected = generate(model, prompt, steps, None, temperature=0.0)
    if torch.equal(out, expected):
        return _judge_context_edge(model, prompt, outputs)
    first = int((out != expected).any(0).nonzero()[0]) - prompt.shape[1]
    lines = [f"{where}: differs from greedy generation without a cache at new token {first} "
             f"(expected {expected[0, prompt.shape[1]:][:first + 3].tolist()} ..., got "
             f"{out[0, prompt.shape[1]:][:first + 3].tolist()} ...)."]
    fed = outputs["fed"].tolist()
    if len(fed) > 1 and fed[1] > 1:
        raise CheckFailed("\n".join(lines + [f"  Likely mistake: {WHOLE_AGAIN} (it fed {fed[:4]} tokens "
                                              "in its first calls)."]), mistake=WHOLE_AGAIN.key)
    named = None
    with torch.no_grad():
        for mistake, description in CACHE_MISTAKES.items():
            if torch.equal(out, generate_with_cache(model, prompt, steps, mistake)):
                lines.append(f"  Likely mistake: {description}")
                named = description
                break
    raise CheckFailed("\n".join(lines), mistake=mistake_key(named))


# generate_with_cache runs with the course's forward_with_cache in place of the learner's, which has
# a check of its own: a mistake in the cached forward pass costs that check only.
generate_cache_exercise = Exercise("08_sampling", "generate_with_cache",
                                   produce_generate_cache,
                                   judge_generate_cache, defaults={"text": None},
                                   course_parts={"forward_with_cache": forward_with_cache})
check_generate_with_cache = generate_cache_exercise.checker(
    """Grade `generate_with_cache(model, input_ids, max_new_tokens)`: 50 greedy tokens, identical
    to generation without a cache; then filling the context to n_ctx exactly, and one token more
    (refused with a ValueError naming n_ctx).""")
