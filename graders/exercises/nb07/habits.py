"""Whether the learner's `train` keeps 07 §5's habits, judged from what the loop probe
(runs.TrainingProbe) saw at every optimizer step: training mode, the parameter groups' weight
decay, the scheduled learning rate and the clipped gradient norm. A loop can reach a good loss
and still skip a habit, so these are judged whatever the loss."""
from __future__ import annotations

import torch

from graders.exercises.common.small_models import seeded_model
from graders.exercises.nb07.practice import role
from graders.exercises.nb07.tasks import Recipe
from graders.judging.compare import CheckFailed, Mistake
from graders.judging.tolerance import CLIPPED_NORM_SLACK, close
from graders.reference.config import Config


def _roles(cfg: Config) -> tuple[str, ...]:
    """The role (practice.role) of each parameter of the course model, in parameters() order."""
    return tuple(role(name) for name, _ in seeded_model(cfg, 0).named_parameters())


def judge_mode(outputs: dict) -> None:
    training = outputs["step_training"]
    if len(training) and not bool(training.all()):
        first = int((training == 0).nonzero()[0])
        raise CheckFailed(
            f"the model was in eval mode at {int((training == 0).sum())} of {len(training)} "
            f"optimizer steps, from step {first} on: its dropout (if it has any) was off while it "
            "trained. Likely mistake: an evaluation switches the model to eval() and does not "
            "switch it back (this check runs the course's evaluate, which restores the mode, in "
            "place of yours); call model.train() at the start of train.", mistake="left_in_eval_mode")


def judge_groups_used(outputs: dict, recipe: Recipe, cfg: Config) -> None:
    decay, roles = outputs["param_decay"].tolist(), _roles(cfg)
    if len(decay) != len(roles):
        return       # a model of another shape than the course's: nothing to compare by role
    expected = [recipe.weight_decay if r == "matrix" else 0.0 for r in roles]
    wrong = sum(abs(d - e) > 1e-12 for d, e in zip(decay, expected))
    if not wrong:
        return
    if all(abs(d - recipe.weight_decay) <= 1e-12 for d in decay):
        mistake = Mistake("groups_not_used", "decay is applied to every parameter: the optimizer was built from "
                          "model.parameters(). Build it from optimizer_groups(model, weight_decay).")
    elif all(d == 0 for d in decay):
        mistake = Mistake("weight_decay_not_passed",
                          "no parameter is decayed: pass weight_decay on to optimizer_groups.")
    else:
        mistake = Mistake("other_groups", "the groups are not optimizer_groups(model, weight_decay)'s (this check "
                          "runs the course's optimizer_groups in place of yours): build AdamW from what it returns.")
    raise CheckFailed(f"train's optimizer gives the wrong weight decay to {wrong} of "
                      f"{len(decay)} parameters (weight_decay={recipe.weight_decay}). Likely "
                      f"mistake: {mistake}", mistake=mistake.key)


def _schedule_mistake(low: torch.Tensor, high: torch.Tensor, expected: torch.Tensor,
                      recipe: Recipe) -> str:
    def same(a, b):
        return len(a) > 0 and close(a, b)
    if not same(low, high):
        return Mistake("lr_not_in_every_group", "the param groups got different rates: write the scheduled rate "
                       "into every group (for group in optimizer.param_groups: group['lr'] = ...).")
    if same(high, torch.full_like(high, recipe.max_lr)):
        return Mistake("no_schedule", "the rate never changes from max_lr: no schedule is applied. At every step "
                       "set group['lr'] = lr_at(step, max_lr, warmup_steps, n_steps, min_lr) before "
                       "optimizer.step().")
    if same(high, torch.full_like(high, float(high[0]))):
        return Mistake("max_lr_not_used", "the rate never changes and is not max_lr: the max_lr argument and the "
                       "schedule are not used.")
    changes = int((high[1:] != high[:-1]).sum())
    if 0 < changes <= len(high) // 5:
        return Mistake("schedule_stepped_rarely", f"the rate changed at only {changes} of {len(high)} steps: the "
                       "schedule is stepped now and then (per evaluation, or per epoch), not at every step. Set "
                       "the rate from lr_at(step, ...) at every step.")
    if same(high[1:], expected[:-1]):
        return Mistake("lr_set_after_step", "each step uses the rate meant for the step before: the rate is set "
                       "after optimizer.step(); set it before.")
    if same(high[:-1], expected[1:]):
        return Mistake("lr_one_step_ahead", "each step uses the rate meant for the step after: call "
                       "lr_at(step, ...), not step + 1.")
    return Mistake("lr_at_wrong_arguments", "the rate is not lr_at(step, max_lr, warmup_steps, n_steps, min_lr) "
                   "of the step being taken (this check runs the course's lr_at in place of yours): check what "
                   "train passes it, total_steps is n_steps.")


