"""Notebook 14, exercise 1: `sample_group(model, prompt, group_size, temperature, max_new, stop,
generator)`, judged exactly against the course's seeded sampler on the course's finetuned model
(the same generator, so the same draws): the tokens, the mask (the end marker in, what follows
out) and each token's log-probability at the sampling temperature. A mistake no catalog lists is
read from the output: identical rows, log-probs that are the tempered ones scaled, the first
position that differs."""
from __future__ import annotations

import torch

from graders.judging.compare import CheckFailed, with_fix
from graders.exercises.nb13 import tasks
from graders.exercises.nb14 import reference as ref
from graders.judging.cases import Case
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

NOTEBOOK = "14_rl_verifiable_rewards"
MAX_NEW = 6
SLIPS = {
    "untempered": "the log-probabilities are those of softmax(logits), before the temperature is applied: the "
                  "policy that sampled is softmax(logits / T), and the ratio pi / pi_old compares the same policy",
    "times_t": "the logits are multiplied by the temperature where they are divided (logits * T): softmax(logits / "
               "T) is the distribution sampled",
    "past_end": "tokens after <|im_end|> are left in the mask: a completion ends at its end marker, what follows "
                "is padding, and a loss over it trains tokens nobody sampled",
    "end_unmasked": "the end marker itself is not in the mask: <|im_end|> is a token the policy chose, and the "
                    "reward depends on it; without it in the loss the model is never taught to stop",
    "shared": "one draw is shared by the whole group: every completion is the same, so every reward is the same and "
              "every advantage 0; draw each row's token (torch.multinomial over [group_size, d_vocab])",
}


def settings(case: Case) -> tuple[int, float]:
    """(group_size, temperature) of a case: hidden cases change both."""
    return (8, 1.0) if case.seed == 0 else (6 + case.seed % 3, (0.7, 1.0, 1.2)[case.seed % 3])


def question(case: Case) -> tuple[str, str]:
    return tasks.QUESTIONS[(7 * case.seed + 3) % len(tasks.QUESTIONS)]


def sample_inputs(case: Case) -> dict:
    prompt = torch.tensor(tasks.example(*question(case))[0])
    return {**{f"sft.{k}": v for k, v in tasks.sft_weights().items()}, "prompt": prompt}


def produce(sample_group, case: Case, inputs: dict) -> dict:
    if not callable(sample_group):
        raise CheckFailed(f"sample_group: expected your function, got {sample_group!r}.")
    model = tasks.loaded({k.removeprefix("sft."): v for k, v in inputs.items() if k.startswith("sft.")})
    group_size, temperature = settings(case)
    stop = tasks.model_ids()[tasks.IM_END_ID]
    generator = torch.Generator().manual_seed(1000 + case.seed)
    got = run_learner("sample_group", sample_group, model, inputs["prompt"].clone(), group_size, temperature,
                      MAX_NEW, stop, generator)
    if not isinstance(got, tuple) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
        raise CheckFailed("sample_group should return three tensors (completions, mask, logprobs), each "
                          f"[group_size, max_new]; it returned {type(got).__name__}.")
    completions, mask, logprobs = got
    return {"completions": completions.long(), "mask": mask.bool(), "logprobs": logprobs.detach().double()}


def expected(case: Case, slip: str = "") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    group_size, temperature = settings(case)
    stop = tasks.model_ids()[tasks.IM_END_ID]
    return ref.sample_group(tasks.sft_model(), sample_inputs(case)["prompt"], group_size, temperature, MAX_NEW, stop,
                            torch.Generator().manual_seed(1000 + case.seed), slip)


def _same(got: dict, want) -> bool:
    tokens, mask, logprobs = want
    return (got["completions"].shape == tokens.shape and bool((got["completions"] == tokens).all())
            and bool((got["mask"] == mask).all()) and torch.allclose(got["logprobs"], logprobs.double(), atol=1e-4))


