"""Running a learner's training loop (notebook 07) on the grader's model, data and settings.

The training checks run the learner's `train` on the grader's model, seed, data and step budget,
then judge the trained model with the grader's own held-out evaluation. Budgets are numbers of
steps (not seconds), so a verdict never depends on how fast or loaded the machine is; the grader
runs them on one thread, which is bit-for-bit reproducible. Two threads are not (two 2-thread
runs of 3 Shakespeare steps gave different weights), though they were faster on an idle machine
for an earlier, larger Shakespeare model (d_model 256 over GPT-2's whole vocabulary: 2.1 against
2.9 s a step measured).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from graders.exercises.common.small_models import seeded_model
from graders.exercises.nb07.habits import judge_habits
from graders.exercises.nb07.practice import reference_groups
from graders.exercises.nb07.reversal import reference_evaluate
from graders.exercises.nb07.tasks import Recipe, reference_lr
from graders.judging.compare import CheckFailed, Mistake
from graders.judging.learner import course_functions, run_learner
from graders.judging.tolerance import GRADIENT_CLEARED_COSINE
from graders.reference.config import Config

STUCK_HINT = ("Likely mistakes: optimizer.step() is never called; loss.backward() is missing; "
              "the optimizer was built on other parameters than the trained model's (or before "
              "the model it trains).")
WATCHED_NUMEL = 100_000        # parameters this small are watched for gradient accumulation


class TrainingProbe:
    """What the learner's loop does with optimizers and gradients, watched while it runs:
    how many optimizers stepped and how often, on which parameters and learning rate, and
    whether each step's gradient is the one backward just computed (zero_grad) or a pile-up."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.model_params = {id(p) for p in model.parameters()}
        self.params = list(model.parameters())
        self.watched = [p for p in self.params if p.requires_grad and p.numel() <= WATCHED_NUMEL]
        self.incoming: dict[int, torch.Tensor] = {}
        self.incoming_square = 0.0     # squared norm of the gradients backward computed since the last step
        self.steps_per_optimizer: list[int] = []
        self.on_model, self.without_grad, self.accumulated, self.checked = False, 0, 0, 0
        self.per_step = {"lr_low": [], "lr_high": [], "training": [], "grad_norm": [], "raw_norm": []}
        self.decay: list[float] | None = None
        self.handles = []

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.handles.append(register_optimizer_step_pre_hook(self._step))
        for p in self.watched:
            self.handles.append(p.register_hook(lambda grad, key=id(p): self._incoming(key, grad)))
        for p in self.params:
            if p.requires_grad:
                self.handles.append(p.register_hook(self._incoming_norm))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def _incoming(self, key: int, grad: torch.Tensor) -> None:
        grad = grad.detach()
        self.incoming[key] = grad.clone() if key not in self.incoming else self.incoming[key] + grad

    def _incoming_norm(self, grad: torch.Tensor) -> None:
        self.incoming_square += float(grad.detach().double().pow(2).sum())

    def _record_step(self, optimizer) -> None:
        """This step's learning rates, mode, gradient norm (as stepped, and as backward computed
        it) and, at the first step, each parameter's weight decay (-1: in no group)."""
        lrs = [float(group.get("lr", float("nan"))) for group in optimizer.param_groups]
        grads = [p.grad.detach().double().pow(2).sum() for p in self.params if p.grad is not None]
        for key, value in (("lr_low", min(lrs)), ("lr_high", max(lrs)),
                           ("training", float(self.model.training)),
                           ("grad_norm", float(sum(grads)) ** 0.5 if grads else 0.0),
                           ("raw_norm", self.incoming_square ** 0.5)):
            self.per_step[key].append(value)
        self.incoming_square = 0.0
        if self.decay is None:
            decay = {id(p): float(group.get("weight_decay", optimizer.defaults.get("weight_decay", 0.0)))
                     for group in optimizer.param_groups for p in group["params"]}
            self.decay = [decay.get(id(p), -1.0) for p in self.params]

    def _step(self, optimizer, args, kwargs) -> None:
        tag = getattr(optimizer, "_course_training_probe", None)
        if tag is None:
            tag = len(self.steps_per_optimizer)
            optimizer._course_training_probe = tag
            self.steps_per_optimizer.append(0)
        self.steps_per_optimizer[tag] += 1
        self._record_step(optimizer)
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.on_model = self.on_model or bool(stepped & self.model_params)
        if all(p.grad is None for p in self.params):
            self.without_grad += 1
        have = [p for p in self.watched if p.grad is not None and id(p) in self.incoming]
        if have:
            now = torch.cat([p.grad.detach().double().flatten() for p in have])
            new = torch.cat([self.incoming[id(p)].double().flatten() for p in have])
            if float(now.norm()) > 0 and float(new.norm()) > 0:
                self.checked += 1
                if float(now @ new / (now.norm() * new.norm())) < GRADIENT_CLEARED_COSINE:
                    self.accumulated += 1
        self.incoming = {}

    def outputs(self) -> dict:
        return {"optimizer_steps": torch.tensor(self.steps_per_optimizer or [0], dtype=torch.long),
                "optimizer_on_model": torch.tensor(self.on_model),
                "steps_without_grad": torch.tensor(self.without_grad),
                "steps_accumulated": torch.tensor(self.accumulated),
                "steps_checked": torch.tensor(self.checked),
                **{f"step_{key}": torch.tensor(values, dtype=torch.float64)
                   for key, values in self.per_step.items()},
                "param_decay": torch.tensor(self.decay or [], dtype=torch.float64)}


