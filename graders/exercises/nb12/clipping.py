"""Notebook 12, exercise 3: `clip_grad_norm(parameters, max_norm)`, judged against
torch.nn.utils.clip_grad_norm_ on the gradients of a small course model: once with a total norm
above max_norm (clipped) and once below (left alone), one parameter without a gradient, the
parameters passed as model.parameters() (a generator, as a training loop passes them)."""
from __future__ import annotations

import torch

from graders.exercises.nb12.adamw import gradient, named_params
from graders.exercises.nb12.loss import NOTEBOOK
from graders.exercises.nb12.readers import shown, real_number, real_tensor
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, keyed_like, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.integrity import WATCH_PARTS, Guard, LibraryOps, refused_ops
from graders.judging.tolerance import close

FORBIDDEN = Forbidden(
    "clipping by the global norm",
    targets=[(module, name) for module in (torch.nn.utils, torch.nn.utils.clip_grad)
             for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grads_with_norm_", "get_total_norm",
                          "_clip_grads_with_norm_", "_get_total_norm") if hasattr(module, name)],
    source_words=["clip_grad_norm_", "clip_grads_with_norm_", "get_total_norm", "utils.clip_grad"],
    instead="from the gradients' norms", notebook_wide=False, library_code=("torch.nn.utils.clip_grad",))
# _foreach_norm gives every gradient's norm in one kernel, clip_grad_norm_'s own route where torch
# has multi-tensor kernels; a copy of clip_grad.py compiled from its source is torch's code.
LIBRARY_OPS = LibraryOps(
    "clipping by the global norm",
    ops=(("_foreach_*", "a multi-tensor kernel, as torch.nn.utils.clip_grad_norm_ uses"),),
    sources=("torch.nn.utils.clip_grad",), instead="from the gradients' norms, one gradient at a time")
WITHOUT_GRAD = "pos_embed.W_pos"
# The gradients' total norm, as a multiple of max_norm: clipped, then left alone.
NORM_FACTORS = (3.0, 0.5)


def max_norm_of(case: Case) -> float:
    return 1.0 if case.seed == 0 else 0.25


def with_gradients(case: Case, factor: float) -> list[tuple[str, torch.nn.Parameter]]:
    """The small model's parameters with seeded gradients whose total norm is factor * max_norm
    (varied per parameter, so that each parameter's own norm is far from the total)."""
    params = named_params(case)
    for i, (name, p) in enumerate(params):
        p.grad = None if name == WITHOUT_GRAD else gradient(case, 0, i, p) * (1 + i % 4)
    total = torch.cat([p.grad.flatten() for _, p in params if p.grad is not None]).norm()
    for _, p in params:
        if p.grad is not None:
            p.grad *= factor * max_norm_of(case) / total
    return params


def _grads(params) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for _, p in params if p.grad is not None]).float()


def produce(clip_grad_norm, case: Case, inputs: dict) -> dict:
    if not callable(clip_grad_norm):
        raise CheckFailed(f"clip_grad_norm: expected your function, got {clip_grad_norm!r}.")
    outputs = {}
    for k, factor in enumerate(NORM_FACTORS):
        params = with_gradients(case, factor)
        # A one-pass iterator, as model.parameters() is (a C iterator: no frame of ours is left
        # suspended in it, to be closed later inside another check's learner code).
        with refused_ops(LIBRARY_OPS, "clip_grad_norm"):
            norm = run_learner("clip_grad_norm", clip_grad_norm, iter([p for _, p in params]), max_norm_of(case),
                               forbidden=FORBIDDEN)
        number = real_number(norm)
        if number is None:
            raise CheckFailed(f"clip_grad_norm returned {shown(norm)}; return the total norm of the gradients "
                              "(a number or a 0-dim tensor), as clip_grad_norm_ does.")
        _gradients_kept(params)
        outputs[f"norm_{k}"] = torch.tensor(number, dtype=torch.float64)
        outputs[f"grads_{k}"] = _grads(params)
    return outputs


def _gradients_kept(params) -> None:
    """Each gradient still a real tensor of its parameter's shape, and None where it was None."""
    for name, p in params:
        if name == WITHOUT_GRAD:
            if p.grad is not None:
                raise CheckFailed(f"clip_grad_norm gave {WITHOUT_GRAD}, which had no gradient (.grad None), a "
                                  "gradient. Skip parameters whose .grad is None.", mistake="none_grad_given")
        elif real_tensor(p.grad) is None or p.grad.shape != p.shape:
            raise CheckFailed(f"clip_grad_norm left {name}.grad as {shown(p.grad)}, where it was a tensor of shape "
                              f"{list(p.shape)}: scale each gradient in place (g.mul_(coefficient)).")


def expected(case: Case, k: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(clip_grad_norm_'s returned norm, the gradients it leaves, the gradients before)."""
    params = with_gradients(case, NORM_FACTORS[k])
    before = _grads(params)
    norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], max_norm_of(case))
    return float(norm), _grads(params), before


