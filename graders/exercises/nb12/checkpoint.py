"""Notebook 12, exercise 6: `save_checkpoint` and `load_checkpoint`, judged by resuming.

The course's training loop (`train_steps`: torch's AdamW in two groups, a warmup-then-cosine rate
set at every step, clipping, a model with dropout, batches drawn from a generator) runs in the
kernel to the case's stopping step (save_at), evaluates (eval mode), calls the learner's
`save_checkpoint`, and trains on to the end (so a load that reads the objects save kept in memory,
not the file, finds them changed). Then, as a new process would, it builds another model,
optimizer and generator, reseeds torch's global generator, puts the model in eval mode, calls the learner's
`load_checkpoint` and trains on to N_STEPS. The judge trains the same run without stopping and
requires the resumed steps to match it bit for bit; where they do not, it names what diverged
first at the resumed step: the step (schedule), the weights, the optimizer's moments, the batch
(data generator), the mode, dropout's random state. The loop is the course's and the optimizer
torch's: a mistake in the learner's AdamW or clipping costs those exercises only.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises.nb07.runs import one_thread
from graders.integrity.library_kernels import CLIP_GRAD_RUNS, CROSS_ENTROPY_RUNS, SOFTMAX_RUNS
from graders.exercises.nb12.loss import NOTEBOOK
from graders.exercises.nb12.readers import items_of, shown, whole_number
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

D_VOCAB, D_MODEL, WINDOW, BATCH = 32, 16, 8, 4
N_STEPS = 12
MAX_LR, WARMUP = 3e-2, 3


class TinyLM(nn.Module):
    """A next-token model small enough to train in milliseconds, with dropout (which draws from
    torch's global generator while the model trains)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(D_VOCAB, D_MODEL)
        self.dropout = nn.Dropout(0.2)
        self.unembed = nn.Linear(D_MODEL, D_VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.dropout(self.embed(tokens)))


def save_at(case: Case) -> int:
    """The step the run stops at: 5 in the visible check, another in the hidden one (a load that
    returns a fixed step fails there)."""
    return 5 if case.seed == 0 else 7


def lr_at(step: int) -> float:
    """Linear warmup over WARMUP steps, then a cosine decay to a tenth of MAX_LR at N_STEPS."""
    import math

    if step < WARMUP:
        return MAX_LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (N_STEPS - WARMUP)
    return MAX_LR * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def token_stream(seed: int) -> torch.Tensor:
    """A seeded stream where each token mostly follows from the one before (something to learn)."""
    generator = torch.Generator().manual_seed(50_000 + seed)
    steps = torch.randint(1, 4, (4000,), generator=generator)
    return steps.cumsum(0) % D_VOCAB


def build_run(seed: int) -> tuple[TinyLM, torch.optim.AdamW, torch.Generator]:
    """A fresh model (weights from `seed`), its AdamW (decay on the weight matrices only) and the
    data generator."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyLM()
    matrices = [p for name, p in model.named_parameters() if name.endswith("weight") and p.ndim == 2
                and not name.startswith("embed")]
    others = [p for p in model.parameters() if all(p is not q for q in matrices)]
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
                                  lr=MAX_LR)
    return model, optimizer, torch.Generator().manual_seed(60_000 + seed)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


def train_steps(model, optimizer, generator, data: torch.Tensor, start: int, stop: int) -> dict:
    """The course's training steps `start` to `stop` - 1; what each step started from and did."""
    record = {key: [] for key in ("step", "lr", "batch", "training", "rng", "weights", "exp_avg", "loss")}
    for step in range(start, stop):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        starts = torch.randint(0, len(data) - WINDOW - 1, (BATCH,), generator=generator)
        batch = torch.stack([data[s:s + WINDOW + 1] for s in starts.tolist()])
        moments = [optimizer.state.get(p, {}).get("exp_avg", torch.zeros_like(p)) for p in model.parameters()]
        for key, value in (("step", torch.tensor(step)), ("lr", torch.tensor(lr_at(step), dtype=torch.float64)),
                           ("batch", batch), ("training", torch.tensor(model.training)),
                           ("rng", torch.get_rng_state()), ("weights", _flat(list(model.parameters()))),
                           ("exp_avg", _flat(moments))):
            record[key].append(value)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        record["loss"].append(loss.detach())
    return {key: torch.stack(values) for key, values in record.items() if values}


def uninterrupted(case: Case) -> dict:
    """The run the resumed one must equal: save_at(case) steps, the evaluation, back to training mode and
    on to N_STEPS."""
    with one_thread(), torch.random.fork_rng():
        torch.manual_seed(case.seed)
        model, optimizer, generator = build_run(case.seed)
        data = token_stream(case.seed)
        train_steps(model, optimizer, generator, data, 0, save_at(case))
        evaluate(model, data)
        model.train()
        return train_steps(model, optimizer, generator, data, save_at(case), N_STEPS)


def evaluate(model: nn.Module, data: torch.Tensor) -> None:
    """A held-out evaluation, as a run makes before it saves: in eval mode (no dropout, no draw from
    the global generator), and left in eval mode, as a script that saves right after it has it."""
    model.eval()
    with torch.no_grad():
        tokens = data[-(WINDOW + 1) * 8:].reshape(8, WINDOW + 1)
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())


