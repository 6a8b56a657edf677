"""Notebook 14, exercise 5: the learner's GRPO run (`train_grpo`) from the course's finetuned model
(notebook 13's), on the course's prompts, handed to the kernel as inputs; within it the course's
sample_group, reward, group_advantages and grpo_loss stand in for the learner's (they have checks
of their own). Judged on the 14 held-out questions: the exact-match accuracy of an answer sampled
at temperature 1 (the probability of the exact answer and its end marker, computed from the
policy's logits, so without sampling noise) must rise by a margin, the mean reward of the run's
batches must rise, and the KL to the frozen reference must stay bounded."""
from __future__ import annotations

import random

import torch

from graders.exercises.nb13 import tasks
from graders.exercises.nb13.gpt import GPT
from graders.exercises.nb07.runs import CountingBatches, one_thread, with_grad
from graders.exercises.nb14 import reference as ref
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import course_functions, run_learner

NOTEBOOK = "14_rl_verifiable_rewards"
RECIPE = ref.RECIPE
# Floors from the seed sweep of benchmarks/bench_rl.py (one thread, seeds 0-11).
ACCURACY_GAIN = 0.3       # held-out sampled exact-match accuracy: at least start + this
REWARD_RISE = 0.3         # mean reward of the last 10 steps' batches minus the first 10's
KL_BOUND = 2.5            # mean KL(policy || reference) per held-out answer token, in nats
PARTS = {"sample_group": ref.sample_group, "reward": ref.reward, "group_advantages": ref.group_advantages,
         "grpo_loss": ref.grpo_loss}


def stop_id() -> int:
    return tasks.model_ids()[tasks.IM_END_ID]


