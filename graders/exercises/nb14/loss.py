"""Notebook 14, exercise 4: `grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask,
clip_eps, beta, token_level=False)`, judged against the GRPO objective (Shao et al. 2024, eq. 3,
with the k3 estimator of the KL) computed independently in float64: its value, its gradient with
respect to the policy's log-probs, and none reaching the old policy, the reference or the
advantages. trl 1.16's GRPOTrainer._compute_loss (loss_type "grpo" and "bnpo") is a test-only
cross-check of the same equation (tests/catalog/test_catalog_14.py); trl is refused while the learner's
code runs. A mistake no catalog lists is read from the output: the first completion whose loss
differs, a gradient on padding."""
from __future__ import annotations

import math

import torch

from graders.exercises.nb14 import reference as ref
from graders.exercises.nb14.rewards import FORBIDDEN
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner

NOTEBOOK = "14_rl_verifiable_rewards"
SLIPS = {
    "inverted": "the ratio is inverted: rho = pi / pi_old = exp(logprobs - old_logprobs)",
    "max": "max where the objective takes the min: the clipped surrogate is the pessimistic one, "
           "-min(rho A, clip(rho) A), so that a step cannot gain by moving the ratio far from 1",
    "clip_advantage": "the advantage is clipped instead of the ratio: clip(rho, 1 - eps, 1 + eps) A",
    "k1": "the KL term is k1, log pi - log pi_ref: GRPO's is k3, pi_ref / pi - log(pi_ref / pi) - 1, "
          "never negative and of lower variance",
    "kl_sign": "the KL penalty is subtracted: the loss adds beta times the KL, so that moving away from the "
               "reference costs",
    "padding": "the padding is counted: positions where the mask is False are not tokens of the completion",
    "all_tokens": "a mean over all the batch's tokens where the per-completion mean was asked (token_level=False): "
                  "each completion's tokens are averaged first, then the completions",
}
GRAD_SLIPS = {
    "old_logprobs": "the old policy's log-probs are not detached: pi_old is the policy that sampled, a constant of "
                    "the loss",
    "ref_logprobs": "the reference's log-probs are not detached: the reference is frozen",
    "advantages": "the advantage is not detached: it weighs the gradient, it is not something to optimise",
}


def settings(case: Case) -> tuple[float, float]:
    """(clip_eps, beta) of a case."""
    return (0.2, 0.04) if case.seed == 0 else (0.1 + 0.05 * (case.seed % 3), 0.1 * (1 + case.seed % 2))


def loss_inputs(case: Case) -> list[torch.Tensor]:
    """Log-probs [n, T] of completions of different lengths, the policy moved from the old one by
    up to +-0.5 (so that some ratios are clipped), advantages of both signs, the mask."""
    generator = torch.Generator().manual_seed(400 + case.seed)
    n, width = case.batch, case.seq
    old = -torch.rand(n, width, generator=generator, dtype=torch.float64) * 3 - 0.05
    new = old + (torch.rand(n, width, generator=generator, dtype=torch.float64) - 0.5)
    reference = old + (torch.rand(n, width, generator=generator, dtype=torch.float64) - 0.5) * 0.6
    advantages = torch.randn(n, generator=generator, dtype=torch.float64)
    lengths = 1 + (torch.arange(n) * 3 + case.seed) % width
    mask = torch.arange(width)[None] < lengths[:, None]
    return [new, old, reference, advantages, mask]


def produce(grpo_loss, case: Case, inputs: dict) -> dict:
    if not callable(grpo_loss):
        raise CheckFailed(f"grpo_loss: expected your function, got {grpo_loss!r}.")
    clip_eps, beta = settings(case)
    outputs = {}
    for token_level in (False, True):
        values = loss_inputs(case)
        leaves = [v.clone().requires_grad_(True) for v in values[:4]]
        loss = run_learner("grpo_loss", _with_grad, grpo_loss, *leaves, values[4], clip_eps, beta, token_level,
                           forbidden=FORBIDDEN)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise CheckFailed(f"grpo_loss returned {shape}; return the loss, a scalar tensor.")
        key = "token" if token_level else "sequence"
        outputs[f"{key}_loss"] = loss.detach().double().reshape(())
        if loss.requires_grad:
            with torch.enable_grad():
                loss.backward()
        for name, leaf in zip(("logprobs", "old_logprobs", "ref_logprobs", "advantages"), leaves):
            outputs[f"{key}_grad_{name}"] = (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)).double()
    return outputs


