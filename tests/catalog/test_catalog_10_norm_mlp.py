"""Notebook 10's RMSNorm and SwiGLU graders (graders/exercises/nb10/norm_mlp.py): correct variants (in
other styles) pass, each catalogued mistake fails with its name."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb10
from graders.exercises.nb10 import reference as ref
from graders.judging.compare import CheckFailed
from course_code import course_code_allowed
from catalog_helpers import fails_with


# The variants are built on the course's reference decoder (a subclass with one method changed).
reference_code_allowed = course_code_allowed(ref)


# --- RMSNorm -----------------------------------------------------------------------------------

def _norm(center=False, eps_outside=False, weight=True, norm=False, einsum=False, eps=None,
          in_input_dtype=False, weight_first=False, cast_back=True, dim=-1, one_plus=False, std=False):
    class RMSNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg, self.w = cfg, nn.Parameter(torch.ones(cfg.d_model))

        def forward(self, x):
            x32 = x if in_input_dtype else x.float()
            if center:
                x32 = x32 - x32.mean(-1, keepdim=True)
            ms = (torch.einsum("bpd,bpd->bp", x32, x32)[..., None] / x.shape[-1] if einsum
                  else x32.pow(2).mean(dim, keepdim=True))
            if norm:
                ms = ms * x.shape[-1]
            if std:
                ms = x32.var(-1, unbiased=False, keepdim=True)
            epsilon = self.cfg.rms_norm_eps if eps is None else eps
            scaled = (x32 / (ms.sqrt() + epsilon) if eps_outside else x32 * torch.rsqrt(ms + epsilon))
            if weight_first:
                return (scaled * self.w.float()).to(x.dtype)
            w = (1 + self.w) if one_plus else self.w if weight else 1
            return (scaled.to(x.dtype) if cast_back else scaled) * w
    return RMSNorm


@pytest.mark.parametrize("cls", [ref.RMSNorm, _norm(), _norm(einsum=True), _norm(weight_first=True)])
def test_rms_norm_correct_variants_pass(cls):
    nb10.check_rms_norm(cls)
    nb10.check_rms_norm(cls, seed=3, batch=1, seq=30, rms_norm_eps=1e-5)


@pytest.mark.parametrize("cls, expected", [
    (_norm(center=True), "Likely mistake: the mean is subtracted (that is LayerNorm)"),
    (_norm(eps_outside=True), "Likely mistake: eps is added outside the square root"),
    (_norm(weight=False), "Likely mistake: the learned weight w is not applied"),
    (_norm(norm=True), "Likely mistake: dividing by the norm"),
    (_norm(in_input_dtype=True), "Likely mistake: the mean square is computed in float16"),
    (_norm(cast_back=False), "Likely mistake: the normalised x is not cast back"),
    (_norm(dim=1), "Likely mistake: the mean square is taken over positions (dim 1)"),
    (_norm(one_plus=True), "Likely mistake: the weight is applied as (1 + w)"),
    (_norm(center=True, einsum=True), "Likely mistake: the mean is subtracted"),
    (_norm(std=True), "Likely mistake: x is divided by its standard deviation (the centred variance)"),
])
def test_rms_norm_mistakes_are_named(cls, expected):
    fails_with(nb10.check_rms_norm, cls, expected=expected)


def test_an_untouched_rms_norm_is_answered_before_the_weights_are_made(monkeypatch):
    """The check of an unwritten exercise answers at once; making the seeded weights (a
    second or more on a kernel's first check) waits until the stub has run."""
    from graders.exercises.nb10 import norm_mlp

    class RMSNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg, self.w = cfg, nn.Parameter(torch.ones(cfg.d_model))

        def forward(self, x):
            raise NotImplementedError()

    def no_weights(*args):
        raise AssertionError("the seeded weights were made for an unwritten RMSNorm")

    monkeypatch.setattr(norm_mlp, "weights", no_weights)
    fails_with(nb10.check_rms_norm, RMSNorm, expected="RMSNorm: not written yet")


def test_rms_norm_with_eps_written_in_fails_a_config_with_another():
    nb10.check_rms_norm(_norm(eps=1e-6))
    fails_with(nb10.check_rms_norm, _norm(eps=1e-6), rms_norm_eps=1e-5,
               expected="Likely mistake: eps is not read from the config: 1e-06 is used where this config's "
                        "rms_norm_eps is 1e-05")


class NormBy(nn.Module):
    """An RMSNorm whose forward is `normalise(x, w, eps)`: the mistakes no catalog lists."""
    normalise = None

    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.w = cfg, nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x):
        return type(self).normalise(x.float(), self.w, self.cfg.rms_norm_eps).to(x.dtype)


