"""Notebook 13, exercises 4 and 6: the learner's finetuning run (`finetune`) and preference run
(`train_dpo`), each on the course's base (or finetuned) model and the course's batches, handed to
the kernel as inputs; within them the course's LoRA, loss and DPO functions stand in for the
learner's (they have checks of their own). Judged by held-out results: exact answers after
finetuning, preference accuracy and a rising reward margin after DPO."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graders.integrity.library_kernels import CROSS_ENTROPY_RUNS
from graders.exercises.nb13 import reference as ref
from graders.exercises.nb13 import tasks
from graders.exercises.nb13.gpt import GPT, greedy
from graders.exercises.nb07.runs import CountingBatches, one_thread, with_grad
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import course_functions, run_learner

NOTEBOOK = "13_post_training"
# Floors from the seed sweep of benchmarks/bench_post_training.py (one thread, seeds 0-11): the
# course's finetuning reaches 79-100% exact held-out answers (the base model 0%, a loop trained on
# the prompt 0%), the held-out prompts' loss stays above 9 (below 2 when trained on the prompt's
# tokens); the preference run prefers 69-88% of the held-out pairs the right way, its margin ending
# at 1.6-3.0, for the solution's loop and for one with four forward passes a step alike.
SFT_STEPS, SFT_BATCH, SFT_FLOOR = 400, 16, 0.6
PROMPT_LEARNED = 4.0
DPO_STEPS, DPO_BATCH, DPO_BETA, DPO_FLOOR, DPO_MARGIN = 120, 16, 1.0, 0.6, 0.5
PROBES = (0, 40, 80, 120)                    # after how many steps the preference run is measured
# The functions each run calls that have checks of their own, under the notebook's names.
SFT_PARTS = {"LoRALinear": ref.LoRALinear, "add_lora": ref.add_lora, "merge_lora": ref.merge_lora,
             "sft_loss": ref.sft_loss}
DPO_PARTS = {"sequence_logprob": ref.sequence_logprob, "dpo_loss": ref.dpo_loss}


def _model(weights: dict) -> GPT:
    return tasks.loaded(weights).train()


def _weights(inputs: dict, prefix: str) -> dict:
    return {k.removeprefix(prefix): v for k, v in inputs.items() if k.startswith(prefix)}


def _returned_model(result, given, what: str) -> torch.nn.Module:
    model = given if result is None else result
    if not isinstance(model, torch.nn.Module):
        raise CheckFailed(f"{what} returned {type(result).__name__}; return the finetuned model (or None, having "
                          "trained the model it was given in place).")
    return model


# --- Finetuning ------------------------------------------------------------------------------------

def sft_inputs(case: Case) -> dict:
    tokens, labels = tasks.sft_batches(case.seed, SFT_STEPS, SFT_BATCH)
    probe_tokens, probe_labels = tasks.padded([tasks.example(q, a) for q, a in tasks.HELD_OUT])
    prompts = [tasks.example(q, a)[0] for q, a in tasks.HELD_OUT]
    width = max(map(len, prompts))
    return {**{f"base.{k}": v for k, v in tasks.base_weights().items()}, "tokens": tokens, "labels": labels,
            "probe_tokens": probe_tokens, "probe_labels": probe_labels,
            "prompts": torch.tensor([p + [0] * (width - len(p)) for p in prompts]),
            "prompt_lengths": torch.tensor([len(p) for p in prompts])}


def _answers(model, inputs: dict) -> torch.Tensor:
    """The model's greedy answers to the held-out prompts, padded with -1: [questions, 4]."""
    prompts = [row[:n].tolist() for row, n in zip(inputs["prompts"], inputs["prompt_lengths"].tolist())]
    stop = tasks.model_ids()[tasks.IM_END_ID]
    found = greedy(model, prompts, stop, 4)
    return torch.tensor([a + [-1] * (4 - len(a)) for a in found])


