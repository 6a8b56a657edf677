"""07's two habits of practitioners' training scripts, each a small function judged on its own:

- `optimizer_groups(model, weight_decay)`: AdamW parameter groups, weight decay on the weight
  matrices only. Judged by which group each of the course model's parameters lands in, named;
  every parameter must be in exactly one group, and AdamW must accept the groups.
- `lr_at(step, max_lr, warmup_steps, total_steps, min_lr)`: linear warmup, then cosine decay to
  min_lr, held there after total_steps. Judged on every step of a run and a few past its end.

Hidden cases use another config and other schedule lengths, so that a hard-coded size shows.
"""
from __future__ import annotations

import math

import torch

from graders.judging.compare import CheckFailed, Mistake, check_shape, compare
from graders.exercises.common.small_models import seeded_model
from graders.exercises.nb07.tasks import reference_lr
from graders.judging.cases import Case
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner
from graders.reference.config import Config
from graders.marks import course_answer

# --- optimizer_groups ---------------------------------------------------------------------------

NOT_IN_A_GROUP = -1.0     # the recorded decay of a parameter no group holds


def groups_config(case: Case) -> Config:
    if case.seed == 0:
        return Config(d_vocab=100, n_ctx=16, d_model=64, n_layers=2, n_heads=4, d_head=16, d_mlp=256)
    return Config(d_vocab=37, n_ctx=9, d_model=24, n_layers=3, n_heads=2, d_head=12, d_mlp=48)


def _course_model(case: Case):
    return seeded_model(groups_config(case), case.seed)


def role(name: str) -> str:
    """What a course-model parameter is, from its name: "layernorm" (w, b of ln1, ln2,
    ln_final), "embedding" (W_E, W_pos), "bias" (b_*) or "matrix" (W_Q ... W_U).

    Weight decay pulls weights towards 0. A weight matrix gains from it; a bias, a LayerNorm gain
    or bias, or an embedding row is a value the model needs as it is, not a connection strength
    to keep small: only matrices decay."""
    *_, owner, leaf = name.split(".")
    if owner.startswith("ln"):
        return "layernorm"
    if leaf in ("W_E", "W_pos"):
        return "embedding"
    return "matrix" if leaf.startswith("W_") else "bias"


@course_answer("optimizer_groups")
def reference_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """07's `optimizer_groups` as the course writes it: weight decay on the matrices only."""
    params = list(model.named_parameters())
    return [{"params": [p for name, p in params if role(name) == "matrix"], "weight_decay": weight_decay},
            {"params": [p for name, p in params if role(name) != "matrix"], "weight_decay": 0.0}]


def produce_groups(optimizer_groups, case: Case, inputs: dict) -> dict:
    if not callable(optimizer_groups):
        raise CheckFailed(f"optimizer_groups: expected your function, got {optimizer_groups!r}.")
    model = _course_model(case)
    weight_decay = 0.1 if case.seed == 0 else 0.05
    groups = run_learner("optimizer_groups", optimizer_groups, model, weight_decay)
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) and "params" in g for g in groups):
        raise CheckFailed("optimizer_groups should return a list of dicts, each with a 'params' list "
                          "and a 'weight_decay', e.g. [{'params': [...], 'weight_decay': 0.1}, "
                          f"{{'params': [...], 'weight_decay': 0.0}}]; it returned {type(groups).__name__}.")
    try:
        torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.0)
    except (ValueError, TypeError) as err:
        raise CheckFailed(f"torch.optim.AdamW does not accept your groups: {err}") from None
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {n: NOT_IN_A_GROUP for n in names.values()}
    count = dict.fromkeys(names.values(), 0)
    for group in groups:
        for p in group["params"]:
            if id(p) in names:
                decay[names[id(p)]] = float(group.get("weight_decay", 0.0))
                count[names[id(p)]] += 1
    return {"decay": torch.tensor(list(decay.values()), dtype=torch.float64),
            "count": torch.tensor(list(count.values()), dtype=torch.int64),
            "weight_decay": torch.tensor(weight_decay, dtype=torch.float64)}


def judge_groups(case: Case, outputs: dict) -> None:
    names = [n for n, _ in _course_model(case).named_parameters()]
    weight_decay = float(outputs["weight_decay"])
    check_shape("optimizer_groups", outputs["decay"], (len(names),), ("parameter",))
    decay, count = outputs["decay"].tolist(), outputs["count"].tolist()
    where = f"optimizer_groups(model, weight_decay={weight_decay}) on a {len(names)}-parameter model"
    missing = [n for n, c in zip(names, count) if c == 0]
    twice = [n for n, c in zip(names, count) if c > 1]
    if missing:
        raise CheckFailed(f"{where}: {len(missing)} parameters are in no group (e.g. {missing[:3]}); "
                          "AdamW would never update them. Every parameter goes in exactly one group.",
                          mistake="parameters_left_out")
    if twice:
        raise CheckFailed(f"{where}: parameters in more than one group (e.g. {twice[:3]}). Every "
                          "parameter goes in exactly one group (AdamW refuses duplicates in one call).",
                          mistake="parameters_in_two_groups")
    wrong = [(n, got) for n, got in zip(names, decay)
             if not math.isclose(got, weight_decay if role(n) == "matrix" else 0.0, abs_tol=1e-12)]
    if not wrong:
        return
    decayed = {n for n, got in zip(names, decay) if got > 0}

    def exactly(*roles):   # every parameter of these roles decayed, and no other
        return decayed == {n for n in names if role(n) in roles}

    message = f"{where}: {len(wrong)} parameters have the wrong weight decay, e.g. " + \
        ", ".join(f"{n} gets {got:g}" for n, got in wrong[:3]) + "."
    key = None
    if exactly("matrix", "embedding", "layernorm", "bias"):
        message += " Likely mistake: decay is applied to every parameter."
        key = "decay_on_everything"
    elif exactly("matrix", "embedding"):
        message += " Likely mistake: the embeddings W_E and W_pos are decayed."
        key = "embeddings_decayed"
    elif exactly("matrix", "layernorm"):
        message += " Likely mistake: LayerNorm's w and b are decayed."
        key = "layernorm_decayed"
    elif exactly("matrix", "bias"):
        message += " Likely mistake: the biases b_* are decayed."
        key = "biases_decayed"
    elif exactly("matrix"):
        message += f" Likely mistake: the decayed group's weight_decay is not the {weight_decay} asked for."
        key = "wrong_weight_decay"
    raise CheckFailed(message + "\n  Decay the weight matrices W_Q, W_K, W_V, W_O, W_in, W_out and "
                      "W_U; give the biases, LayerNorm's w and b, W_E and W_pos weight_decay 0.0.", mistake=key)