def _norm_by(normalise):
    return type("RMSNorm", (NormBy,), {"normalise": staticmethod(normalise)})


def _rms(x, eps):
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


@pytest.mark.parametrize("normalise, expected", [
    # held-out mistakes
    (lambda x, w, eps: x / (x.abs().mean(-1, keepdim=True) + eps) * w,
     "Likely mistake: each row's direction is right but its length is not: x is divided by the mean absolute "
     "value, mean(|x|)"),
    (lambda x, w, eps: x * w / _rms(x * w, eps),
     "Likely mistake: your output does not change when the weight w is doubled: w is applied before normalising"),
    # invented here, in no catalog
    (lambda x, w, eps: x / x.abs().amax(-1, keepdim=True) * w,
     "Likely mistake: each row's direction is right but its length is not: x is divided by the largest absolute "
     "value, max(|x|)"),
    (lambda x, w, eps: x / _rms(x, eps) * w * w, "Likely mistake: doubling the weight w multiplies your output by 4, "
                                                 "where it doubles x / rms(x) * w: w is applied twice"),
    (lambda x, w, eps: x / _rms(x, eps) * w * math.sqrt(x.shape[-1]),
     "Likely mistake: every row points the right way but is 16 = sqrt(d_model) times as long, the same factor "
     "everywhere"),
    (lambda x, w, eps: x / (_rms(x, eps) + x.abs().mean(-1, keepdim=True)) * w,
     "Likely mistake: each row's direction is right but its length is not (off by a factor from"),
    (lambda x, w, eps: x / x.pow(4).mean(-1, keepdim=True).pow(0.25) * w,
     "x is divided by the fourth root of mean(x**4)"),
])
def test_rms_norm_mistakes_nobody_listed_are_named_by_properties(normalise, expected):
    """Named from how the output scales with the weight, and from each row's direction and length
    (the length says what x was divided by)."""
    fails_with(nb10.check_rms_norm, _norm_by(normalise), expected=expected)


# --- SwiGLU ------------------------------------------------------------------------------------

def _mlp(kind="right"):
    class SwiGLU(ref.SwiGLU):
        def forward(self, x):
            gate, up = x @ self.W_gate, x @ self.W_up
            hidden = {"right": F.silu(gate) * up, "sigmoid": gate * torch.sigmoid(gate) * up,
                      "swapped": F.silu(up) * gate, "gelu": F.gelu(gate) * up,
                      "both": F.silu(gate) * F.silu(up), "self": F.silu(gate) * gate,
                      "relu": torch.relu(gate) * up, "after": F.silu(gate * up), "no_up": F.silu(gate),
                      "sum_tanh": torch.tanh(gate) + up}[kind]
            return hidden @ self.W_down
    return SwiGLU


@pytest.mark.parametrize("cls", [ref.SwiGLU, _mlp(), _mlp("sigmoid")])
def test_swiglu_correct_variants_pass(cls):
    nb10.check_swiglu(cls)
    nb10.check_swiglu(cls, seed=4, batch=3, seq=7, block=2)


