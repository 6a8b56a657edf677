"""Notebook 07, exercise 6: `generate(model, tokens, n_new_tokens, generator, temperature)`,
sampling a continuation of a text prompt."""
from __future__ import annotations

import torch

from graders.exercises.small_models import seeded_model, text_sampling_config
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, check_shape, require_tensor
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

PROMPT = " O Romeo, Romeo, wherefore art thou Romeo?"
N_NEW = 12


def _prompt(case: Case) -> torch.Tensor:
    from graders.reference.tokenizer import gpt2_encoding

    text = case.text if case.text is not None else PROMPT
    return torch.tensor([gpt2_encoding().encode_ordinary(text)], dtype=torch.long)


def greedy(model, tokens: torch.Tensor, n_new: int) -> torch.Tensor:
    """The reference greedy continuation, cropping the context to the last n_ctx tokens."""
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(tokens[:, -model.cfg.n_ctx:])
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=-1)
    return tokens


def produce_generate(fn, case: Case, inputs: dict) -> dict:
    model = seeded_model(text_sampling_config(), case.seed).eval()
    prompt = _prompt(case)
    outputs = {}
    for key, seed, temperature in (("a", 1, 1.0), ("a_again", 1, 1.0), ("b", 2, 1.0),
                                   ("cold", 3, 1e-4)):
        copy = prompt.clone()
        try:
            out = run_learner("generate", fn, model, prompt, N_NEW,
                              torch.Generator().manual_seed(seed), temperature)
        except CheckFailed as err:
            if "not implemented" in str(err):
                raise
            raise CheckFailed(f"{err}\n  (the prompt plus {N_NEW} new tokens is longer than the "
                              f"model's n_ctx = {model.cfg.n_ctx}: did you crop the context to "
                              f"the last n_ctx tokens before each forward pass?)") from None
        require_tensor("generate(...)", out)
        outputs[key] = out
        outputs[f"modified_{key}"] = torch.tensor(not torch.equal(copy, prompt))
    return outputs


def judge_generate(case: Case, outputs: dict) -> None:
    prompt = _prompt(case)
    length = prompt.shape[1] + N_NEW
    for key in ("a", "a_again", "b", "cold"):
        out = outputs[key]
        where = f"generate(model, prompt of {prompt.shape[1]} tokens, {N_NEW}, generator)"
        check_shape(where, out, (1, length), ("batch", "position"))
        if out.dtype != torch.long:
            raise CheckFailed(f"{where}: dtype {out.dtype}; return token ids as torch.long.")
        if int(out.min()) < 0 or int(out.max()) >= 50257:
            raise CheckFailed(f"{where}: token ids outside [0, 50256].")
        if not torch.equal(out[:, :prompt.shape[1]], prompt):
            raise CheckFailed(f"{where}: the output must start with the prompt, followed by the "
                              "new tokens.")
        if bool(outputs[f"modified_{key}"]):
            raise CheckFailed(f"{where}: the prompt tensor was modified in place.")
    from graders.reference.tokenizer import gpt2_encoding

    gpt2_encoding().decode(outputs["a"][0].tolist())   # every valid id decodes
    if not torch.equal(outputs["a"], outputs["a_again"]):
        raise CheckFailed("generate: the same generator seed gave different samples; draw with "
                          "torch.multinomial(probs, 1, generator=generator).")
    if torch.equal(outputs["a"], outputs["b"]):
        raise CheckFailed("generate: different generator seeds gave the same continuation; "
                          "sample from the distribution (torch.multinomial with the generator) "
                          "instead of always taking the most likely token.")
    model = seeded_model(text_sampling_config(), case.seed).eval()
    expected = greedy(model, prompt, N_NEW)
    if not torch.equal(outputs["cold"], expected):
        first = int((outputs["cold"] != expected).any(0).nonzero()[0])
        raise CheckFailed(
            f"generate at temperature 1e-4 should pick the most likely token every time, but token "
            f"{first} differs from the greedy choice. Likely mistakes: sampling from the logits of "
            f"the wrong position (the next token comes from logits[:, -1]); multiplying by the "
            f"temperature instead of dividing; or not cropping the context to the last n_ctx "
            f"tokens.")


generate_exercise = Exercise("07_training", "generate", produce_generate, judge_generate,
                             defaults={"text": PROMPT})
check_generate = generate_exercise.checker(
    "Grade `generate(model, tokens, n_new_tokens, generator, temperature)`.")