groups_exercise = Exercise("07_training", "optimizer_groups", produce_groups, judge_groups,
                           defaults={"text": None})
check_optimizer_groups = groups_exercise.checker(
    "Grade `optimizer_groups(model, weight_decay)` on a small course model.")


# --- lr_at ----------------------------------------------------------------------------------

def schedule_of(case: Case) -> tuple[float, int, int, float]:
    """(max_lr, warmup_steps, total_steps, min_lr) of a case."""
    if case.seed == 0:
        return 1e-3, 10, 100, 1e-4
    return 3e-4 * (1 + case.seed % 3), 3 + case.seed % 5, 40 + 7 * case.seed, 0.0 if case.seed % 2 else 2e-5


def _steps(case: Case) -> range:
    return range(schedule_of(case)[2] + 5)    # the whole run and five steps past its end


def produce_lr(lr_at, case: Case, inputs: dict) -> dict:
    if not callable(lr_at):
        raise CheckFailed(f"lr_at: expected your function, got {lr_at!r}.")
    values = []
    for step in _steps(case):
        value = run_learner("lr_at", lr_at, step, *schedule_of(case))
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckFailed(f"lr_at({step}, ...) returned {value!r}; a learning rate is a Python float.")
        values.append(float(value))
    return {"lr": torch.tensor(values, dtype=torch.float64)}


def schedule_mistakes(case: Case) -> dict[str, torch.Tensor]:
    max_lr, warmup, total, min_lr = schedule_of(case)

    def table(fn):
        return torch.tensor([fn(s) for s in _steps(case)], dtype=torch.float64)

    def cosine(step, start, length):
        progress = min(1.0, (step - start) / length)
        return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))

    return {
        Mistake("no_warmup", "there is no warmup: the rate starts at max_lr; ramp it up linearly over the first "
                "warmup_steps steps"):
            table(lambda s: max_lr if s < warmup else reference_lr(s, max_lr, warmup, total, min_lr)),
        Mistake("warmup_from_zero", "the warmup starts at 0 (step / warmup_steps): step 0 would not train at all; "
                "use (step + 1) / warmup_steps so that step warmup_steps - 1 reaches max_lr"):
            table(lambda s: max_lr * s / warmup if s < warmup else reference_lr(s, max_lr, warmup, total, min_lr)),
        Mistake("decays_to_zero", "the decay ends at 0 instead of min_lr"):
            table(lambda s: reference_lr(s, max_lr, warmup, total, 0.0)),
        Mistake("linear_decay", "the decay is linear; it should follow half a cosine, from max_lr down to min_lr"):
            table(lambda s: reference_lr(s, max_lr, warmup, total, min_lr) if s < warmup else
                  max_lr - (max_lr - min_lr) * min(1.0, (s - warmup) / (total - warmup))),
        Mistake("cosine_from_step_zero", "the cosine counts from step 0 instead of from the end of the warmup"):
            table(lambda s: reference_lr(s, max_lr, warmup, total, min_lr) if s < warmup else cosine(s, 0, total)),
        Mistake("no_hold_after_total", "after total_steps the cosine goes on and the rate climbs again; hold it "
                "at min_lr"):
            table(lambda s: min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))
                  if s >= warmup else reference_lr(s, max_lr, warmup, total, min_lr)),
    }


def judge_lr(case: Case, outputs: dict) -> None:
    max_lr, warmup, total, min_lr = schedule_of(case)
    steps = _steps(case)
    expected = torch.tensor([reference_lr(s, max_lr, warmup, total, min_lr) for s in steps], dtype=torch.float64)
    compare(f"lr_at(step, max_lr={max_lr:g}, warmup_steps={warmup}, total_steps={total}, min_lr={min_lr:g}) "
            f"for steps 0..{len(steps) - 1}", outputs["lr"], expected, ("step",),
            mistakes=lambda: schedule_mistakes(case),
            hint="the rate rises linearly during warmup (step 0 already above 0), then follows half a "
                 "cosine from max_lr down to min_lr, where it stays after total_steps: see 07 §5's formula.")


lr_exercise = Exercise("07_training", "lr_at", produce_lr, judge_lr, defaults={"text": None})
check_lr_at = lr_exercise.checker(
    "Grade `lr_at(step, max_lr, warmup_steps, total_steps, min_lr)` on every step of a schedule.")