def judge(case: Case, outputs: dict) -> None:
    group_size, temperature = settings(case)
    prompt_length = len(sample_inputs(case)["prompt"])
    where = (f"sample_group on {question(case)[0]!r} (group_size {group_size}, temperature {temperature:g}, "
             f"max_new {MAX_NEW})")
    shape = tuple(outputs["completions"].shape)
    if shape == (group_size, prompt_length + MAX_NEW):
        raise CheckFailed(f"{where} returned completions of shape {list(shape)}; the prompt has {prompt_length} "
                          f"tokens. Likely mistake: the prompt's tokens are counted: return the completion alone, "
                          f"[group_size, max_new] = [{group_size}, {MAX_NEW}] (the prompt is given, not sampled).",
                          mistake="prompt_included")
    if any(tuple(outputs[k].shape) != (group_size, MAX_NEW) for k in outputs):
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in outputs.items())
        raise CheckFailed(f"{where} returned {shapes}; each should be [group_size, max_new] = [{group_size}, "
                          f"{MAX_NEW}] (shorter completions padded, their padding masked out).")
    want = expected(case)
    if _same(outputs, want):
        return
    for slip, description in SLIPS.items():
        if _same(outputs, expected(case, slip)):
            raise CheckFailed(f"{where} differs from the course's sampler with the same generator. "
                              f"Likely mistake: {description}.", mistake=slip)
    tokens, mask, logprobs = want
    if group_size > 1 and bool((outputs["completions"] == outputs["completions"][:1]).all()):
        raise CheckFailed(f"{where}: all {group_size} completions are identical. Likely mistake: {SLIPS['shared']}.",
                          mistake="shared")
    wrong = (outputs["completions"] != tokens) | (outputs["mask"] != mask)
    if wrong.any():
        g, i = (int(x) for x in wrong.nonzero()[0])
        raise CheckFailed(with_fix(
            f"{where}: completion {g} differs at position {i}: token {int(outputs['completions'][g, i])} (mask "
            f"{bool(outputs['mask'][g, i])}), the course's sampler draws {int(tokens[g, i])} (mask {bool(mask[g, i])}) "
            "from the same generator. The draws match only when each step makes one torch.multinomial call over "
            "[group_size, d_vocab] with the generator given, on softmax(logits[:, -1] / temperature); a finished "
            "completion holds `stop` from there on, mask False.",
            "probs = (model(tokens)[:, -1] / temperature).softmax(-1); "
            "token = torch.multinomial(probs, 1, generator=generator)[:, 0]"))
    got, logprobs = outputs["logprobs"], logprobs.double()
    live = mask
    ratio = got[live] / logprobs[live]
    g, i = (int(x) for x in (~torch.isclose(got, logprobs, atol=1e-4)).nonzero()[0])
    head = (f"{where}: the tokens and the mask are right; completion {g}'s log-probability at position {i} is "
            f"{float(got[g, i]):.5g}, the sampling policy's {float(logprobs[g, i]):.5g}.")
    if bool((got[~live] != 0).any()):
        raise CheckFailed(f"{head} The padding's log-probabilities should be 0 (nothing was sampled there).",
                          mistake="padding_logprobs")
    if ratio.isfinite().all() and float(ratio.max() - ratio.min()) < 1e-4:
        raise CheckFailed(f"{head} Every log-probability is {float(ratio[0]):.4g} times the course's: a scale on the "
                          "log-probabilities? The log-probability of the token drawn is log_softmax(logits / T) "
                          "at that token.")
    raise CheckFailed(f"{head}\n  Hint: the log-probability under the sampling policy is log_softmax(logits / "
                      "temperature) gathered at the drawn token (torch.gather), the same distribution you drew from.")


exercise = Exercise(NOTEBOOK, "sample_group", produce, judge, inputs=sample_inputs,
                    defaults={"text": None}, describe=lambda case: f"the course's finetuned model (seed {case.seed})")
check_sample_group = exercise.checker(
    "Grade `sample_group(model, prompt, group_size, temperature, max_new, stop, generator)` exactly against the "
    "course's seeded sampler on the course's finetuned model: tokens, mask and log-probabilities.")
