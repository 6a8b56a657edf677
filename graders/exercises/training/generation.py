"""Notebook 07, exercise 6: `generate(model, tokens, n_new_tokens, generator, temperature)`,
sampling a continuation of a text prompt."""
from __future__ import annotations

import torch

from graders.exercises.diagnosis import (crash, diagnosis_first, is_crash, judge_generated,
                                         judge_randomness)
from graders.exercises.small_models import seeded_model, text_sampling_config
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, require_tensor
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

PROMPT = " O Romeo, Romeo, wherefore art thou Romeo?"
N_NEW = 12
# (key, generator seed, temperature). "hot" tells dividing by the temperature from multiplying:
# at 1e4 a division samples almost uniformly, a multiplication decodes greedily.
RUNS = (("a", 1, 1.0), ("a_again", 1, 1.0), ("b", 2, 1.0), ("cold", 3, 1e-4),
        ("cold_again", 4, 1e-4), ("hot", 5, 1e4))


def _prompt(case: Case) -> torch.Tensor:
    from graders.reference.tokenizer import gpt2_encoding

    text = case.text if case.text is not None else PROMPT
    return torch.tensor([gpt2_encoding().encode_ordinary(text)], dtype=torch.long)


def greedy(model, tokens: torch.Tensor, n_new: int, position: int = -1, crop: bool = True) -> torch.Tensor:
    """The reference greedy continuation, cropping the context to the last n_ctx tokens (or, for
    diagnosis, what a known wrong one gives: another `position`, no cropping)."""
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(tokens[:, -model.cfg.n_ctx:] if crop else tokens)
            tokens = torch.cat([tokens, logits[:, position].argmax(-1, keepdim=True)], dim=-1)
    return tokens


def _explain_crash(fn, model, prompt, temperature, failure) -> CheckFailed:
    fits = model.cfg.n_ctx - prompt.shape[1]
    on = (f"a prompt of {prompt.shape[1]} tokens, n_new_tokens={N_NEW}, temperature={temperature:g} "
          f"(the model's n_ctx is {model.cfg.n_ctx})")
    if fits >= 1:
        try:
            run_learner("generate", fn, model, prompt.clone(), fits, torch.Generator().manual_seed(0),
                        temperature)
        except CheckFailed:
            return crash("generate", failure, on)
        return crash("generate", failure, on,
                     f"it runs for {fits} new tokens (prompt + new = n_ctx) and crashes beyond: the "
                     "context is not cropped. Feed the model at most the last n_ctx tokens, "
                     "tokens[:, -model.cfg.n_ctx:], before each forward pass")
    return crash("generate", failure, on)


def produce_generate(fn, case: Case, inputs: dict) -> dict:
    model = seeded_model(text_sampling_config(), case.seed).eval()
    prompt = _prompt(case)
    outputs = {}
    state = torch.get_rng_state()
    for key, seed, temperature in RUNS:
        copy = prompt.clone()
        try:
            out = run_learner("generate", fn, model, prompt, N_NEW,
                              torch.Generator().manual_seed(seed), temperature)
        except CheckFailed as failure:
            if not is_crash(failure):
                raise
            raise _explain_crash(fn, model, prompt, temperature, failure) from failure.__cause__
        require_tensor("generate(...)", out)
        outputs[key] = out
        outputs[f"modified_{key}"] = torch.tensor(not torch.equal(copy, prompt))
    outputs["global_rng_used"] = torch.tensor(not torch.equal(state, torch.get_rng_state()))
    torch.set_rng_state(state)
    return outputs


def judge_generate(case: Case, outputs: dict) -> None:
    prompt = _prompt(case)
    for key, _, temperature in RUNS:
        out = outputs[key]
        where = (f"generate(model, prompt of {prompt.shape[1]} tokens, {N_NEW}, generator, "
                 f"temperature={temperature:g})")
        judge_generated(where, out, prompt, N_NEW)
        if int(out.min()) < 0 or int(out.max()) >= 50257:
            raise CheckFailed(f"{where}: token ids outside [0, 50256].")
        if bool(outputs[f"modified_{key}"]):
            raise CheckFailed(f"{where}: the prompt tensor was modified in place.")
    from graders.reference.tokenizer import gpt2_encoding

    gpt2_encoding().decode(outputs["a"][0].tolist())   # every valid id decodes
    model = seeded_model(text_sampling_config(), case.seed).eval()
    expected = greedy(model, prompt, N_NEW)
    judge_randomness("generate", outputs, "continuations",
                     "torch.multinomial(probs, 1, generator=generator)",
                     {"always takes the most likely token (argmax), whatever the temperature": expected,
                      "takes the most likely token of the FIRST position's logits": greedy(
                          model, prompt, N_NEW, position=0)})
    cold = outputs["cold"]
    if torch.equal(cold, expected):
        return
    first = int((cold != expected).any(0).nonzero()[0]) - prompt.shape[1]
    head = (f"generate at temperature 1e-4 should pick the most likely token every time, but new "
            f"token {first} differs from the greedy choice.")
    if torch.equal(outputs["hot"], expected):
        why = ("the logits are multiplied by the temperature: divide them (logits / temperature), "
               "so that a low temperature sharpens the distribution (at 1e4 your generate decodes "
               "greedily, at 1e-4 it samples almost uniformly).")
    elif not torch.equal(cold, outputs["cold_again"]):
        why = ("the temperature argument is not used: at 1e-4 two generators with different seeds "
               "gave different tokens, as at temperature 1. Divide the logits by it.")
    elif torch.equal(cold, greedy(model, prompt, N_NEW, position=0)):
        why = "the next token must come from the logits of the LAST position, logits[:, -1]."
    elif first + prompt.shape[1] >= model.cfg.n_ctx:
        why = (f"the first wrong token comes once the sequence outgrows n_ctx = {model.cfg.n_ctx}: "
               "the context is not cropped to the last n_ctx tokens (tokens[:, -model.cfg.n_ctx:]).")
    else:
        raise CheckFailed(f"{head} Run the model on the (cropped) tokens so far, take logits[:, -1], "
                          "divide by the temperature, softmax and draw with torch.multinomial.")
    raise CheckFailed(f"{head} Likely mistake: {why}")


generate_exercise = Exercise("07_training", "generate", produce_generate, diagnosis_first(judge_generate),
                             defaults={"text": PROMPT})
check_generate = generate_exercise.checker(
    "Grade `generate(model, tokens, n_new_tokens, generator, temperature)`.")