def clip_mistakes(grads: list[torch.Tensor], max_norm: float) -> dict[str, tuple[float, torch.Tensor]]:
    """(returned norm, gradients left) of each listed mistake, from the gradients before."""
    flat = torch.cat([g.flatten() for g in grads])
    total = float(flat.norm())
    coef = max_norm / (total + 1e-6)
    clipped = flat * min(coef, 1.0)
    per_parameter = torch.cat([(g * min(1.0, max_norm / (float(g.norm()) + 1e-6))).flatten() for g in grads])
    l1 = float(flat.abs().sum())
    summed = sum(float(g.norm()) for g in grads)
    return {
        Mistake("inverted", "the coefficient is inverted: the gradients are multiplied by norm / max_norm, which "
                "lengthens them; multiply by max_norm / (norm + 1e-6) when that is below 1"):
            (total, flat / coef if coef < 1 else flat),
        Mistake("l1_norm", "the norm is the L1 norm (the sum of absolute values): clip_grad_norm_ uses the L2 "
                "norm, sqrt(sum of g**2)"): (l1, flat * min(max_norm / (l1 + 1e-6), 1.0)),
        Mistake("summed_norms", "the total norm is the sum of each parameter's norm: the norm of all gradients "
                "together is sqrt(sum of each gradient's squared norm), which is smaller"):
            (summed, flat * min(max_norm / (summed + 1e-6), 1.0)),
        Mistake("per_parameter", "each parameter is clipped by its own norm: clip by the one norm of all gradients "
                "together, sqrt(sum of every gradient's squared norm)"): (total, per_parameter),
        Mistake("scaled_up", "the gradients are scaled up when their norm is below max_norm: apply the "
                "coefficient max_norm / (norm + 1e-6) only when it is below 1"): (total, flat * coef),
        Mistake("norm_after_clipping", "the norm is returned after clipping: return the total norm before "
                "clipping (what clip_grad_norm_ returns, the number a training log shows)"):
            (float(clipped.norm()), clipped),
        Mistake("unchanged", "the gradients are left unchanged. If you loop over `parameters` twice, note it may "
                "be a generator (model.parameters()), used up by the first loop: make a list first"):
            (total, flat),
    }


def judge(case: Case, outputs: dict) -> None:
    names = [n for n, _ in named_params(case) if n != WITHOUT_GRAD]
    sizes = [p.numel() for n, p in named_params(case) if n != WITHOUT_GRAD]
    max_norm = max_norm_of(case)
    for k, factor in enumerate(NORM_FACTORS):
        norm, grads, before = expected(case, k)
        got_norm, got = float(outputs[f"norm_{k}"]), outputs[f"grads_{k}"]
        norm_ok = close(torch.tensor(got_norm), torch.tensor(norm))
        if norm_ok and close(got, grads):
            continue
        which = "above" if factor > 1 else "below"
        head = (f"clip_grad_norm(model.parameters(), max_norm={max_norm:g}) on gradients whose total norm "
                f"{norm:.4g} is {which} max_norm")
        for description, (m_norm, m_grads) in clip_mistakes(list(before.split(sizes)), max_norm).items():
            if close(torch.tensor(got_norm), torch.tensor(m_norm)) and close(got, m_grads):
                raise CheckFailed(f"{head}: not what clip_grad_norm_ does. Likely mistake: {description}.",
                                  mistake=mistake_key(description))
        if not norm_ok:
            raise CheckFailed(f"{head} returned {got_norm:.6g}; clip_grad_norm_ returns {norm:.6g}, the norm "
                              "of all gradients together, before clipping.")
        localised = _localised(got, grads, before, names, sizes)
        raise CheckFailed(f"{head}: {localised}", mistake=mistake_key(localised))


def _localised(got: torch.Tensor, grads: torch.Tensor, before: torch.Tensor, names: list[str], sizes: list[int]) -> str:
    """Which parameters' gradients differ, and by what factor of what they were."""
    notes = []
    for name, g, e, b in zip(names, got.split(sizes), grads.split(sizes), before.split(sizes)):
        if close(g, e):
            continue
        ratio, wanted = float(g @ b / (b @ b)), float(e @ b / (b @ b))
        change = "scaled up" if ratio > 1 else "scaled down"
        notes.append(f"{name} was {change} by {ratio:.4g} where clip_grad_norm_ scales it by {wanted:.4g}"
                     if torch.allclose(g, b * ratio, rtol=1e-4, atol=1e-12) else
                     f"{name} is not a multiple of its gradient before")
    n_wrong = len(notes)
    one_factor = _one_factor(got, grads, before)
    said = (f"{n_wrong} of {len(names)} gradients differ from clip_grad_norm_'s: " + "; ".join(notes[:3])
            + f".{one_factor} Every gradient is multiplied by the same coefficient, "
            "min(1, max_norm / (norm + 1e-6)).")
    return keyed_like(one_factor, said)


def _one_factor(got: torch.Tensor, grads: torch.Tensor, before: torch.Tensor) -> str:
    """When every gradient was scaled by one factor (the direction kept), how that factor relates
    to clip_grad_norm_'s: its square, its inverse, or neither."""
    factor, wanted = float(got @ before / (before @ before)), float(grads @ before / (before @ before))
    if not torch.allclose(got, before * factor, rtol=1e-4, atol=1e-12) or wanted <= 0 or factor <= 0:
        return ""
    for key, relation, value in (("coefficient_squared", "the square of", wanted ** 2),
                                 ("inverted", "the inverse of", 1 / wanted),
                                 ("coefficient_square_root", "the square root of", wanted ** 0.5)):
        if abs(factor - value) <= 1e-3 * value:
            return Mistake(key, f" Likely mistake: every gradient is scaled by one factor, {factor:.4g}, {relation} "
                           f"clip_grad_norm_'s {wanted:.4g}: the direction is kept, the coefficient is wrong.")
    return (f" Every gradient is scaled by one factor, {factor:.4g} (clip_grad_norm_'s is {wanted:.4g}): the "
            "direction is kept, the coefficient's value is wrong.")


exercise = Exercise(NOTEBOOK, "clip_grad_norm", produce, judge, forbidden=(FORBIDDEN,), defaults={"text": None},
                    guard=Guard(supplies=WATCH_PARTS, library_ops=(LIBRARY_OPS,)))
check_clip_grad_norm = exercise.checker(
    "Grade `clip_grad_norm(parameters, max_norm)` against torch.nn.utils.clip_grad_norm_.")
