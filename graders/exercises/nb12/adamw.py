"""Notebook 12, exercise 2: the learner's `AdamW`, a torch.optim.Optimizer, judged against
torch.optim.AdamW step by step on the parameters of a small course model in two groups (07's
weight decay on the matrices only).

Both optimizers take the same steps (`trajectory`): seeded gradients of realistic size (1e-5 to
1e-2, where eps's place shows), a learning rate the loop writes into every group before each step
(as 07's schedule does), and a parameter without a gradient at some steps (it must be skipped,
and its step count must not move). The gradients do not depend on the parameters, so a
difference at one step is that step's update, not an echo of an earlier one. The judge reruns the
steps with torch's AdamW for the expected parameters and state, and with the course's variants
(reference.VariantAdamW) to name a listed mistake; otherwise it says where the difference starts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import functools
import importlib

import torch

from graders.exercises.common.small_models import seeded_model
from graders.exercises.nb07.practice import role
from graders.exercises.nb07.runs import with_grad
from graders.exercises.nb12.loss import NOTEBOOK
from graders.exercises.nb12.optimizer_state import (KEYED_BY_PARAMETERS, STATE, keys_mistake, state_by_parameter,
                                                    state_numbers)
from graders.exercises.nb12.reference import Slip, VariantAdamW
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner, text_record
from graders.integrity import WATCH_PARTS, Guard, LibraryOps, refused_ops
from graders.judging.tolerance import close
from graders.reference.config import Config

N_STEPS = 10
SCHEDULE = (0.2, 0.6, 1.0, 1.0, 0.9, 0.7, 0.5, 0.3, 0.2, 0.1)          # x the base lr, per step
GRAD_SCALE = (1e-3, 3e-3, 1e-3, 1e-5, 2e-3, 1e-3, 5e-4, 1e-3, 1e-2, 1e-3)
SKIPPED = ("pos_embed.W_pos", (0, 4))    # a parameter with no gradient at these steps
_ADAMW, _ADAM = importlib.import_module("torch.optim.adamw"), importlib.import_module("torch.optim.adam")
_FUNCTIONAL = importlib.import_module("torch.optim._functional")
ADAM_FUNCTIONS = [(_ADAMW, "adamw"), (_ADAM, "adam"), (_FUNCTIONAL, "adam"), (_FUNCTIONAL, "adamw"),
                  (_ADAM, "_single_tensor_adam"), (_ADAM, "_multi_tensor_adam"), (_ADAM, "_fused_adam"),
                  (torch, "_fused_adam_"), (torch, "_fused_adamw_")]
# AdamW inherits Adam's step: a tripwire goes where the method is defined, and is undone there.
ADAM_FUNCTIONS += [(cls, "step") for cls in (torch.optim.Adam, torch.optim.AdamW) if "step" in vars(cls)]
FORBIDDEN = Forbidden("AdamW", targets=ADAM_FUNCTIONS,
                      source_words=["optim.AdamW", "optim.Adam", "optim.adam", "optim.adamw", "_functional",
                                    "_fused_adam", "_single_tensor_adam", "_multi_tensor_adam"],
                      instead="from the update equations (a subclass of torch.optim.Optimizer)",
                      notebook_wide=False, library_code=("torch.optim.adamw", "torch.optim.adam"))
# torch's fused and multi-tensor (foreach) kernels are what its own AdamW runs: a learner's step is
# a loop over the parameters in public tensor operations. Copies of torch's adam.py and adamw.py
# compiled from their source are torch's code.
LIBRARY_OPS = LibraryOps(
    "AdamW", ops=(("_fused_adamw_", "torch's fused AdamW step"), ("_fused_adam_", "torch's fused Adam step"),
                  ("_fused_adamw", "torch's fused AdamW step"), ("_fused_adam", "torch's fused Adam step"),
                  ("_foreach_*", "a multi-tensor kernel of the kind torch's optimizers are built from")),
    sources=("torch.optim.adamw", "torch.optim.adam", "torch.optim._functional"),
    instead="from the update equations, one parameter at a time (a subclass of torch.optim.Optimizer)")


@dataclass(frozen=True)
class Setting:
    lr: float
    weight_decay: float
    betas: tuple | None            # None: the constructor's defaults are used
    eps: float | None
    no_decay_lr_factor: float      # the second group's rate, relative to the first's

    def kwargs(self) -> dict:
        extra = {} if self.betas is None else {"betas": self.betas, "eps": self.eps}
        return {"lr": self.lr, "weight_decay": self.weight_decay, **extra}


def setting(case: Case) -> Setting:
    if case.seed == 0:
        return Setting(lr=1e-3, weight_decay=0.1, betas=None, eps=None, no_decay_lr_factor=1.0)
    return Setting(lr=3e-3, weight_decay=0.3, betas=(0.8, 0.99), eps=1e-6, no_decay_lr_factor=0.5)


def model_config() -> Config:
    return Config(d_vocab=20, n_ctx=8, d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=16)


def named_params(case: Case) -> list[tuple[str, torch.nn.Parameter]]:
    return list(seeded_model(model_config(), case.seed).named_parameters())


def groups(params: list, case: Case) -> list[dict]:
    """07's groups: weight decay on the weight matrices only; the second group may have a rate of
    its own (its own "lr" key)."""
    decayed = {"params": [p for n, p in params if role(n) == "matrix"], "weight_decay": setting(case).weight_decay}
    other = {"params": [p for n, p in params if role(n) != "matrix"], "weight_decay": 0.0}
    return [decayed, other]


def gradient(case: Case, step: int, index: int, p: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100_000 * case.seed + 1000 * step + index)
    return torch.randn(p.shape, generator=generator) * GRAD_SCALE[step]


def trajectory(optimizer, params: list, case: Case, step=None) -> dict:
    """Take N_STEPS steps with `optimizer` (built on groups(params)); after each, record every
    parameter, and its state under torch's names (NaN where there is none): [step, all numbers].
    "keys" says what the state's keys are when they are not the parameters themselves."""
    factors = (1.0, setting(case).no_decay_lr_factor)
    record = {key: [] for key in ("params", *STATE, "step")}
    keys = ""
    for t in range(N_STEPS):
        for group, factor in zip(_groups_of(optimizer), factors):
            group["lr"] = setting(case).lr * SCHEDULE[t] * factor
        for i, (name, p) in enumerate(params):
            skipped = name == SKIPPED[0] and t in SKIPPED[1]
            p.grad = None if skipped else gradient(case, t, i, p)
        shapes = [p.shape for _, p in params]
        (step or optimizer.step)()
        record["params"].append(torch.cat([_parameter(name, p, shape) for (name, p), shape in zip(params, shapes)]))
        states, keys = state_by_parameter(optimizer, params)
        for key in STATE:
            record[key].append(torch.cat([state_numbers(states, p, key) for _, p in params]))
        record["step"].append(torch.cat([state_numbers(states, p, "step") for _, p in params]))
    stacked = {key: torch.stack(values) for key, values in record.items()}
    return {**stacked, "keys": text_record(keys or KEYED_BY_PARAMETERS)}