def judge_loop(outputs: dict, recipe: Recipe, cfg: Config) -> None:
    """Mistakes the probe sees whatever the loss: an optimizer on other parameters, one
    re-created during training, gradients that are never cleared, and a habit of 07 §5 skipped
    (training mode, parameter groups, schedule, clipping: see habits.py)."""
    n_steps = recipe.n_steps
    steps = outputs["optimizer_steps"].tolist()
    if sum(steps) and not bool(outputs["optimizer_on_model"]):
        raise CheckFailed(
            "train's optimizer never steps the trained model's parameters. Likely mistake: the "
            "optimizer was built on other parameters than the trained model's (build it from "
            "model.parameters() of the model train is given, after that model exists).",
            mistake="optimizer_on_other_parameters")
    if len(steps) > 1 and max(steps) < n_steps:
        raise CheckFailed(
            f"train built {len(steps)} optimizers for n_steps={n_steps} (the longest-lived one made "
            f"{max(steps)} steps). Likely mistake: the optimizer is re-created "
            + ("every step" if len(steps) >= n_steps else "during training")
            + " (inside the loop), so AdamW's running averages of each gradient start over each "
            "time. Create it once, before the loop, from model.parameters().", mistake="optimizer_recreated")
    checked, piled = int(outputs["steps_checked"]), int(outputs["steps_accumulated"])
    if checked >= 2 and piled > checked // 2:
        raise CheckFailed(
            f"train's gradients pile up: at {piled} of {checked} steps the gradient the optimizer "
            "used was not the one loss.backward() had just computed. Likely mistake: "
            "optimizer.zero_grad() is missing: PyTorch adds new gradients into .grad, so every "
            "update uses the sum of all gradients so far; clear them once per step.", mistake="no_zero_grad")
    if sum(steps):
        judge_habits(outputs, recipe, cfg)


def stuck_diagnosis(outputs: dict) -> str:
    """Why a loop that hardly learns does not, from what the probe saw (a Mistake, carrying its
    key, when it names one)."""
    steps = outputs["optimizer_steps"].tolist()
    if sum(steps) == 0:
        return Mistake("no_optimizer_step", "Likely mistake: optimizer.step() is never called, so the weights "
                       "never change (no optimizer stepped during train).")
    if int(outputs["steps_without_grad"]) == sum(steps):
        return Mistake("no_backward", "Likely mistake: loss.backward() is missing (or zero_grad() runs between "
                       "backward() and step()): the optimizer stepped with no gradients, every parameter's "
                       ".grad was None.")
    if not bool(outputs["optimizer_on_model"]):
        return Mistake("optimizer_on_other_parameters", "Likely mistake: the optimizer was built on other "
                       "parameters than the trained model's (build it from optimizer_groups(model, ...), after "
                       "the model it trains).")
    return STUCK_HINT


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


# The functions `train` calls that have checks of their own, under the notebook's names: a run
# uses the course's, so that a mistake in one costs that check only, not the runs' too.
TRAIN_PARTS = {"optimizer_groups": reference_groups, "lr_at": reference_lr, "evaluate": reference_evaluate}


def run_training(run: TrainingRun, cfg: Config, seed: int, make_batch, recipe: Recipe,
                 eval_tokens: torch.Tensor, eval_every: int):
    """A fresh model of `run.model_class` seeded with `seed`, trained by the learner's `train`:
    (the model, what `train` returned, what the `TrainingProbe` saw)."""
    model = seeded_model(cfg, seed, run.model_class)
    with one_thread(), TrainingProbe(model) as probe, course_functions(run.train, TRAIN_PARTS):
        result = run_learner("train", with_grad, run.train, model, make_batch,
                             eval_tokens=eval_tokens, eval_every=eval_every, progress=False,
                             **recipe.train_kwargs())
    return model, result, probe.outputs()
