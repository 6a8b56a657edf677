"""Notebook 08's `generate(model, input_ids, max_new_tokens, generator, eos_token_id,
**sampling)`: context cropping, sampling settings, and end-of-text, each row on its own.

Cropping is to the model's own n_ctx: a hidden case runs a model with another n_ctx than the
visible one's, and a crop to a literal (the visible model's 16, the notebook-07 model's 64,
GPT-2's 1024) is named with the length the learner's code fed the model.

The end-of-text rule: once a row has sampled `eos_token_id` (kept), its later tokens are
`eos_token_id` too (padding), and generation stops when every row has finished (or after
`max_new_tokens`). It is checked on a tiny Markov chain whose rows end at different steps.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from graders.exercises.common.diagnosis import crash, is_crash, judge_generated
from graders.exercises.nb08.reference import GENERATION_PARTS, NEG_INF, apply_top_k, generate
from graders.exercises.common.small_models import fed_lengths, markov_model, sampling_config, seeded_model
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, check_shape, require_tensor
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

EOS = 7
N_NEW = 20
EOS_MAX_NEW = 40
CHAIN_STARTS = (2, 8, 5)      # greedy from 2: 5, 8, 3, EOS (4 new tokens); from 8: 2; from 5: 3
# The context of the model that tells a crop to a literal from none (code that crashes past
# n_ctx): longer than any context a literal could have been written for (GPT-2's 1024).
LONG_CONTEXT = 2048


def _generate_inputs(case: Case):
    """The sampling model (with the case's n_ctx, if it sets one), its prompt, and the Markov
    chain of the end-of-text runs with its prompt."""
    model = seeded_model(case.config(sampling_config()), case.seed).eval()
    prompt = torch.randint(0, 300, (max(case.batch, 2), 6),
                           generator=torch.Generator().manual_seed(case.seed + 70))
    chain = markov_model(case.seed + 71, 10)
    chain.table[:, EOS] = -5.0
    for a, b in ((2, 5), (5, 8), (8, 3), (3, EOS)):
        chain.table[a, b] = 10.0
    return model, prompt, chain, torch.tensor([[1, 2]])


def _eos_batch_prompt(case: Case) -> torch.Tensor:
    """A batch whose rows reach end-of-text at different steps (after 4, 2, 3, 4, ... tokens)."""
    rows = max(case.batch, 2)
    return torch.tensor([[1, CHAIN_STARTS[i % len(CHAIN_STARTS)]] for i in range(rows)])


RUNS = (("greedy", 0, dict(temperature=0.0)), ("greedy_again", 1, dict(temperature=0.0)),
        ("a", 1, dict(top_k=5)), ("a_again", 1, dict(top_k=5)), ("b", 2, dict(top_k=5)))


def _settings(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def produce_generate(fn, case: Case, inputs: dict) -> dict:
    model, prompt, chain, chain_prompt = _generate_inputs(case)
    outputs = {}
    for key, seed, settings in RUNS:
        copy = prompt.clone()
        try:
            with fed_lengths(model) as fed:
                outputs[key] = run_learner("generate", fn, model, copy, N_NEW,
                                           torch.Generator().manual_seed(seed), **settings)
        except CheckFailed as failure:
            if not is_crash(failure):
                raise
            raise _explain_crash(fn, model, prompt, seed, settings, failure) from failure.__cause__
        outputs[f"{key}_modified"] = torch.tensor(not torch.equal(copy, prompt))
        if key == "greedy":
            outputs["greedy_fed"] = torch.tensor(fed, dtype=torch.long)
    for key, start in (("eos", chain_prompt), ("eos_batch", _eos_batch_prompt(case))):
        try:
            outputs[key] = run_learner("generate", fn, chain, start.clone(), EOS_MAX_NEW,
                                       torch.Generator().manual_seed(3), eos_token_id=EOS,
                                       temperature=0.0)
        except CheckFailed as failure:
            if not is_crash(failure):
                raise
            raise crash("generate", failure,
                        f"a prompt of shape {list(start.shape)} with eos_token_id={EOS}, "
                        f"temperature=0.0 (rows that end at different steps)" if len(start) > 1 else
                        f"a prompt of shape {list(start.shape)} with eos_token_id={EOS}, temperature=0.0",
                        "" if len(start) == 1 else
                        Mistake("no_finished_mask", "a row finished before the others: keep a per-row "
                                "`finished` mask and keep every row the same length (pad finished rows with "
                                "eos_token_id)")) from failure.__cause__
    for key in [k for k, _, _ in RUNS] + ["eos", "eos_batch"]:
        require_tensor(f"generate ({key})", outputs[key])
    return outputs


def _explain_crash(fn, model, prompt, seed, settings, failure) -> CheckFailed:
    """A crash on the main runs: a run that fits the context tells whether cropping is the cause."""
    fits = model.cfg.n_ctx - prompt.shape[1]
    on = (f"a prompt of shape {list(prompt.shape)}, max_new_tokens={N_NEW}, {_settings(settings)} "
          f"(the model's n_ctx is {model.cfg.n_ctx})")
    try:
        run_learner("generate", fn, model, prompt.clone(), fits, torch.Generator().manual_seed(seed),
                    **settings)
    except CheckFailed:
        return crash("generate", failure, on)     # it crashes within the context too: not cropping
    cropped_to = _literal_crop(fn, settings)
    if cropped_to:
        return crash("generate", failure, on,
                     Mistake("crop_to_literal", f"the context is cropped to a literal {cropped_to} tokens, not "
                             f"to the model's n_ctx ({model.cfg.n_ctx} here): feed it tokens[:, -model.cfg.n_ctx:]"))
    return crash("generate", failure, on,
                 Mistake("no_crop", f"it runs for {fits} new tokens (prompt + new = n_ctx) and crashes beyond: "
                         f"the context is not cropped. Feed the model at most the last n_ctx tokens, "
                         f"tokens[:, -model.cfg.n_ctx:], before each forward pass"))


def _literal_crop(fn, settings: dict) -> int | None:
    """The length the learner's generate crops to whatever the model's n_ctx: what it feeds a
    model of LONG_CONTEXT positions given a prompt that long (None when it feeds all of it)."""
    model = seeded_model(replace(sampling_config(), n_ctx=LONG_CONTEXT), 0).eval()
    prompt = torch.randint(0, model.cfg.d_vocab, (1, LONG_CONTEXT), generator=torch.Generator().manual_seed(0))
    with fed_lengths(model) as fed:
        try:
            run_learner("generate", fn, model, prompt, 1, torch.Generator().manual_seed(0), **settings)
        except CheckFailed:
            return None
    return fed[0] if fed and fed[0] < LONG_CONTEXT else None


@torch.no_grad()
def greedy_variant(model, prompt: torch.Tensor, n_new: int, position: int = -1,
                   crop: str = "last") -> torch.Tensor:
    """Greedy decoding as a known wrong `generate` does it (for diagnosis)."""
    tokens = prompt
    for _ in range(n_new):
        context = tokens[:, -model.cfg.n_ctx:] if crop == "last" else tokens[:, :model.cfg.n_ctx]
        tokens = torch.cat([tokens, model(context)[:, position].argmax(-1, keepdim=True)], dim=-1)
    return tokens


def judge_generate(case: Case, outputs: dict) -> None:
    model, prompt, chain, chain_prompt = _generate_inputs(case)
    n_prompt = prompt.shape[1]
    for key, _, settings in RUNS:
        where = f"generate(model, prompt of shape {list(prompt.shape)}, max_new_tokens={N_NEW}, {_settings(settings)})"
        judge_generated(where, outputs[key], prompt, N_NEW)
        if bool(outputs[f"{key}_modified"]):
            raise CheckFailed(f"{where}: the prompt tensor was modified in place.")
    _judge_greedy(model, prompt, outputs)
    if not torch.equal(outputs["a"], outputs["a_again"]):
        raise CheckFailed("generate(..., top_k=5): the same generator seed gave different samples. "
                          "Likely mistake: the generator is not passed down to the sampler "
                          "(sample_next_token(..., generator, ...)).", mistake="generator_not_passed")
    if torch.equal(outputs["a"], outputs["b"]):
        raise CheckFailed("generate(..., top_k=5): different generator seeds gave the same samples at "
                          "temperature 1. Likely mistake: it decodes greedily instead of sampling; "
                          "choose each token with sample_next_token and the generator.",
                          mistake="greedy_instead_of_sampling")
    with torch.no_grad():
        for key in ("a", "b"):
            out = outputs[key]
            for step in range(N_NEW):
                context = out[:, :n_prompt + step][:, -model.cfg.n_ctx:]
                allowed = apply_top_k(model(context)[:, -1], 5) > NEG_INF
                token = out[:, n_prompt + step]
                if not allowed.gather(-1, token[:, None]).all():
                    raise CheckFailed(f"generate(..., top_k=5): new token {step} is not among the "
                                      "5 most likely. Likely mistake: the sampling settings (top_k, "
                                      "top_p, temperature, freq_penalty) are not passed on to "
                                      "sample_next_token.", mistake="settings_not_passed")
    _judge_eos(chain, chain_prompt, outputs["eos"])
    _judge_eos_batch(chain, _eos_batch_prompt(case), outputs["eos_batch"])


def _judge_greedy(model, prompt: torch.Tensor, outputs: dict) -> None:
    """Greedy generation against the course's. The lengths the learner's code ran the model on
    ("greedy_fed") show a crop to a literal shorter than the model's n_ctx."""
    n_prompt, n_ctx = prompt.shape[1], model.cfg.n_ctx
    fed = outputs.get("greedy_fed")
    expected = generate(model, prompt, N_NEW, None, temperature=0.0)
    out = outputs["greedy"]
    if torch.equal(out, expected):
        return
    first = int((out != expected).any(0).nonzero()[0]) - n_prompt
    head = (f"generate(..., temperature=0.0) differs from greedy decoding at new token {first} "
            f"(the model's n_ctx is {n_ctx}, the prompt has {n_prompt} tokens).")
    if not torch.equal(out, outputs["greedy_again"]):
        why = Mistake("settings_not_passed", "the sampling settings do not reach sample_next_token: at "
                      "temperature=0.0 two generators with different seeds gave different tokens, so it still "
                      "samples. Pass **sampling on: sample_next_token(tokens, logits, generator, **sampling).")
    elif torch.equal(out, greedy_variant(model, prompt, N_NEW, position=0)):
        why = Mistake("first_position_logits",
                      "the next token must come from the logits of the LAST position, logits[:, -1].")
    elif torch.equal(out, greedy_variant(model, prompt, N_NEW, crop="first")):
        why = Mistake("crop_first_tokens", "the context is cropped to the FIRST n_ctx tokens (tokens[:, :n_ctx]); "
                      "feed the model the LAST n_ctx tokens, tokens[:, -n_ctx:], the ones the next token follows.")
    elif fed is not None and fed.numel() and n_prompt < int(fed.max()) < min(n_ctx, n_prompt + N_NEW - 1):
        why = Mistake("crop_to_literal", f"the context is cropped to a literal {int(fed.max())} tokens, not to the "
                      f"model's n_ctx ({n_ctx} here): feed it tokens[:, -model.cfg.n_ctx:].")
    elif first + n_prompt >= n_ctx:
        why = Mistake("no_crop", f"the first wrong token is the first one after the sequence outgrows n_ctx = "
                      f"{n_ctx}: the context is not cropped to the last n_ctx tokens (tokens[:, -n_ctx:]).")
    else:
        raise CheckFailed(f"{head} Run the model on the tokens so far, take logits[:, -1] and choose "
                          "with sample_next_token(tokens, logits, generator, **sampling).")
    raise CheckFailed(f"{head} Likely mistake: {why}", mistake=why.key)


def _judge_eos(chain, chain_prompt: torch.Tensor, out: torch.Tensor) -> None:
    expected = generate(chain, chain_prompt, EOS_MAX_NEW, None, eos_token_id=EOS, temperature=0.0)
    where = f"generate(model, prompt, max_new_tokens={EOS_MAX_NEW}, eos_token_id={EOS}, temperature=0.0)"
    check_shape(where, out, (1, out.shape[-1]), ("batch", "position"))
    if torch.equal(out, expected):
        return
    n_new, n_expected = out.shape[1] - 2, expected.shape[1] - 2
    head = f"{where}: {n_new} new tokens, expected {n_expected}: {expected[0, 2:].tolist()}."
    if out.shape[1] == expected.shape[1] - 1 and torch.equal(out, expected[:, :-1]):
        why = Mistake("eos_dropped", "the end-of-text token itself is dropped: append it, then stop.")
    elif n_new == EOS_MAX_NEW and torch.equal(out[:, :expected.shape[1]], expected):
        why = Mistake("no_stop_at_eos", "generation never stops at end-of-text: stop as soon as the token just "
                      "sampled is eos_token_id (keeping it).")
    else:
        raise CheckFailed(f"{head} Generation must stop right after the end-of-text token is sampled "
                          "(and include it).")
    raise CheckFailed(f"{head} Likely mistake: {why}", mistake=why.key)


def _judge_eos_batch(chain, start: torch.Tensor, out: torch.Tensor) -> None:
    expected = generate(chain, start, EOS_MAX_NEW, None, eos_token_id=EOS, temperature=0.0)
    rows, n_prompt = start.shape
    ends = [int((expected[r, n_prompt:] == EOS).nonzero()[0]) + 1 for r in range(rows)]
    where = (f"generate(model, a batch of {rows} prompts whose rows reach end-of-text after "
             f"{', '.join(map(str, ends))} new tokens, eos_token_id={EOS}, temperature=0.0)")
    rule = ("each row stops on its own: keep a per-row `finished` mask, pad a finished row with "
            "eos_token_id, and stop when every row has finished.")
    require_tensor(where, out)
    if out.ndim == 2 and out.shape[0] == rows and out.shape[1] != expected.shape[1]:
        n_new = out.shape[1] - n_prompt
        if n_new == min(ends):
            why = Mistake("stops_at_first_eos", f"generation stopped as soon as one row reached end-of-text "
                          f"(after {n_new} new tokens), while the others had not: {rule}")
        elif n_new == EOS_MAX_NEW:
            why = Mistake("stops_only_on_same_step", "generation went on to max_new_tokens although every row "
                          "had reached end-of-text (it stops only when all rows sample it at the same step): "
                          + rule)
        else:
            why = Mistake("stops_at_wrong_step", f"it ran {n_new} steps; the last row ends after {max(ends)}: "
                          + rule)
        raise CheckFailed(f"{where}: shape {list(out.shape)}, expected {list(expected.shape)}. "
                          f"Likely mistake: {why}", mistake=why.key)
    check_shape(where, out, tuple(expected.shape), ("batch", "position"))
    if torch.equal(out, expected):
        return
    for r in range(rows):
        if torch.equal(out[r], expected[r]):
            continue
        end = n_prompt + ends[r]
        if torch.equal(out[r, :end], expected[r, :end]):
            after = out[r, end:]
            if bool((after == after[0]).all()) and int(after[0]) != EOS:
                why = Mistake("pad_not_eos", f"finished rows are padded with {int(after[0])}; pad them with "
                              f"eos_token_id ({EOS}), so that a finished row only ever repeats end-of-text.")
            else:
                why = Mistake("row_continues_after_eos", f"row {r} kept generating after its end-of-text token "
                              f"({after.tolist()}): " + rule)
            raise CheckFailed(f"{where}: row {r} is {out[r, n_prompt:].tolist()} after the prompt, "
                              f"expected {expected[r, n_prompt:].tolist()}. Likely mistake: {why}",
                              mistake=why.key)
        raise CheckFailed(f"{where}: row {r} is {out[r, n_prompt:].tolist()} after the prompt, expected "
                          f"{expected[r, n_prompt:].tolist()} (greedy decoding, then end-of-text "
                          "padding).")


# generate runs with the course's sample_next_token (and its parts) in place of the learner's,
# which have checks of their own: a mistake in one costs that check only.
generate_exercise = Exercise("08_sampling", "generate", produce_generate,
                             judge_generate, defaults={"text": None}, course_parts=GENERATION_PARTS)
check_generate = generate_exercise.checker(
    "Grade `generate(model, input_ids, max_new_tokens, generator, eos_token_id, **sampling)`.")