def judge_schedule(outputs: dict, recipe: Recipe) -> None:
    low, high = outputs["step_lr_low"], outputs["step_lr_high"]
    expected = torch.tensor([recipe.lr(s) for s in range(len(high))], dtype=torch.float64)
    if len(high) == 0 or (close(low, expected) and close(high, expected)):
        return
    wrong = ~torch.isclose(high, expected, rtol=1e-5) | ~torch.isclose(low, expected, rtol=1e-5)
    step = int(wrong.nonzero()[0]) if wrong.any() else 0
    mistake = _schedule_mistake(low, high, expected, recipe)
    raise CheckFailed(
        f"train's learning rate does not follow the schedule: at step {step} it was "
        f"{float(high[step]):.6g}, where lr_at({step}, max_lr={recipe.max_lr:g}, warmup_steps="
        f"{recipe.warmup_steps}, total_steps={recipe.n_steps}, min_lr={recipe.min_lr:g}) gives "
        f"{float(expected[step]):.6g}. Likely mistake: "
        f"{mistake}", mistake=mistake.key)


CLIP_FIX = ("Clip all parameters' gradients as one vector, between backward() and step(), and "
            "only when its norm exceeds max_grad_norm (smaller gradients stay as they are): "
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).")


def judge_clipping(outputs: dict, recipe: Recipe) -> None:
    norm, raw, limit = outputs["step_grad_norm"], outputs["step_raw_norm"], recipe.max_grad_norm
    wanted = torch.minimum(raw, torch.full_like(raw, limit))
    over = norm > limit * (1 + CLIPPED_NORM_SLACK)
    # no gradient at all at a step (norm 0) is another mistake, named by stuck_diagnosis
    off = (raw > 0) & (norm > 0) & ((norm - wanted).abs() > CLIPPED_NORM_SLACK * wanted)
    key = None
    if over.any():
        key = "clip_misplaced"
        step = int(over.nonzero()[0])
        problem = (f"train does not clip the gradients: at {int(over.sum())} of {len(norm)} steps "
                   f"their norm at optimizer.step() was above max_grad_norm={limit:g} (step {step}: "
                   f"{float(norm[step]):.3f}). Likely mistake: clip_grad_norm_ is called before "
                   "loss.backward() (there is no gradient yet to clip) or after optimizer.step() "
                   "(the step already used the unclipped gradient), or not at all.")
    elif off.any():
        key = "clips_otherwise"
        step = int(off.nonzero()[0])
        problem = (f"train changes the gradients other than clipping does: at step {step} their "
                   f"norm was {float(norm[step]):.4f}, where clipping the norm "
                   f"{float(raw[step]):.4f} of all gradients together to max_grad_norm={limit:g} "
                   f"gives {float(wanted[step]):.4f}.")
    else:
        return
    raise CheckFailed(f"{problem} {CLIP_FIX}", mistake=key)


def judge_habits(outputs: dict, recipe: Recipe, cfg: Config) -> None:
    judge_mode(outputs)
    judge_groups_used(outputs, recipe, cfg)
    judge_schedule(outputs, recipe)
    judge_clipping(outputs, recipe)
