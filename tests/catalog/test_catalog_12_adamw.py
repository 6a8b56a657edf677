"""Notebook 12's AdamW grader (graders/exercises/nb12/adamw.py): correct variants (in other styles)
pass, each catalogued mistake fails with its name."""
import pytest
import torch

from graders.exercises import nb12
from catalog_helpers import fails_with


# --- AdamW -------------------------------------------------------------------------------------

def _adamw(mistake=None, style="inplace"):
    class AdamW(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=None, eps=1e-8, weight_decay=1e-2):
            betas = betas or ((0.9, 0.99) if mistake == "defaults" else (0.9, 0.999))
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
            self.count = 0

        def step(self, closure=None):
            if mistake == "grad_mode":
                return self._step()
            with torch.no_grad():
                return self._step()

        def _step(self):
            self.count += 1
            for group in self.param_groups:
                beta1, beta2 = group["betas"]
                if mistake == "betas_swapped":
                    beta1, beta2 = beta2, beta1
                lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
                if mistake == "default_decay":
                    wd = self.defaults["weight_decay"]
                for p in group["params"]:
                    if mistake == "counts_skipped" and p.grad is None:   # counted, then skipped
                        self.state[p]["step"] = self.state[p].get("step", 0) + 1
                    if p.grad is None and mistake != "none_grads":
                        continue
                    g = p.grad + wd * p if mistake == "l2" else p.grad
                    state = self.state[p]
                    if "exp_avg" not in state:
                        state.update(step=torch.tensor(float(state.get("step", 0))), exp_avg=torch.zeros_like(p),
                                     exp_avg_sq=torch.zeros_like(p))
                    t = float(state["step"]) if mistake == "from_zero" else None
                    state["step"] += 1
                    t = self.count if mistake == "optimizer_step" else t if t is not None else float(state["step"])
                    if style == "float64":
                        m = beta1 * state["exp_avg"].double() + (1 - beta1) * g.double()
                        v = beta2 * state["exp_avg_sq"].double() + (1 - beta2) * g.double() ** 2
                        state["exp_avg"].copy_(m)
                        state["exp_avg_sq"].copy_(v)
                        update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps)
                        p.data = (p.double() * (1 - lr * wd) - lr * update).float()
                        continue
                    state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
                    state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    m_hat, v_hat = state["exp_avg"], state["exp_avg_sq"]
                    if mistake != "no_correction":
                        m_hat, v_hat = m_hat / (1 - beta1 ** t), v_hat / (1 - beta2 ** t)
                    denominator = (v_hat + eps).sqrt() if mistake == "eps_inside" else v_hat.sqrt() + eps
                    if mistake == "eps_uncorrected":      # Kingma & Ba's "efficient" ordering
                        m_hat = state["exp_avg"] * (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t)
                        denominator = state["exp_avg_sq"].sqrt() + eps
                    if mistake == "amsgrad":
                        state["max_v"] = torch.maximum(state.get("max_v", state["exp_avg_sq"]), state["exp_avg_sq"])
                        denominator = (state["max_v"] / (1 - beta2 ** t)).sqrt() + eps
                    if mistake == "rebind":
                        p = p * (1 - lr * wd) - lr * m_hat / denominator
                        continue
                    if mistake == "rebind_update":                 # unlisted: the decay in place, the update not
                        p.mul_(1 - lr * wd)
                        p = p - lr * m_hat / denominator
                        continue
                    if mistake not in ("l2", "decay_after", "no_decay"):
                        p.mul_(1 - (wd if mistake == "unscaled_decay" else lr * wd))
                    p.addcdiv_(m_hat, denominator, value=lr if mistake == "sign" else
                               -2 * lr if mistake == "double_rate" else -lr)
                    if mistake == "decay_after":
                        p.mul_(1 - lr * wd)
    return AdamW


