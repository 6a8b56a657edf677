"""07's `per_position_accuracy(model, tokens)`: the fraction of sequences whose argmax
prediction at each position is the true next token.

An untrained model is right about 1% of the time everywhere, which would hide most mistakes, so
the check runs the learner's function on a seeded stand-in whose logits favour the true next
token at seeded places (it peeks at the answer: it is a test fixture, not a language model).
Every position then has its own accuracy, and a shift in the wrong direction, a mean over the
wrong axis or a count instead of a fraction each give different numbers.
"""
from __future__ import annotations

import torch
from torch import nn

from graders.judging.compare import CheckFailed, Mistake, check_shape, compare
from graders.exercises.nb07.tasks import D_VOCAB, SEQ_LEN, per_position, reference_reversal
from graders.judging.cases import Case
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner


class PeekingModel(nn.Module):
    """Logits that put the next token first at seeded (sequence, position) places, and random
    scores elsewhere; causal or not does not matter to an accuracy."""

    def __init__(self, seed: int):
        super().__init__()
        self.seed = seed

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed)
        batch, posn = tokens.shape
        logits = torch.randn(batch, posn, D_VOCAB, generator=generator)
        peek = torch.rand(batch, posn - 1, generator=generator) < torch.linspace(0.05, 0.95, posn - 1)
        boost = torch.zeros(batch, posn, D_VOCAB)
        boost[:, :-1].scatter_(-1, tokens[:, 1:, None], 20.0 * peek[..., None].float())
        return logits + boost                                               # [batch, posn, d_vocab]


def _tokens(case: Case) -> torch.Tensor:
    return reference_reversal(case.batch, torch.Generator().manual_seed(case.seed + 70))


def produce(per_position_accuracy, case: Case, inputs: dict) -> dict:
    if not callable(per_position_accuracy):
        raise CheckFailed(f"per_position_accuracy: expected your function, got {per_position_accuracy!r}.")
    tokens = _tokens(case)
    out = run_learner("per_position_accuracy", per_position_accuracy, PeekingModel(case.seed), tokens.clone())
    return {"accuracy": out.detach().double() if isinstance(out, torch.Tensor) else out}


def judge(case: Case, outputs: dict) -> None:
    tokens = _tokens(case)
    with torch.no_grad():
        logits = PeekingModel(case.seed)(tokens)
    _, right = per_position(logits, tokens)                                 # [posn - 1]
    predictions = logits.argmax(-1)
    check_shape(f"per_position_accuracy on {case.batch} reversal sequences", outputs["accuracy"],
                (SEQ_LEN - 1,), ("prediction position",))
    compare(f"per_position_accuracy on {case.batch} reversal sequences of a test model",
            outputs["accuracy"], right, ("prediction position",),
            mistakes={Mistake("no_shift", "no shift: position p's prediction is compared with token p itself; "
                              "it predicts token p + 1, the next one"):
                          (predictions[:, :-1] == tokens[:, :-1]).double().mean(0),
                      Mistake("no_shift", "no shift (positions 1..15 compared with their own tokens): position p "
                              "predicts token p + 1, the next one"):
                          (predictions[:, 1:] == tokens[:, 1:]).double().mean(0),
                      Mistake("shifted_the_wrong_way", "shifted the wrong way: position p + 1's prediction is "
                              "compared with token p"):
                          (predictions[:, 1:] == tokens[:, :-1]).double().mean(0),
                      Mistake("count_not_fraction", "a count, not a fraction: divide by the number of sequences "
                              "(take the mean)"):
                          right * case.batch},
            hint="entry p is the fraction of sequences whose most likely token at position p is the token "
                 "that comes next, at p + 1; the last position predicts nothing.",
            fix="predictions = model(tokens)[:, :-1].argmax(dim=-1); "
                "return (predictions == tokens[:, 1:]).float().mean(dim=0)")


accuracy = Exercise("07_training", "per_position_accuracy", produce, judge,
                    defaults={"text": None, "batch": 200})
check_per_position_accuracy = accuracy.checker(
    "Grade `per_position_accuracy(model, tokens)` on a seeded test model and reversal sequences.")