def produce(run, case: Case, inputs: dict) -> dict:
    save_checkpoint, load_checkpoint = run
    for fn, name in ((save_checkpoint, "save_checkpoint"), (load_checkpoint, "load_checkpoint")):
        if not callable(fn):
            raise CheckFailed(f"{name}: expected your function, got {fn!r}.")
    data = token_stream(case.seed)
    with one_thread(), torch.random.fork_rng(), tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint.pt"
        torch.manual_seed(case.seed)
        model, optimizer, generator = build_run(case.seed)
        train_steps(model, optimizer, generator, data, 0, save_at(case))
        evaluate(model, data)
        saved = {"batch_rng": generator.get_state(), "rng": torch.get_rng_state()}   # what a checkpoint must hold
        run_learner("save_checkpoint", save_checkpoint, path, model, optimizer, save_at(case), generator)
        if not path.exists():
            raise CheckFailed("save_checkpoint(path, ...) wrote no file at path: save with torch.save(..., path).")
        # The saving run trains on, as a run does after it saves: a load that reads the objects
        # save kept in memory, not the file, finds them changed.
        later = _after_saving(model, optimizer, generator, data, case)
        # A new process: other weights, a fresh optimizer, another generator and global random state.
        torch.manual_seed(case.seed + 12_345)
        model, optimizer, generator = build_run(case.seed + 1)
        model.eval()
        step = run_learner("load_checkpoint", load_checkpoint, path, model, optimizer, generator)
        if whole_number(step) is None or not 0 <= whole_number(step) <= N_STEPS:
            raise CheckFailed(f"load_checkpoint returned {shown(step)}; return the step to resume from (an int, "
                              f"{save_at(case)} here: the checkpoint was saved after steps 0 to {save_at(case) - 1}).")
        loaded = _snapshot(model, optimizer, generator)
        try:
            resumed = train_steps(model, optimizer, generator, data, whole_number(step), N_STEPS)
        except Exception as err:   # the course's loop on what the learner's load left
            raise CheckFailed(f"After load_checkpoint, the training loop cannot go on: {type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}. load_checkpoint must restore the "
                              "saved state into the given model, optimizer and generator, as their "
                              "load_state_dict and set_state do.") from err
        return {**resumed, **{f"loaded_{key}": value for key, value in loaded.items()},
                **{f"later_{key}": value for key, value in later.items()},
                **{f"saved_{key}": value for key, value in saved.items()}}


def _snapshot(model, optimizer, generator) -> dict:
    """What the resumed run starts from: weights, first moments, the two generators' states."""
    states = {id(key): value for key, value in items_of(getattr(optimizer, "state", None)) or ()}
    moments = []
    for p in model.parameters():
        moment = next((v for k, v in items_of(states.get(id(p))) or () if isinstance(k, str) and k == "exp_avg"), None)
        moments.append(moment if isinstance(moment, torch.Tensor) and moment.shape == p.shape else torch.zeros_like(p))
    return {"weights": _flat(list(model.parameters())), "exp_avg": _flat(moments).float(),
            "batch_rng": generator.get_state(), "rng": torch.get_rng_state()}


def _after_saving(model, optimizer, generator, data, case: Case) -> dict:
    """The saving run trained on to the end, back in training mode; where it ends."""
    try:
        model.train()
        train_steps(model, optimizer, generator, data, save_at(case), N_STEPS)
    except Exception as err:
        raise CheckFailed(f"After save_checkpoint, the training loop cannot go on: {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}. save_checkpoint must leave the "
                          "model, optimizer and generator as they were (save copies of their state).") from err
    return _snapshot(model, optimizer, generator)