def _explicit_adamw():
    """Another style: one formula per line, the step count an int, parameters updated through .data."""
    class AdamW(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

        def step(self, closure=None):
            for group in self.param_groups:
                (b1, b2), lr = group["betas"], group["lr"]
                for p in (p for p in group["params"] if p.grad is not None):
                    s = self.state[p]
                    s.setdefault("exp_avg", torch.zeros_like(p.data))
                    s.setdefault("exp_avg_sq", torch.zeros_like(p.data))
                    s["step"] = s.get("step", 0) + 1
                    s["exp_avg"] = b1 * s["exp_avg"] + (1 - b1) * p.grad.data
                    s["exp_avg_sq"] = b2 * s["exp_avg_sq"] + (1 - b2) * p.grad.data ** 2
                    m_hat = s["exp_avg"] / (1 - b1 ** s["step"])
                    v_hat = s["exp_avg_sq"] / (1 - b2 ** s["step"])
                    p.data = p.data - lr * group["weight_decay"] * p.data - lr * m_hat / (v_hat.sqrt() + group["eps"])
    return AdamW


@pytest.mark.parametrize("cls", [_adamw(), _adamw(style="float64"), _explicit_adamw()])
def test_adamw_correct_variants_pass(cls):
    nb12.check_adamw(cls)
    nb12.check_adamw(cls, seed=1)


@pytest.mark.parametrize("mistake, expected", [
    ("l2", "Likely mistake: L2 decay added to the gradient"),
    ("no_correction", "Likely mistake: no bias correction"),
    ("from_zero", "Likely mistake: the bias correction counts from step 0"),
    ("eps_inside", "Likely mistake: eps inside the square root"),
    ("eps_uncorrected", "Likely mistake: eps is added to sqrt(v) before the bias correction"),
    ("unscaled_decay", "Likely mistake: the weight decay is not scaled by the learning rate"),
    ("optimizer_step", "Likely mistake: the step count is kept per optimizer"),
    ("counts_skipped", "Likely mistake: the step count is kept per optimizer"),
    ("none_grads", "Likely mistake: parameters without a gradient are not skipped"),
    ("grad_mode", "Likely mistake: step() is not under torch.no_grad()"),
    ("betas_swapped", ["from step 2 of 10", "exp_avg and exp_avg_sq differ at that step", "step 1 was right"]),
    ("default_decay", "only parameters of the group without weight decay differ"),
    ("rebind", ["from step 1 of 10", "the moments exp_avg and exp_avg_sq are right: the update"]),
])
def test_adamw_mistakes_are_named(mistake, expected):
    fails_with(nb12.check_adamw, _adamw(mistake), expected=expected)


@pytest.mark.parametrize("mistake, expected", [
    ("decay_after", "Likely mistake: the weights are decayed after the Adam update"),
    ("amsgrad", "Likely mistake: the denominator uses the largest v so far"),
])
def test_adamw_mistakes_the_hidden_case_tells_apart_are_named(mistake, expected):
    """Decaying after the update changes a step by lr**2 * weight_decay * update, and AMSGrad's max by
    little while v barely shrinks: beyond the tolerance with the hidden case's rate, decay and beta2."""
    fails_with(nb12.check_adamw, _adamw(mistake), seed=1, expected=expected)


@pytest.mark.parametrize("mistake, expected", [    # mistakes no catalog lists, named from the update's parts
    ("sign", "Likely mistake: the Adam update has the wrong sign at step 1"),
    ("no_decay", "Likely mistake: the Adam update is right at step 2, but the weights are not decayed"),
    ("double_rate", "Likely mistake: the Adam update is 2 times torch's at step 1"),
    ("rebind_update", "Likely mistake: only the weight decay reaches the parameters at step 1"),
    ("rebind", "Likely mistake: the parameters do not change at step 1"),
])
def test_adamw_unlisted_mistakes_are_named_from_the_update(mistake, expected):
    fails_with(nb12.check_adamw, _adamw(mistake), expected=expected)


def test_adamw_defaults_and_settings_are_read():
    nb12.check_adamw(_adamw("defaults"), seed=1)      # betas passed explicitly: the defaults unused
    fails_with(nb12.check_adamw, _adamw("defaults"), expected="only v: look at beta2")


def test_adamw_shared_moments_and_a_cached_rate_are_named():
    class Shared(_adamw()):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.by_shape = {}

        def _step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p] = self.by_shape.setdefault(tuple(p.shape), self.state[p])
            return super()._step()

    class CachedRate(_adamw()):
        def __init__(self, params, lr=1e-3, **kwargs):
            super().__init__(params, lr=lr, **kwargs)
            self.rate = lr

        def _step(self):
            for group in self.param_groups:
                group["lr"] = self.rate
            return super()._step()
    fails_with(nb12.check_adamw, Shared, expected="Likely mistake: the moments are shared between parameters")
    fails_with(nb12.check_adamw, CachedRate, expected="Likely mistake: the learning rate is read once")


def test_adamw_state_under_other_names_fails_after_right_updates():
    class OtherNames(_adamw()):
        def _step(self):
            super()._step()
            for state in self.state.values():
                state["m"] = state.pop("exp_avg")

        def _restore(self):
            for state in self.state.values():
                state["exp_avg"] = state.pop("m")

        def step(self, closure=None):
            self._restore()
            return super().step()
    fails_with(nb12.check_adamw, OtherNames, expected="optimizer.state[p]['exp_avg'] is missing")


def test_torch_adam_is_refused():
    class Subclass(torch.optim.AdamW):
        pass

    class Calls(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
            self.inner = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

        def step(self, closure=None):
            self.inner.param_groups = self.param_groups
            self.inner.step()
    fails_with(nb12.check_adamw, Subclass, expected="subclasses torch.optim.Adam")
    fails_with(nb12.check_adamw, Calls, expected="Adam")