def _groups_of(optimizer) -> list:
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or len(groups) != 2 or not all(isinstance(g, dict) for g in groups):
        found = f"a list of {len(groups)}" if isinstance(groups, list) else type(groups).__name__
        raise CheckFailed("AdamW(groups, lr=...) must keep the two parameter groups it is given, as dicts in "
                          "self.param_groups (pass them on to super().__init__(params, defaults)); its "
                          f"param_groups is {found}.")
    return groups


def _parameter(name: str, p: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A parameter's numbers after a step, as float32; its shape must be what it was."""
    if p.shape != shape or p.is_complex():
        raise CheckFailed(f"AdamW.step changed {name} from a real tensor of shape {list(shape)} to a "
                          f"{p.dtype} of shape {list(p.shape)}: update each parameter in place, keeping its shape.")
    return p.detach().float().flatten()


def produce(AdamW, case: Case, inputs: dict) -> dict:
    if not isinstance(AdamW, type) or not issubclass(AdamW, torch.optim.Optimizer):
        raise CheckFailed(f"AdamW: expected your class, a subclass of torch.optim.Optimizer; got {AdamW!r}.")
    if issubclass(AdamW, (torch.optim.Adam, torch.optim.AdamW)):
        raise CheckFailed("AdamW: your class subclasses torch.optim.Adam (or AdamW), whose step is the "
                          "answer. Subclass torch.optim.Optimizer and write step() yourself.")
    params = named_params(case)
    with refused_ops(LIBRARY_OPS, "AdamW"):
        optimizer = run_learner("AdamW", AdamW, groups(params, case), forbidden=FORBIDDEN, **setting(case).kwargs())
    _groups_of(optimizer)

    def step():
        try:   # with autograd on, as in a training loop
            with refused_ops(LIBRARY_OPS, "AdamW.step"):
                run_learner("AdamW.step", with_grad, optimizer.step, forbidden=FORBIDDEN)
        except CheckFailed as failure:
            raise _named_crash(failure) from failure.__cause__
    return trajectory(optimizer, params, case, step)


def _named_crash(failure: CheckFailed) -> CheckFailed:
    text = str(failure)
    if "NoneType" in text:
        return CheckFailed("AdamW.step crashed on a parameter whose .grad is None (it took no part in "
                           "this step's loss). Likely mistake: parameters without a gradient are not "
                           "skipped; `if p.grad is None: continue`, as torch's optimizers do.\n  "
                           + text.splitlines()[0], mistake="none_grad_not_skipped")
    if "leaf Variable that requires grad" in text:
        return CheckFailed("AdamW.step updates the parameters in place while autograd records it. "
                           "Likely mistake: step() is not under torch.no_grad(); decorate it with "
                           "@torch.no_grad(), as torch's optimizers do.\n  " + text.splitlines()[0],
                           mistake="step_without_no_grad")
    return failure


def expected_trajectory(case: Case, optimizer_class=torch.optim.AdamW, **extra) -> dict:
    params = named_params(case)
    return trajectory(optimizer_class(groups(params, case), **setting(case).kwargs(), **extra), params, case)


@functools.lru_cache(maxsize=4)
def torch_trajectory(case: Case) -> dict:
    return expected_trajectory(case)


MISTAKES = {
    Slip(l2_decay=True): "L2 decay added to the gradient (that is Adam with weight decay, not AdamW): AdamW "
                         "decays the weights directly, p -= lr * weight_decay * p, outside the moments",
    Slip(no_bias_correction=True): "no bias correction: divide m by 1 - beta1**t and v by 1 - beta2**t, "
                                   "t the parameter's step count starting at 1",
    Slip(correction_ahead=True): "the bias correction counts one step ahead (1 - beta**(t + 1)): at the "
                                 "first step t is 1",
    Slip(eps_inside_root=True): "eps inside the square root: the denominator is sqrt(v_hat) + eps",
    Slip(eps_uncorrected=True): "eps is added to sqrt(v) before the bias correction (the Adam paper's "
                                "'efficient' form, lr * sqrt(1 - beta2**t) / (1 - beta1**t) * m / (sqrt(v) + eps)); "
                                "torch adds it after: m_hat / (sqrt(v_hat) + eps)",
    Slip(decay_unscaled=True): "the weight decay is not scaled by the learning rate: p -= lr * "
                               "weight_decay * p",
    Slip(shared_moments=True): "the moments are shared between parameters (one m and v for parameters of "
                               "the same shape): keep them per parameter, in self.state[p]",
    Slip(optimizer_step=True): "the step count is kept per optimizer, not per parameter: a parameter that "
                               "had no gradient at some steps is corrected with a count it did not take; "
                               "keep state['step'] per parameter",
    Slip(lr_at_init=True): "the learning rate is read once, when the optimizer is built: read group['lr'] "
                           "at every step (a schedule changes it between steps)",
    Slip(decay_after=True): "the weights are decayed after the Adam update, not before it: torch (and "
                            "Loshchilov & Hutter's algorithm) decays the weights the step starts from, "
                            "p -= lr * weight_decay * p, then subtracts lr * m_hat / (sqrt(v_hat) + eps)",
}
# Mistakes torch's own AdamW makes on request: its keyword arguments, and what they mean.
TORCH_MISTAKES = {
    (("amsgrad", True),): Mistake("amsgrad", "the denominator uses the largest v so far (AMSGrad's max(v_max, "
                                  "v)): AdamW divides by the root of this step's bias-corrected v, which can shrink"),
}


def slip_key(slip: Slip) -> str:
    """A listed mistake's key: the Slip field that switches it on ("l2_decay")."""
    return next(name for name, on in asdict(slip).items() if on)


@functools.lru_cache(maxsize=4)
def adamw_mistakes(case: Case) -> dict[str, dict]:
    """The trajectory each listed mistake takes on this case's steps (kept: they are the same for
    every learner)."""
    ours = {Mistake(slip_key(slip), description): expected_trajectory(case, VariantAdamW, slip=slip)
            for slip, description in MISTAKES.items()}
    return {**ours, **{description: expected_trajectory(case, **dict(kwargs))
                       for kwargs, description in TORCH_MISTAKES.items()}}


def _same_params(actual: dict, expected: dict) -> bool:
    return all(close(actual["params"][t], expected["params"][t]) for t in range(N_STEPS))


def _wrong(actual: torch.Tensor, expected: torch.Tensor, sizes: list[int]) -> list[int]:
    """The parameters (indices) whose numbers differ beyond the tolerance."""
    def same(a, e):
        if torch.isnan(e).all():      # no state yet (the parameter has not been updated)
            return bool(torch.isnan(a).all())
        return bool(torch.isfinite(a).all()) and close(a, e)
    return [i for i, (a, e) in enumerate(zip(actual.split(sizes), expected.split(sizes))) if not same(a, e)]


def judge(case: Case, outputs: dict) -> None:
    expected = torch_trajectory(case)
    names = [n for n, _ in named_params(case)]
    sizes = [p.numel() for _, p in named_params(case)]
    if _same_params(outputs, expected):
        _judge_state(outputs, expected, names, sizes)
        return
    first = next(t for t in range(N_STEPS) if not close(outputs["params"][t], expected["params"][t])
                 or not torch.isfinite(outputs["params"][t]).all())
    wrong = _wrong(outputs["params"][first], expected["params"][first], sizes)
    head = (f"AdamW's parameters differ from torch.optim.AdamW's from step {first + 1} of {N_STEPS} on "
            f"({len(wrong)} of {len(names)} parameters, e.g. {', '.join(names[i] for i in wrong[:3])}).")
    if not torch.isfinite(outputs["params"][first]).all():
        raise CheckFailed(f"{head} They are NaN or infinite. Likely mistake: the bias correction counts "
                          "from step 0: 1 - beta**0 is 0 and m / 0 is infinite; the step count is 1 at "
                          "the first update (increment it before using it).", mistake="correction_from_zero")
    for description, mistaken in adamw_mistakes(case).items():
        if _same_params(outputs, mistaken):
            raise CheckFailed(f"{head} Likely mistake: {description}.", mistake=mistake_key(description))
    keys = f"\n  Also: {keys_mistake(outputs)}." if keys_mistake(outputs) else ""
    parts = _update_parts(outputs, expected, first, case)
    named = f" Likely mistake: {parts}." if parts else ""
    raise CheckFailed(f"{head}{named}\n  {_localised(outputs, expected, first, wrong, names, sizes, case)}{keys}",
                      mistake=mistake_key(parts))


def _update_parts(outputs: dict, expected: dict, first: int, case: Case) -> str | None:
    """Name an unlisted mistake from what the first wrong step did: torch's change of the parameters
    is an Adam update U plus a decay D (-lr * weight_decay * p), and the learner's change, fitted
    as a * U + b * D, says which part went missing, changed sign or changed size."""
    params = named_params(case)
    start = torch.cat([p.detach().flatten() for _, p in params]).double()
    before = {key: run["params"][first - 1].double() if first else start for key, run in (("ours", expected),
                                                                                          ("yours", outputs))}
    rate = setting(case).lr * SCHEDULE[first] * setting(case).weight_decay
    decay = torch.cat([torch.full((p.numel(),), rate if role(n) == "matrix" else 0.0) for n, p in params]).double()
    U = expected["params"][first].double() - before["ours"] * (1 - decay)
    D = -decay * before["yours"]                      # the decay of the learner's own parameters
    L = outputs["params"][first].double() - before["yours"]
    if not torch.isfinite(L).all() or U.norm() == 0:
        return None
    basis = torch.stack([U, D], 1) if D.norm() > 0 else U[:, None]
    fit = torch.linalg.lstsq(basis, L[:, None]).solution[:, 0]
    a, b = float(fit[0]), float(fit[1]) if len(fit) > 1 else 0.0
    if float((basis @ fit - L).norm()) > 1e-2 * float(L.norm() + U.norm() * 1e-3):
        return None                                   # not a mix of the two parts: the direction differs
    step = f"at step {first + 1}"
    near = lambda x, y: abs(x - y) <= 1e-2 * max(1.0, abs(y))   # noqa: E731
    if near(a, 0) and near(b, 0):
        return Mistake("not_in_place", f"the parameters do not change {step}: the update never reaches them. "
                       "`p = p - ...` rebinds the name p to a new tensor and leaves the model's parameter as it "
                       "was; update it in place (p.mul_, p.add_, p.addcdiv_, or p.copy_(...))")
    if near(a, 0):
        return Mistake("update_not_applied", f"only the weight decay reaches the parameters {step}; the Adam "
                       "update lr * m_hat / (sqrt(v_hat) + eps) is computed but not applied in place (rebound to "
                       "a new tensor?)")
    if near(a, -1):
        return Mistake("update_sign", f"the Adam update has the wrong sign {step}: subtract lr * m_hat / "
                       "(sqrt(v_hat) + eps)")
    if near(a, 1) and D.norm() > 0:
        return (Mistake("decay_wrong_size", f"the Adam update is right {step}, but the weight decay is {b:.3g} times "
                        "torch's (lr * weight_decay * p, with the group's weight_decay)") if not near(b, 0) else
                Mistake("no_decay", f"the Adam update is right {step}, but the weights are not decayed: p -= lr * "
                        "weight_decay * p, with each group's own weight_decay"))
    if near(b, 1) or D.norm() == 0:
        return Mistake("update_wrong_size", f"the Adam update is {a:.4g} times torch's {step} (its direction is right, "
                       "its size is not): look at the learning rate it uses and the bias corrections 1 - beta**t")
    return None


def _localised(outputs: dict, expected: dict, first: int, wrong: list[int], names: list[str],
               sizes: list[int], case: Case) -> str:
    """What an unlisted mistake's difference looks like: which group, moments or update, from the
    first step or growing."""
    notes = []
    decayed = {i for i, n in enumerate(names) if role(n) == "matrix"}
    if set(wrong) <= decayed and setting(case).weight_decay:
        notes.append("only parameters of the decayed group differ: look at the weight decay")
    elif not set(wrong) & decayed:
        notes.append("only parameters of the group without weight decay differ: is each group's own "
                     "group['weight_decay'] (and group['lr']) used, not the optimizer's defaults?")
    else:
        notes.append("parameters of both groups differ")
    moments = [key for key in STATE if _wrong(outputs[key][first], expected[key][first], sizes)]
    if moments:
        alone = {"exp_avg": " (only m: look at beta1 and the gradient it averages)",
                 "exp_avg_sq": " (only v: look at beta2 and the squared gradient)"}.get(moments[0], "") \
            if len(moments) == 1 else ""
        notes.append(f"the state {' and '.join(moments)} differ{'s' if len(moments) == 1 else ''} at that step "
                     f"too{alone}: the moments are not m = beta1 * m + (1 - beta1) * g and v = beta2 * v + "
                     "(1 - beta2) * g**2 of this parameter's own gradients, with the group's betas")
    elif not any(torch.isnan(outputs[key][first]).all() for key in STATE):
        notes.append("the moments exp_avg and exp_avg_sq are right: the update computed from them is not")
    counts, expected_counts = outputs["step"][first], expected["step"][first]
    if not torch.equal(counts.nan_to_num(-1), expected_counts.nan_to_num(-1)):
        i = int((counts.nan_to_num(-1) != expected_counts.nan_to_num(-1)).nonzero()[0])
        notes.append(f"state['step'] of {names[i]} is {float(counts[i]):g} after step {first + 1}, where torch's "
                     f"is {float(expected_counts[i]):g} (the updates that parameter has had)")
    if first == 0:
        notes.append("at step 1 m_hat = g and v_hat = g**2 after the bias correction, so the update of "
                     "each number is lr * sign(g) (for |g| >> eps), plus the decay")
    else:
        right = f"steps 1 to {first} were" if first > 1 else "step 1 was"
        notes.append(f"{right} right: what changes with t (the bias correction, the schedule's rate, skipped "
                     "parameters) is the place to look")
    return "; ".join(notes) + "."


def _judge_state(outputs: dict, expected: dict, names: list[str], sizes: list[int]) -> None:
    """The parameters are right: the state must be too, under torch's names (checkpoints save it)."""
    if keys_mistake(outputs):
        raise CheckFailed(f"AdamW's updates are right, but its state cannot be read. Likely mistake: "
                          f"{keys_mistake(outputs)}.", mistake=mistake_key(keys_mistake(outputs)))
    for key in STATE:
        if torch.isnan(outputs[key]).all():
            raise CheckFailed(f"AdamW's updates are right, but optimizer.state[p]['{key}'] is missing. Keep "
                              f"the moments in self.state[p] under torch's names, 'exp_avg', 'exp_avg_sq' "
                              "and 'step': optimizer.state_dict(), and so a checkpoint, saves only what is there.")
        for t in range(N_STEPS):
            wrong = _wrong(outputs[key][t], expected[key][t], sizes)
            if wrong:
                raise CheckFailed(f"AdamW's updates are right, but after step {t + 1} state['{key}'] of "
                                  f"{names[wrong[0]]} is not torch's: keep the raw moment there (before the "
                                  "bias correction), updated in place.")
    steps = outputs["step"]
    differ = (steps != expected["step"]) & ~(steps.isnan() & expected["step"].isnan())
    if differ.any():
        t, i = [int(x) for x in differ.nonzero()[0]]
        raise CheckFailed(f"AdamW's updates are right, but after step {t + 1} state['step'] of {names[i]} is "
                          f"{float(steps[t, i]):g}, not {float(expected['step'][t, i]):g}: it counts the "
                          "updates of that parameter (skipped steps do not count).")


exercise = Exercise(NOTEBOOK, "AdamW", produce, judge, forbidden=(FORBIDDEN,), defaults={"text": None},
                    guard=Guard(supplies=WATCH_PARTS, library_ops=(LIBRARY_OPS,)))
check_adamw = exercise.checker(
    "Grade your `AdamW` against torch.optim.AdamW, step by step, on two parameter groups.")
