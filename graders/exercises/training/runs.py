"""Running a learner's training loop (notebook 07) on the grader's model, data and step budget.

The training checks run the learner's `train` on the grader's model, seed, data and step budget,
then judge the trained model with the grader's own held-out evaluation. Budgets are numbers of
steps (not seconds), so a verdict never depends on how fast or loaded the machine is; the grader
runs them on one thread, which is bit-for-bit reproducible. Two threads are not (two 2-thread
runs of 3 Shakespeare steps gave different weights), though they are faster on an idle machine
for the d_model-256 model (2.1 against 2.9 s a step measured).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from graders.exercises.small_models import seeded_model
from graders.judging.learner import run_learner
from graders.reference.config import Config

STUCK_HINT = ("Likely mistakes: optimizer.step() is never called; loss.backward() is missing; "
              "the optimizer was built on other parameters than model.parameters() (or before "
              "the model it trains); or the learning rate argument is not used.")


@contextlib.contextmanager
def one_thread():
    """Run the grader's training on one thread (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_grad(fn, *args, **kwargs):
    """Call learner code with autograd on (run_learner itself runs under no_grad)."""
    with torch.enable_grad():
        return fn(*args, **kwargs)


@dataclass
class TrainingRun:
    """What the grader hands `produce`: the learner's `train` and the model class to train."""
    train: object
    model_class: object = None


class CountingBatches:
    """`make_batch` for the learner: fresh training batches from the grader's generator."""

    def __init__(self, draw):
        self.draw, self.calls = draw, 0

    def __call__(self):
        self.calls += 1
        return self.draw()


def reported_losses(result) -> torch.Tensor:
    """The per-step training losses `train` returned, as a float64 tensor (empty if unusable)."""
    losses = result[0] if isinstance(result, tuple) and result else result
    try:
        return torch.tensor([float(x) for x in losses], dtype=torch.float64)
    except (TypeError, ValueError):
        return torch.zeros(0, dtype=torch.float64)


def run_training(run: TrainingRun, cfg: Config, seed: int, make_batch, n_steps: int, lr: float,
                 eval_tokens: torch.Tensor, eval_every: int):
    """A fresh model of `run.model_class` seeded with `seed`, trained by the learner's `train`:
    (the model, what `train` returned)."""
    model = seeded_model(cfg, seed, run.model_class)
    with one_thread():
        result = run_learner("train", with_grad, run.train, model, make_batch, n_steps=n_steps,
                             lr=lr, eval_tokens=eval_tokens, eval_every=eval_every, progress=False)
    return model, result
