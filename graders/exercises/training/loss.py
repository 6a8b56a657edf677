"""Notebook 07, exercise 1: `lm_cross_entropy_loss(logits, tokens)`, the mean next-token loss
(judged as in notebook 06, by graders.exercises.next_token), differentiable."""
from __future__ import annotations

import torch

from graders.exercises.training.runs import with_grad
from graders.exercises.next_token import judge_loss_value
from graders.judging.cases import Case, rand_float
from graders.exercises.diagnosis import diagnosis_first
from graders.judging.compare import CheckFailed, require_tensor
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

LOSS_VOCAB = 50


def _loss_inputs(case: Case) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, tokens) pairs: the case's shape, then the edge case batch 1, length 2."""
    pairs = []
    for i, (batch, seq) in enumerate([(case.batch, case.seq), (1, 2)]):
        logits = 3 * rand_float(case.seed + 7 * i, batch, seq, LOSS_VOCAB)
        tokens = torch.randint(0, LOSS_VOCAB, (batch, seq),
                               generator=torch.Generator().manual_seed(case.seed + 7 * i + 1))
        pairs.append((logits, tokens))
    return pairs


def produce_loss(fn, case: Case, inputs: dict) -> dict:
    outputs = {}
    for i, (logits, tokens) in enumerate(_loss_inputs(case)):
        logits, before = logits.clone().requires_grad_(True), tokens.clone()
        out = run_learner("lm_cross_entropy_loss", with_grad, fn, logits, tokens)
        require_tensor(f"lm_cross_entropy_loss(logits, tokens) on logits of shape "
                       f"{list(logits.shape)}", out)
        outputs[f"loss_{i}"] = out.detach().clone()
        outputs[f"differentiable_{i}"] = torch.tensor(bool(out.requires_grad and out.grad_fn is not None))
        outputs[f"modified_{i}"] = torch.tensor(not torch.equal(tokens, before))
    return outputs


def judge_loss(case: Case, outputs: dict) -> None:
    for i, (logits, tokens) in enumerate(_loss_inputs(case)):
        where = f"lm_cross_entropy_loss on logits of shape {list(logits.shape)}"
        if bool(outputs[f"modified_{i}"]):
            raise CheckFailed(f"{where}: the tokens tensor was modified in place; build new "
                              "tensors (slices such as tokens[:, 1:]) instead.")
        judge_loss_value(where, outputs[f"loss_{i}"], logits, tokens)
        if not bool(outputs[f"differentiable_{i}"]):
            raise CheckFailed(f"{where}: the value is right but has no gradient, so training "
                              "cannot backpropagate through it. Keep it a tensor built from "
                              "`logits` (no .item(), .numpy(), .detach() or torch.no_grad()).")


loss_exercise = Exercise("07_training", "lm_cross_entropy_loss", produce_loss, diagnosis_first(judge_loss),
                         defaults={"text": None, "batch": 3, "seq": 10})
check_loss = loss_exercise.checker(
    "Grade `lm_cross_entropy_loss(logits, tokens)` (visible: batch 3, 10 positions).")