def produce_finetune(finetune, case: Case, inputs: dict) -> dict:
    base = _model(_weights(inputs, "base."))
    base_logits = run_learner("the base model", base.eval(), inputs["probe_tokens"])
    steps = iter(zip(inputs["tokens"], inputs["labels"]))
    batches = CountingBatches(lambda: next(steps))
    with one_thread(), course_functions(finetune, SFT_PARTS), torch.random.fork_rng():
        torch.manual_seed(case.seed)     # LoRA's A is drawn from it: the same run in every kernel
        result = run_learner("finetune", with_grad, finetune, base, batches, SFT_STEPS)
    model = _returned_model(result, base, "finetune").eval()
    with one_thread():
        tuned_logits = run_learner("your finetuned model", model, inputs["probe_tokens"])
        answers = run_learner("your finetuned model", _answers, model, inputs)
    return {"base_logits": base_logits, "tuned_logits": tuned_logits, "answers": answers,
            "batches_drawn": torch.tensor(batches.calls)}


def _losses(logits: torch.Tensor, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """(mean loss on the response tokens, on the prompt tokens) of held-out conversations."""
    per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), tokens[:, 1:].flatten(),
                                reduction="none").reshape(tokens[:, 1:].shape)
    response = labels[:, 1:] != -100
    first = (labels != -100).int().argmax(1, keepdim=True)             # where each response starts
    prompt = torch.arange(1, tokens.shape[1]) < first                     # the targets before it
    return float(per_token[response].mean()), float(per_token[prompt].mean())


def finetune_figures(outputs: dict) -> tuple[list[str], float, tuple[float, float], tuple[float, float]]:
    """What a finetuning run reached: the answers said to the held-out questions, the share exactly
    right, and (response, prompt) losses on them before and after."""
    probe_tokens, probe_labels = tasks.padded([tasks.example(q, a) for q, a in tasks.HELD_OUT])
    said = [tasks.decode([t for t in row.tolist() if t >= 0]) for row in outputs["answers"]]
    return (said, tasks.exact_match(said), _losses(outputs["base_logits"], probe_tokens, probe_labels),
            _losses(outputs["tuned_logits"], probe_tokens, probe_labels))


def judge_finetune(case: Case, outputs: dict) -> None:
    drawn = int(outputs["batches_drawn"])
    if drawn != SFT_STEPS:
        raise CheckFailed(f"finetune drew {drawn} batches from make_batch for n_steps={SFT_STEPS}; draw exactly one "
                          "per step.")
    said, accuracy, before, after = finetune_figures(outputs)
    right = round(accuracy * len(tasks.HELD_OUT))
    summary = (f"On the {len(tasks.HELD_OUT)} held-out questions: {right} exact answers ({100 * accuracy:.1f}%; "
               f"the floor is {100 * SFT_FLOOR:.0f}%); loss on the response tokens {before[0]:.3f} before, "
               f"{after[0]:.3f} after; "
               f"on the prompt tokens {before[1]:.3f} before, {after[1]:.3f} after. Answers: "
               + ", ".join(f"{q!r} -> {s!r}" for (q, _), s in list(zip(tasks.HELD_OUT, said))[:4]) + ", ...")
    if after[1] < PROMPT_LEARNED:
        raise CheckFailed(f"finetune: the loss on the held-out prompts' tokens fell to {after[1]:.2f}. Likely mistake: "
                          "the prompt is trained too: the loss is computed against the tokens, not the labels "
                          f"(sft_loss(logits, labels)).\n  {summary}", mistake="prompt_trained")
    if not after[0] < before[0] - 0.5:
        raise CheckFailed(f"finetune: the loss on the held-out responses did not fall (is the optimizer stepping, on "
                          f"the LoRA factors, with the loss of the batch's labels?).\n  {summary}")
    if accuracy < SFT_FLOOR:
        raise CheckFailed(f"finetune: the tuned model answers too few held-out questions exactly.\n  {summary}\n  "
                          "Hint: the recipe above (r 8, alpha 16, AdamW at 3e-3, one batch per step) reaches the "
                          "floor; an answer counts when it is right and ends with <|im_end|>.")


finetune_exercise = Exercise(NOTEBOOK, "finetune", produce_finetune, judge_finetune,
                             inputs=sft_inputs,
                             defaults={"text": None}, describe=lambda case: f"the course's batches (seed {case.seed})",
                             guard=Guard(supplies=tuple(SFT_PARTS.values()) + (CountingBatches,),
                                         may_run=CROSS_ENTROPY_RUNS))   # a loop may call F.cross_entropy