def prompt_batches(seed: int, steps: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The indices into tasks.TRAINING of each step's prompts [steps, size], drawn from `seed`."""
    rng = random.Random(seed)
    return torch.tensor([[rng.randrange(len(tasks.TRAINING)) for _ in range(size)] for _ in range(steps)])


def make_batch_from(indices: torch.Tensor):
    """make_batch for the run: each call, the next step's [(prompt tokens, answer)]."""
    steps = iter(indices.tolist())
    chosen = [(torch.tensor(tasks.example(q, a)[0]), a) for q, a in tasks.TRAINING]
    return CountingBatches(lambda: [chosen[i] for i in next(steps)])


def held_out_logits(model: GPT) -> torch.Tensor:
    """The model's logits on the held-out conversations, at the positions that predict a response token."""
    tokens, labels = tasks.padded([tasks.example(q, a) for q, a in tasks.HELD_OUT])
    with torch.no_grad():
        return model.eval()(tokens)[:, :-1][labels[:, 1:] != -100]


def held_out_figures(policy_logits: torch.Tensor, reference_logits: torch.Tensor) -> tuple[float, float]:
    """(sampled exact-match accuracy at temperature 1, mean per-token KL(policy || reference)) on
    the held-out questions, from the logits at their response positions."""
    tokens, labels = tasks.padded([tasks.example(q, a) for q, a in tasks.HELD_OUT])
    targets, keep = labels[:, 1:], labels[:, 1:] != -100
    log_p, log_q = policy_logits.double().log_softmax(-1), reference_logits.double().log_softmax(-1)
    picked = log_p.gather(-1, targets[keep][:, None])[:, 0]
    rows = torch.arange(len(tokens))[:, None].expand_as(keep)[keep]
    per_question = torch.zeros(len(tokens), dtype=torch.float64).index_add_(0, rows, picked).exp()
    return float(per_question.mean()), float((log_p.exp() * (log_p - log_q)).sum(-1).mean())


def run_inputs(case: Case) -> dict:
    return {**{f"sft.{k}": v for k, v in tasks.sft_weights().items()},
            "prompts": prompt_batches(case.seed, RECIPE["steps"], RECIPE["prompts"])}


def produce(train_grpo, case: Case, inputs: dict) -> dict:
    weights = {k.removeprefix("sft."): v for k, v in inputs.items() if k.startswith("sft.")}
    policy, reference = tasks.loaded(weights), tasks.loaded(weights)
    batches = make_batch_from(inputs["prompts"])
    generator = torch.Generator().manual_seed(case.seed)
    with one_thread(), course_functions(train_grpo, PARTS), torch.random.fork_rng():
        torch.manual_seed(case.seed)
        history = run_learner("train_grpo", with_grad, train_grpo, policy, reference, batches, RECIPE["steps"],
                              generator)
    try:
        history = torch.tensor([[float(r), float(k)] for r, k in history], dtype=torch.float64)
    except (TypeError, ValueError):
        raise CheckFailed("train_grpo should return its history, a list of (mean reward, mean KL) per step, of "
                          f"floats; it returned {type(history).__name__}.") from None
    return {"history": history, "batches_drawn": torch.tensor(batches.calls),
            "policy_logits": held_out_logits(policy), "reference_logits": held_out_logits(reference)}


def summary(accuracy: tuple[float, float], history: torch.Tensor, kl: float) -> str:
    first, last = float(history[:10, 0].mean()), float(history[-10:, 0].mean())
    return (f"On the {len(tasks.HELD_OUT)} held-out questions, an answer sampled at temperature 1 is exactly right "
            f"with probability {accuracy[0]:.3f} before the run and {accuracy[1]:.3f} after (the floor is the start "
            f"+ {ACCURACY_GAIN}); the batches' mean reward went from {first:.3f} (first 10 steps) to {last:.3f} (last "
            f"10; the rise's floor is {REWARD_RISE}); KL(policy || reference) per held-out answer token {kl:.3f} nats "
            f"(at most {KL_BOUND}).")


def judge(case: Case, outputs: dict) -> None:
    steps = RECIPE["steps"]
    drawn = int(outputs["batches_drawn"])
    if drawn != steps:
        raise CheckFailed(f"train_grpo drew {drawn} batches from make_batch for n_steps={steps}; draw exactly one "
                          "per step.")
    reference_logits = held_out_logits(tasks.sft_model())
    if not torch.allclose(outputs["reference_logits"], reference_logits, atol=1e-4):
        raise CheckFailed("train_grpo: the reference model changed during the run. Likely mistake: the reference is "
                          "not frozen (its parameters are in the optimizer, or gradients reach it): the KL penalty "
                          "measures the policy against a fixed model; compute its log-probs under torch.no_grad().",
                          mistake="reference_not_frozen")
    history = outputs["history"]
    if history.shape != (steps, 2):
        raise CheckFailed(f"train_grpo returned a history of shape {list(history.shape)}; return one (mean reward, "
                          f"mean KL) pair per step, {steps} of them.")
    start = held_out_figures(reference_logits, reference_logits)[0]
    accuracy, kl = held_out_figures(outputs["policy_logits"], reference_logits)
    said = summary((start, accuracy), history, kl)
    if kl > KL_BOUND:
        raise CheckFailed(f"train_grpo: the policy moved far from the reference.\n  {said}\n  Is the KL penalty "
                          f"added with weight beta = {RECIPE['beta']}, and the learning rate {RECIPE['lr']}?")
    if accuracy < start + ACCURACY_GAIN:
        raise CheckFailed(f"train_grpo: held-out accuracy did not rise enough.\n  {said}\n  Hint: each step samples "
                          "a group per prompt with the policy in eval mode and no gradient, rewards each completion, "
                          "takes the group advantages, recomputes the completions' log-probs with gradient, and "
                          "steps AdamW on grpo_loss.")
    if float(history[-10:, 0].mean() - history[:10, 0].mean()) < REWARD_RISE:
        raise CheckFailed(f"train_grpo: the mean reward in your history hardly rises.\n  {said}\n  Each step's "
                          "entry should be the mean reward of that step's sampled completions.")


exercise = Exercise(NOTEBOOK, "train_grpo", produce, judge, inputs=run_inputs, defaults={"text": None},
                    describe=lambda case: f"the course's prompts (seed {case.seed})",
                    guard=Guard(supplies=(*PARTS.values(), CountingBatches, tasks.decode, tasks.model_ids)))
check_train_grpo = exercise.checker(
    "Run the learner's `train_grpo` from the course's finetuned model and grade held-out sampled accuracy, the "
    "rising reward and the KL to the reference.")