# What differs at the first resumed step, in the order it is looked for, and what it means.
DIVERGED = (
    ("weights", "the model's weights",
     Mistake("weights_not_restored",
             "the model's weights are not restored: load model.state_dict() with model.load_state_dict")),
    ("exp_avg", "AdamW's first moments (exp_avg)",
     Mistake("optimizer_not_restored", "the optimizer's state is not restored, so AdamW's moments restart from "
             "zero: save optimizer.state_dict() and load it with optimizer.load_state_dict")),
    ("batch", "the batch",
     Mistake("generator_not_restored", "the data generator is not restored, so the resumed run draws other "
             "batches: save generator.get_state() and restore it with generator.set_state")),
    ("training", "the model's mode (train or eval)",
     Mistake("left_in_eval", "the model is left in eval mode after loading (the run saved right after an "
             "evaluation): call model.train() in load_checkpoint, so dropout is on again")),
    ("rng", "the state of torch's global random generator",
     Mistake("global_rng_not_restored", "torch's global random generator is not restored, so dropout draws other "
             "masks: save torch.get_rng_state() and restore it with torch.set_rng_state")),
)


def judge(case: Case, outputs: dict) -> None:
    expected, stop = uninterrupted(case), save_at(case)     # the resumed run's first step
    first_step = int(outputs["step"][0]) if len(outputs.get("step", [])) else N_STEPS
    if first_step != stop:
        raise CheckFailed(
            f"load_checkpoint returned step {first_step}, but the checkpoint was saved after steps 0 to "
            f"{stop - 1}: the resumed run would start at step {stop}. Likely mistake: "
            + ("the step is not restored, so the schedule restarts (warmup again): save the step and return it."
               if first_step == 0 else
               f"the step is off by one: save_checkpoint was given step={stop}, the next step to run, and "
               "load_checkpoint returns it as it was (no + 1 or - 1)." if abs(first_step - stop) == 1 else
               "the step is not the one saved: return the step passed to save_checkpoint."),
            mistake=("step_not_restored" if first_step == 0 else
                     "step_off_by_one" if abs(first_step - stop) == 1 else "step_not_saved"))
    if "saved_rng" in outputs and torch.equal(outputs["loaded_batch_rng"], outputs["saved_rng"]) \
            and torch.equal(outputs["loaded_rng"], outputs["saved_batch_rng"]):
        raise CheckFailed(
            "The resumed run draws other batches and other dropout masks from the first resumed step on: the "
            "data generator holds the state torch's global generator had when the run saved, and the global "
            "generator the data generator's. Likely mistake: the two generators' states are swapped: restore "
            "generator.set_state(what generator.get_state() gave) and torch.set_rng_state(what "
            "torch.get_rng_state() gave).", mistake="generators_swapped")
    for i in range(N_STEPS - stop):
        for key, what, meaning in DIVERGED:
            if not torch.equal(outputs[key][i], expected[key][i]):
                if i == 0:
                    _judge_in_memory(outputs, key, what)
                when = "as training resumed" if i == 0 else f"at step {stop + i}, {i} steps after resuming"
                raise CheckFailed(f"The resumed run differs from the uninterrupted one {when}, first in "
                                  f"{what}. Likely mistake: {meaning}.", mistake=mistake_key(meaning))
        if not torch.equal(outputs["loss"][i], expected["loss"][i]):
            raise CheckFailed(
                f"The resumed run's loss at step {stop + i} is {float(outputs['loss'][i]):.9g}, the "
                f"uninterrupted run's {float(expected['loss'][i]):.9g}, although weights, moments, batch, mode "
                "and random state were the same when it started. Save and restore every part of the "
                "state as it is (no copies in another dtype).")


def _judge_in_memory(outputs: dict, key: str, what: str) -> None:
    """A resumed run that starts from where the saving run went on to, not from where it saved:
    load read the objects save kept in memory."""
    snapshot = {"weights": "weights", "exp_avg": "exp_avg", "batch": "batch_rng", "rng": "rng"}.get(key)
    if snapshot and torch.equal(outputs[f"loaded_{snapshot}"], outputs[f"later_{snapshot}"]):
        raise CheckFailed(
            f"The resumed run differs from the uninterrupted one as training resumed, first in {what}: they are "
            "those of the saving run after it trained on past the checkpoint. Likely mistake: load reads the "
            "objects that save kept in memory (state_dict() holds the live tensors, not copies), not the file: "
            "save to the file with torch.save and load everything back from it with torch.load, as a new "
            "process would have to.", mistake="loaded_from_memory")


exercise = Exercise(NOTEBOOK, "checkpoints", produce, judge, defaults={"text": None},
                    # the training step it runs: the course's model, F.cross_entropy, clip_grad_norm_
                    guard=Guard(may_run=SOFTMAX_RUNS + CROSS_ENTROPY_RUNS + CLIP_GRAD_RUNS))
check_checkpoints = exercise.checker(
    "Grade `save_checkpoint` and `load_checkpoint` by stopping a run, resuming it, and comparing bit "
    "for bit with a run that never stopped.", learner=lambda save, load: (save, load))
