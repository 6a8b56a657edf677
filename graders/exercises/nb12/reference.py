"""The course's AdamW with switches for the mistakes notebook 12's check names: the judge runs
each variant through the same steps as the learner's optimizer and names the one whose trajectory
the learner's follows. Sealed in a grading kernel (marked `@course_answer`, graders.marks): with every switch off
it is a correct AdamW."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from graders.marks import course_answer


@dataclass(frozen=True)
class Slip:
    """Which mistake a variant makes (all False: none)."""
    l2_decay: bool = False            # weight decay added to the gradient (Adam with L2)
    no_bias_correction: bool = False
    correction_ahead: bool = False    # bias correction with step + 1
    eps_inside_root: bool = False
    eps_uncorrected: bool = False     # eps added to sqrt(v) before the correction (the paper's "efficient" form)
    decay_unscaled: bool = False      # p -= weight_decay * p, not lr * weight_decay * p
    shared_moments: bool = False      # one pair of moments per parameter shape
    optimizer_step: bool = False      # one step count for the optimizer, not one per parameter
    lr_at_init: bool = False          # the learning rate read once, when the optimizer is built
    decay_after: bool = False         # the weights decayed after the update, not before


@course_answer("AdamW")
class VariantAdamW(torch.optim.Optimizer):
    """AdamW (torch's defaults and state names) making the mistake `slip` says."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, slip: Slip = Slip()):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.slip, self.calls, self.shared = slip, 0, {}
        self.initial_lr = [group["lr"] for group in self.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        slip, self.calls = self.slip, self.calls + 1
        for group, initial_lr in zip(self.param_groups, self.initial_lr):
            lr = initial_lr if slip.lr_at_init else group["lr"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad + group["weight_decay"] * p if slip.l2_decay else p.grad
                key = tuple(p.shape) if slip.shared_moments else p
                state = self.shared if slip.shared_moments else self.state[p]
                if slip.shared_moments:
                    state = state.setdefault(key, {})
                    self.state[p] = state
                if not state:
                    state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                t = self.calls if slip.optimizer_step else float(state["step"]) + slip.correction_ahead
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat, v_hat = state["exp_avg"], state["exp_avg_sq"]
                if not slip.no_bias_correction:
                    m_hat, v_hat = m_hat / (1 - beta1 ** t), v_hat / (1 - beta2 ** t)
                denominator = (v_hat + group["eps"]).sqrt() if slip.eps_inside_root else v_hat.sqrt() + group["eps"]
                if slip.eps_uncorrected:
                    m_hat = m_hat * (1 - beta2 ** t) ** 0.5
                    denominator = state["exp_avg_sq"].sqrt() + group["eps"]
                if not slip.l2_decay and not slip.decay_after:
                    p.mul_(1 - (1 if slip.decay_unscaled else lr) * group["weight_decay"])
                p.addcdiv_(m_hat, denominator, value=-lr)
                if slip.decay_after:
                    p.mul_(1 - lr * group["weight_decay"])