check_finetune = finetune_exercise.checker(
    "Finetune the course's base model with the learner's `finetune` and grade exact answers to held-out questions.")


# --- The preference run -----------------------------------------------------------------------------

def dpo_inputs(case: Case) -> dict:
    held = tasks.preference_batches(10_000 + case.seed, 1, 3 * len(tasks.HELD_OUT), tasks.HELD_OUT)
    return {**{f"sft.{k}": v for k, v in tasks.sft_weights().items()},
            **tasks.preference_batches(case.seed, DPO_STEPS, DPO_BATCH),
            **{f"held_{k}": v[0] for k, v in held.items()}}


def _response_logits(model, inputs: dict) -> dict:
    """The model's logits at the positions that predict a held-out response token, chosen and rejected."""
    found = {}
    with torch.no_grad():
        for kind in ("chosen", "rejected"):
            tokens, mask = inputs[f"held_{kind}_tokens"], inputs[f"held_{kind}_mask"]
            found[kind] = model(tokens)[:, :-1][mask[:, 1:]]
    return found


class ProbedBatches(CountingBatches):
    """make_batch for train_dpo, measuring the policy on the held-out pairs after PROBES steps."""

    def __init__(self, draw, policy, inputs: dict):
        super().__init__(draw)
        self.policy, self.inputs, self.probes = policy, inputs, {}

    def __call__(self):
        if self.calls in PROBES:
            self.probe(self.calls)
        return super().__call__()

    def probe(self, steps: int) -> None:
        was_training = self.policy.training
        self.policy.eval()
        for kind, logits in _response_logits(self.policy, self.inputs).items():
            self.probes[f"{kind}_{steps}"] = logits
        self.policy.train(was_training)


def produce_dpo(train_dpo, case: Case, inputs: dict) -> dict:
    weights = _weights(inputs, "sft.")
    policy, reference = _model(weights), _model(weights).eval()
    keys = [k for k in inputs if k.startswith(("chosen_", "rejected_"))]
    steps = iter(range(DPO_STEPS))
    batches = ProbedBatches(lambda: (lambda i: {k: inputs[k][i] for k in keys})(next(steps)), policy, inputs)
    with one_thread(), course_functions(train_dpo, DPO_PARTS), torch.random.fork_rng():
        torch.manual_seed(case.seed)
        history = run_learner("train_dpo", with_grad, train_dpo, policy, reference, batches, DPO_STEPS, DPO_BETA)
    batches.probe(DPO_STEPS)
    try:
        rewards = torch.tensor([[float(c), float(r)] for c, r in history], dtype=torch.float64)
    except (TypeError, ValueError):
        raise CheckFailed("train_dpo should return its history, a list of (chosen reward, rejected reward) per step, "
                          f"of floats; it returned {type(history).__name__}.") from None
    reference_after = _response_logits(reference.eval(), inputs)
    return {**{f"policy_{k}": v for k, v in batches.probes.items()},
            **{f"reference_{k}": v for k, v in reference_after.items()},
            "history": rewards, "batches_drawn": torch.tensor(batches.calls)}


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per pair, the sum of the response tokens' log-probabilities from the gathered logits."""
    picked = logits.double().log_softmax(-1).gather(-1, tokens[:, 1:][mask[:, 1:]][:, None])[:, 0]
    rows = torch.arange(tokens.shape[0])[:, None].expand_as(mask[:, 1:])[mask[:, 1:]]
    return torch.zeros(tokens.shape[0], dtype=torch.float64).index_add_(0, rows, picked)


def reference_logits(held: dict) -> dict:
    """The frozen reference's logits on the held-out pairs' responses (what a run must leave as is)."""
    return _response_logits(_model(_weights(held, "sft.")).eval(), held)


