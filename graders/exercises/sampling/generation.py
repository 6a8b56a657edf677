"""Notebook 08's `generate(model, input_ids, max_new_tokens, generator, eos_token_id,
**sampling)`: context cropping, sampling settings and stopping at the end-of-text token."""
from __future__ import annotations

import torch

from graders.exercises.sampling.reference import NEG_INF, apply_top_k, generate
from graders.exercises.small_models import markov_model, sampling_config, seeded_model
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, check_shape, require_tensor
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

EOS = 7
N_NEW = 20


def _generate_inputs(case: Case):
    model = seeded_model(sampling_config(), case.seed).eval()
    prompt = torch.randint(0, 300, (max(case.batch, 2), 6),
                           generator=torch.Generator().manual_seed(case.seed + 70))
    chain = markov_model(case.seed + 71, 10)
    chain.table[:, EOS] = -5.0
    for a, b in ((2, 5), (5, 8), (8, 3), (3, EOS)):      # greedy from 2: 5, 8, 3, end-of-text
        chain.table[a, b] = 10.0
    return model, prompt, chain, torch.tensor([[1, 2]])


def produce_generate(fn, case: Case, inputs: dict) -> dict:
    model, prompt, chain, chain_prompt = _generate_inputs(case)
    what = "generate"
    outputs = {}
    for key, seed, settings in (("greedy", 0, dict(temperature=0.0)),
                                ("a", 1, dict(top_k=5)), ("a_again", 1, dict(top_k=5)),
                                ("b", 2, dict(top_k=5))):
        copy = prompt.clone()
        try:
            outputs[key] = run_learner(what, fn, model, copy, N_NEW,
                                       torch.Generator().manual_seed(seed), **settings)
        except CheckFailed as err:
            if "not implemented" in str(err):
                raise
            raise CheckFailed(f"{err}\n  (the prompt plus {N_NEW} new tokens is longer than the "
                              f"model's n_ctx = {model.cfg.n_ctx}: did you crop the context to the "
                              "last n_ctx tokens before each forward pass?)") from None
        outputs[f"{key}_modified"] = torch.tensor(not torch.equal(copy, prompt))
    outputs["eos"] = run_learner(what, fn, chain, chain_prompt.clone(), 40,
                                 torch.Generator().manual_seed(3), eos_token_id=EOS, temperature=0.0)
    for key in ("greedy", "a", "a_again", "b", "eos"):
        require_tensor(f"generate ({key})", outputs[key])
    return outputs


def judge_generate(case: Case, outputs: dict) -> None:
    model, prompt, chain, chain_prompt = _generate_inputs(case)
    n_prompt = prompt.shape[1]
    for key in ("greedy", "a", "a_again", "b"):
        where = f"generate(model, prompt of shape {list(prompt.shape)}, max_new_tokens={N_NEW})"
        out = outputs[key]
        check_shape(where, out, (prompt.shape[0], n_prompt + N_NEW), ("batch", "position"))
        if out.dtype != torch.long:
            raise CheckFailed(f"{where}: dtype {out.dtype}; return token ids as torch.long.")
        if not torch.equal(out[:, :n_prompt], prompt):
            raise CheckFailed(f"{where}: the output must start with the prompt, then the new tokens.")
        if bool(outputs[f"{key}_modified"]):
            raise CheckFailed(f"{where}: the prompt tensor was modified in place.")
    expected = generate(model, prompt, N_NEW, None, temperature=0.0)
    if not torch.equal(outputs["greedy"], expected):
        first = int((outputs["greedy"] != expected).any(0).nonzero()[0]) - n_prompt
        why = ("Likely mistake: the context is not cropped to the LAST n_ctx tokens before each "
               "forward pass (tokens[:, -n_ctx:])." if first + n_prompt >= model.cfg.n_ctx else
               "Likely mistake: the next token must come from the logits of the LAST position, "
               "logits[:, -1].")
        raise CheckFailed(f"generate(..., temperature=0.0) differs from greedy decoding at new "
                          f"token {first} (the model's n_ctx is {model.cfg.n_ctx}, the prompt has "
                          f"{n_prompt} tokens). {why}")
    if not torch.equal(outputs["a"], outputs["a_again"]):
        raise CheckFailed("generate: the same generator seed gave different samples; pass the "
                          "generator down to the sampler.")
    if torch.equal(outputs["a"], outputs["b"]):
        raise CheckFailed("generate: different generator seeds gave the same samples at "
                          "temperature 1: it must sample, not decode greedily.")
    with torch.no_grad():
        for key in ("a", "b"):
            out = outputs[key]
            for step in range(N_NEW):
                context = out[:, :n_prompt + step][:, -model.cfg.n_ctx:]
                allowed = apply_top_k(model(context)[:, -1], 5) > NEG_INF
                token = out[:, n_prompt + step]
                if not allowed.gather(-1, token[:, None]).all():
                    raise CheckFailed(f"generate(..., top_k=5): new token {step} is not among the "
                                      "5 most likely; pass the sampling settings (top_k, top_p, "
                                      "temperature, freq_penalty) on to sample_next_token.")
    expected_eos = generate(chain, chain_prompt, 40, None, eos_token_id=EOS, temperature=0.0)
    out = outputs["eos"]
    where = f"generate(model, prompt, max_new_tokens=40, eos_token_id={EOS})"
    check_shape(where, out, (1, out.shape[-1]), ("batch", "position"))
    if not torch.equal(out, expected_eos):
        what = (f"it returned {out.shape[1] - 2} new tokens, expected {expected_eos.shape[1] - 2}: "
                f"{expected_eos[0, 2:].tolist()}")
        raise CheckFailed(f"{where}: {what}. Generation must stop right after the end-of-text "
                          "token is sampled (and include it).")


generate_exercise = Exercise("08_sampling", "generate", produce_generate, judge_generate,
                             defaults={"text": None})
check_generate = generate_exercise.checker(
    "Grade `generate(model, input_ids, max_new_tokens, generator, eos_token_id, **sampling)`.")