@pytest.mark.parametrize("kind, expected", [
    ("swapped", "Likely mistake: gate and up are swapped"), ("gelu", "Likely mistake: GELU instead of SiLU"),
    ("both", "Likely mistake: the activation is applied to both branches"),
    ("self", "Likely mistake: silu(gate) * gate"),
    ("relu", "Likely mistake: ReLU instead of SiLU on the gate"),
    ("after", "Likely mistake: the activation is applied after the product"),
    ("no_up", "Likely mistake: the up projection is missing from the product"),
    ("sum_tanh", "Likely mistake: the branches are added: SwiGLU multiplies them, silu(gate) * up (and tanh where "
                 "SiLU belongs)"),
])
def test_swiglu_mistakes_are_named(kind, expected):
    fails_with(nb10.check_swiglu, _mlp(kind), expected=expected)


class SwiGLUBy(nn.Module):
    """A SwiGLU whose forward is `mlp(x, W_gate, W_up, W_down)`, declared with its own shapes."""
    mlp, down_shape = None, "d_mlp d_model"

    def __init__(self, cfg):
        super().__init__()
        self.W_gate = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp))
        self.W_up = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp))
        self.W_down = nn.Parameter(torch.zeros(*(getattr(cfg, size) for size in self.down_shape.split())))

    def forward(self, x):
        return type(self).mlp(x, self.W_gate, self.W_up, self.W_down)


def _swiglu_by(mlp, down_shape="d_mlp d_model"):
    return type("SwiGLU", (SwiGLUBy,), {"mlp": staticmethod(mlp), "down_shape": down_shape})


def _hidden(x, gate, up):
    return F.silu(x @ gate) * (x @ up)


@pytest.mark.parametrize("cls, expected", [
    # held-out mistake: W_down used transposed, or declared as nn.Linear stores it
    (_swiglu_by(lambda x, gate, up, down: _hidden(x, gate, up) @ down.T),
     "Likely mistake: W_down is used transposed: it is [688, 256]"),
    (_swiglu_by(lambda x, gate, up, down: _hidden(x, gate, up) @ down.T, "d_model d_mlp"),
     "Likely mistake: W_down is declared transposed, [256, 688] as nn.Linear stores a weight ([out, in])"),
    # invented here, in no catalog
    (_swiglu_by(lambda x, gate, up, down: x + _hidden(x, gate, up) @ down),
     "Likely mistake: your output is the MLP plus its input x (the difference from the reference is x itself): "
     "the residual is added inside"),
    (_swiglu_by(lambda x, gate, up, down: _hidden(x, gate, up) @ down / math.sqrt(down.shape[0])),
     "Likely mistake: your output is the reference's times 1/26.23 = 1/sqrt(d_mlp), the same factor everywhere"),
    (_swiglu_by(lambda x, gate, up, down: -(_hidden(x, gate, up) @ down)),
     "Likely mistake: your output is the reference's with its sign flipped"),
])
def test_swiglu_mistakes_nobody_listed_are_named_by_properties(cls, expected):
    fails_with(nb10.check_swiglu, cls, expected=expected)


def _noisy(y):
    """y plus seeded noise of 1% of its spread: wrong, with none of the properties the readers name."""
    return y + 0.01 * y.std() * torch.randn(y.shape, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("check, learner", [
    (nb10.check_rms_norm, _norm_by(lambda x, w, eps: _noisy(x / _rms(x, eps) * w))),
    (nb10.check_swiglu, _swiglu_by(lambda x, gate, up, down: _noisy(_hidden(x, gate, up) @ down))),
])
def test_an_output_without_those_properties_is_not_given_a_name(check, learner):
    """The readers name only what the output shows: a wrong output with none of their properties
    fails with where it differs and the hint, and no likely mistake."""
    with pytest.raises(CheckFailed) as failure:
        check(learner)
    assert "Likely mistake" not in str(failure.value) and "Hint:" in str(failure.value), str(failure.value)