def dpo_figures(held: dict, reference_logits: dict, outputs: dict) -> tuple[list[float], float]:
    """What a preference run reached on the held-out pairs: the mean implicit reward margin after
    each of PROBES steps, and the share of pairs preferred the right way at the end."""
    tokens = {k: held[f"held_{k}_tokens"] for k in ("chosen", "rejected")}
    masks = {k: held[f"held_{k}_mask"] for k in ("chosen", "rejected")}
    ref_logps = {k: _logprobs(reference_logits[k], tokens[k], masks[k]) for k in tokens}
    margins, accuracy = [], 0.0
    for steps in PROBES:
        rewards = {k: DPO_BETA * (_logprobs(outputs[f"policy_{k}_{steps}"], tokens[k], masks[k]) - ref_logps[k])
                   for k in tokens}
        margins.append(float((rewards["chosen"] - rewards["rejected"]).mean()))
        accuracy = float((rewards["chosen"] > rewards["rejected"]).double().mean())
    return margins, accuracy


def judge_dpo(case: Case, outputs: dict) -> None:
    drawn = int(outputs["batches_drawn"])
    if drawn != DPO_STEPS:
        raise CheckFailed(f"train_dpo drew {drawn} batches from make_batch for n_steps={DPO_STEPS}; draw exactly one "
                          "per step.")
    held = dpo_inputs(case)
    expected_reference = reference_logits(held)
    if any(not torch.allclose(outputs[f"reference_{k}"], v, atol=1e-4) for k, v in expected_reference.items()):
        raise CheckFailed("train_dpo: the reference model changed during the run. Likely mistake: the reference is "
                          "not frozen (its parameters are in the optimizer, or gradients reach it): DPO measures the "
                          "policy against a fixed reference; compute its log-probs under torch.no_grad() and train "
                          "only the policy.", mistake="reference_not_frozen")
    if outputs["history"].numel() and outputs["history"].abs().max() == 0:
        raise CheckFailed("train_dpo: every implicit reward in your history is exactly 0. Likely mistake: the "
                          "reference's log-probabilities are the policy's (computed with the policy model): the margin "
                          "is then always 0, every pair weighs the same however well it is already ranked, and nothing "
                          "holds the policy near the reference. Compute them with `reference`, under no_grad.",
                          mistake="reference_is_policy")
    margins, accuracy = dpo_figures(held, expected_reference, outputs)
    pairs = len(held["held_chosen_tokens"])
    summary = (f"On {pairs} held-out pairs: {round(accuracy * pairs)} preferred the right way after {DPO_STEPS} steps "
               f"({100 * accuracy:.1f}%; the floor is {100 * DPO_FLOOR:.0f}%); mean reward margin after "
               + ", ".join(f"{s} steps {m:.3f}" for s, m in zip(PROBES, margins)) + ".")
    if margins[-1] < 0:
        raise CheckFailed(f"train_dpo: the policy now prefers the rejected answers. Likely mistake: chosen and "
                          f"rejected are swapped somewhere in the loop.\n  {summary}", mistake="swapped")
    if margins[-1] < DPO_MARGIN:
        raise CheckFailed(f"train_dpo: the implicit reward margin hardly rises from 0 (the floor is {DPO_MARGIN}): is "
                          f"the optimizer stepping the policy with the DPO loss of each batch?\n  {summary}")
    if accuracy < DPO_FLOOR:
        raise CheckFailed(f"train_dpo: too few held-out pairs are preferred the right way.\n  {summary}\n  Hint: the "
                          "recipe above (AdamW at 5e-4 on every weight of the policy, beta from the argument) reaches "
                          "the floor.")
    if outputs["history"].shape != (DPO_STEPS, 2):
        raise CheckFailed(f"train_dpo returned a history of shape {list(outputs['history'].shape)}; return one (chosen "
                          f"reward, rejected reward) pair per step, {DPO_STEPS} of them.")


dpo_exercise = Exercise(NOTEBOOK, "train_dpo", produce_dpo, judge_dpo, inputs=dpo_inputs,
                        defaults={"text": None}, describe=lambda case: f"the course's pairs (seed {case.seed})",
                        guard=Guard(supplies=tuple(DPO_PARTS.values()) + (ProbedBatches, CountingBatches)))
check_train_dpo = dpo_exercise.checker(
    "Run the learner's `train_dpo` from the course's finetuned model and grade held-out preference accuracy and "
    "the reward margin's rise.")