def _with_grad(fn, *args):
    with torch.enable_grad():
        return fn(*args)


def _expected(case: Case, token_level: bool, slip: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and its gradient with respect to the policy's log-probs."""
    clip_eps, beta = settings(case)
    new, old, reference, advantages, mask = loss_inputs(case)
    new.requires_grad_(True)
    loss = ref.grpo_loss(new, old, reference, advantages, mask, clip_eps, beta, token_level, slip)
    loss.backward()
    return loss.detach(), new.grad


def judge(case: Case, outputs: dict) -> None:
    clip_eps, beta = settings(case)
    mask = loss_inputs(case)[4]
    for key, token_level in (("sequence", False), ("token", True)):
        where = (f"grpo_loss on {case.batch} completions of lengths {mask.sum(-1).tolist()} (clip_eps {clip_eps:g}, "
                 f"beta {beta:g}, token_level={token_level})")
        want, want_grad = _expected(case, token_level)
        got = outputs[f"{key}_loss"]
        if not math.isclose(float(got), float(want), rel_tol=1e-6, abs_tol=1e-9):
            head = f"{where} returned {float(got):.6g}; the GRPO objective gives {float(want):.6g}."
            for slip, description in SLIPS.items():
                if slip == "all_tokens" and token_level:
                    continue
                if math.isclose(float(got), float(_expected(case, token_level, slip)[0]), rel_tol=1e-6):
                    raise CheckFailed(f"{head} Likely mistake: {description}.", mistake=slip)
            if not token_level and math.isclose(float(got), float(_expected(case, True)[0]), rel_tol=1e-6):
                raise CheckFailed(f"{head} Likely mistake: {SLIPS['all_tokens']}.", mistake="all_tokens")
            if token_level and math.isclose(float(got), float(_expected(case, False)[0]), rel_tol=1e-6):
                raise CheckFailed(f"{head} Likely mistake: token_level=True asks for one mean over every "
                                  "completion token of the batch; the loss is the per-completion mean.",
                                  mistake="per_completion_mean")
            grad = outputs[f"{key}_grad_logprobs"]
            if bool((grad[~mask] != 0).any()):
                raise CheckFailed(f"{head} The gradient reaches positions where the mask is False. Likely mistake: "
                                  f"{SLIPS['padding']}.", mistake="padding")
            raise CheckFailed(f"{head}\n  Hint: per token, rho = exp(logprobs - old_logprobs); the surrogate "
                              "-min(rho A, clamp(rho, 1 - eps, 1 + eps) A); plus beta times k3 of "
                              "d = ref_logprobs - logprobs (exp(d) - d - 1); masked, averaged per completion "
                              "over mask.sum(-1), then over the completions.")
        grad = outputs[f"{key}_grad_logprobs"]
        if not torch.allclose(grad, want_grad, atol=1e-9, rtol=1e-6):
            n, i = (int(x) for x in (~torch.isclose(grad, want_grad, atol=1e-9)).nonzero()[0])
            raise CheckFailed(f"{where}: the loss is right, but its gradient with respect to logprobs[{n}, {i}] is "
                              f"{float(grad[n, i]):.5g}, the objective's {float(want_grad[n, i]):.5g} (a detach or "
                              "an in-place step on the policy's side?).")
        for name, description in GRAD_SLIPS.items():
            if bool((outputs[f"{key}_grad_{name}"] != 0).any()):
                raise CheckFailed(f"{where}: the loss is right, but a gradient reaches {name}. Likely mistake: "
                                  f"{description}; .detach() it.", mistake=f"{name}_not_detached")


exercise = Exercise(NOTEBOOK, "grpo_loss", produce, judge, forbidden=(FORBIDDEN,),
                    defaults={"text": None, "batch": 6, "seq": 5})
check_grpo_loss = exercise.checker(
    "Grade `grpo_loss(...)` against the GRPO objective with the k3 KL in float64: its value, per completion and "
    "token-level, and its gradients.")
