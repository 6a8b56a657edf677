"""Notebook 12's clip_grad_norm grader (graders/exercises/nb12/clipping.py): correct variants (in other
styles) pass, each catalogued mistake fails with its name."""
import pytest
import torch

from graders.exercises import nb12
from catalog_helpers import fails_with


# --- clip_grad_norm ----------------------------------------------------------------------------

def _clip(kind="right"):
    def clip_grad_norm(parameters, max_norm):
        if kind == "twice":
            grads = (p.grad for p in parameters if p.grad is not None)
            params = parameters
        else:
            params = [p for p in parameters if p.grad is not None]
            grads = [p.grad for p in params]
        if kind == "float64":
            total = sum(g.double().pow(2).sum() for g in grads) ** 0.5
        elif kind == "foreach":
            total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        elif kind == "twice":
            total = sum(float(g.pow(2).sum()) for g in grads) ** 0.5
        elif kind == "l1":
            total = sum(g.abs().sum() for g in grads)
        elif kind == "summed":
            total = sum(g.norm() for g in grads)
        else:
            total = torch.stack([g.norm() for g in grads]).norm()
        for p in params:
            if p.grad is None:
                continue
            own = p.grad.norm()
            coef = max_norm / ((own if kind == "per_parameter" else total) + 1e-6)
            if kind == "clamped":
                p.grad.mul_(torch.clamp(torch.as_tensor(coef), max=1.0))
            elif kind == "inverted":
                p.grad.mul_(1 / coef) if coef < 1 else None
            elif kind == "sqrt":                   # unlisted: the square root of the coefficient
                p.grad.mul_(coef ** 0.5) if coef < 1 else None
            elif kind == "always" or coef < 1:
                p.grad.mul_(coef * coef if kind == "squared" else coef)
        if kind == "after":
            return torch.stack([p.grad.norm() for p in params]).norm()
        return total
    return clip_grad_norm


@pytest.mark.parametrize("kind", ["right", "float64", "clamped"])
def test_clip_correct_variants_pass(kind):
    nb12.check_clip_grad_norm(_clip(kind))
    nb12.check_clip_grad_norm(_clip(kind), seed=1)


@pytest.mark.parametrize("kind, expected", [
    ("per_parameter", "Likely mistake: each parameter is clipped by its own norm"),
    ("always", "Likely mistake: the gradients are scaled up when their norm is below max_norm"),
    ("after", "Likely mistake: the norm is returned after clipping"),
    ("twice", "may be a generator (model.parameters())"),
    ("squared", ["gradients differ from clip_grad_norm_'s", "scaled down by", "Likely mistake: every gradient is "
                 "scaled by one factor", "the square of clip_grad_norm_'s"]),
    ("sqrt", "the square root of clip_grad_norm_'s"),
    ("inverted", "Likely mistake: the coefficient is inverted"),
    ("l1", "Likely mistake: the norm is the L1 norm"),
    ("summed", "Likely mistake: the total norm is the sum of each parameter's norm"),
])
def test_clip_mistakes_are_named(kind, expected):
    fails_with(nb12.check_clip_grad_norm, _clip(kind), expected=expected)


def test_clip_library_version_is_refused():
    fails_with(nb12.check_clip_grad_norm, lambda params, max_norm: torch.nn.utils.clip_grad_norm_(params, max_norm),
               expected="clip_grad_norm_")
