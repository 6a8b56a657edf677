"""Notebook 07, exercise 1: `lm_cross_entropy_loss(logits, tokens)`, the mean next-token loss."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graders.exercises.training.runs import with_grad
from graders.exercises.training.tasks import reference_loss
from graders.judging.cases import Case, rand_float
from graders.exercises.diagnosis import compare, diagnosis_first
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


def loss_mistakes(logits: torch.Tensor, tokens: torch.Tensor) -> dict:
    logits, vocab = logits.double(), logits.shape[-1]
    log_probs = logits.log_softmax(-1)
    picked = log_probs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]     # [batch, seq-1]

    def ce(lg, tk):
        return F.cross_entropy(lg.reshape(-1, vocab), tk.reshape(-1))

    return {
        "the loss is not shifted: position i is scored on its own token tokens[i]; it must "
        "predict the next one, tokens[i+1] (use logits[:, :-1] with tokens[:, 1:])":
            ce(logits, tokens),
        "shifted the wrong way: logits[:, 1:] are scored against tokens[:, :-1]; position i "
        "predicts token i+1, so drop the LAST logits and the FIRST tokens":
            ce(logits[:, 1:], tokens[:, :-1]),
        "the last position is scored too (torch.roll wraps the first token round as its "
        "target): it has no next token and must be left out":
            ce(logits, tokens.roll(-1, dims=1)),
        "the losses are summed instead of averaged (take the mean over batch and positions)":
            -picked.sum(),
        "the loss is summed over positions and averaged only over the batch":
            -picked.sum(-1).mean(),
        "the minus sign is missing: the loss is the NEGATIVE mean log-probability":
            picked.mean(),
        "probabilities are averaged instead of log-probabilities (take log_softmax, not softmax)":
            -logits.softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean(),
        "log_softmax is taken over the wrong dimension (it must be over the vocabulary, dim=-1)":
            -logits.log_softmax(1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean(),
        "raw logits are used instead of log-probabilities (normalise with log_softmax first)":
            -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean(),
    }


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
        out = outputs[f"loss_{i}"]
        if out.dim() != 0:
            hint = ""
            if tuple(out.shape) in ((logits.shape[0], logits.shape[1] - 1), tuple(logits.shape[:2])):
                hint = (" Likely mistake: one loss per position is returned (reduction='none'); "
                        "take the mean over batch and positions.")
            elif tuple(out.shape) == (logits.shape[0],):
                hint = (" Likely mistake: one loss per sequence is returned (a mean over positions "
                        "only); take the mean over batch and positions.")
            raise CheckFailed(f"{where}: returned shape {list(out.shape)}; the loss is one number "
                              f"(a 0-dim tensor, shape []).{hint}")
        if bool(outputs[f"modified_{i}"]):
            raise CheckFailed(f"{where}: the tokens tensor was modified in place; build new "
                              "tensors (slices such as tokens[:, 1:]) instead.")
        compare(where, out.reshape(1), reference_loss(logits, tokens).reshape(1), ("loss",),
                mistakes={k: v.reshape(1) for k, v in loss_mistakes(logits, tokens).items()},
                hint="log_softmax over the vocabulary, pick the log-probability of tokens[:, 1:] "
                     "at positions [:, :-1], and return minus the mean.")
        if not bool(outputs[f"differentiable_{i}"]):
            raise CheckFailed(f"{where}: the value is right but has no gradient, so training "
                              "cannot backpropagate through it. Keep it a tensor built from "
                              "`logits` (no .item(), .numpy(), .detach() or torch.no_grad()).")


loss_exercise = Exercise("07_training", "lm_cross_entropy_loss", produce_loss, diagnosis_first(judge_loss),
                         defaults={"text": None, "batch": 3, "seq": 10})
check_loss = loss_exercise.checker(
    "Grade `lm_cross_entropy_loss(logits, tokens)` (visible: batch 3, 10 positions).")
