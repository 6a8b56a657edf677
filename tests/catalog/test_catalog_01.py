"""LayerNorm grader: catalogued mistakes fail with their name; correct variants pass."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb01
from graders.judging.compare import CheckFailed
from graders.reference.config import Config
from fix_last import fix_only_last

cfg = Config()   # as in the notebook: a global beside the module's own self.cfg


class Base(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))


def variant(forward):
    return type(forward.__name__, (Base,), {"forward": forward})


def by_hand(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def var_correction_0(self, x):
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + self.cfg.layer_norm_eps) * self.w + self.b


def std_unbiased_false(self, x):
    var = x.std(-1, keepdim=True, unbiased=False) ** 2
    return self.w * (x - x.mean(-1, keepdim=True)) / torch.sqrt(var + self.cfg.layer_norm_eps) + self.b


def einsum_sum(self, x):
    d = x.shape[-1]
    centred = x - torch.einsum("bpd->bp", x)[..., None] / d
    var = torch.einsum("bpd,bpd->bp", centred, centred)[..., None] / d
    return centred / (var + self.cfg.layer_norm_eps) ** 0.5 * self.w + self.b


def row_loop(self, x):
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            row = x[b, p]
            centred = row - row.mean()
            out[b, p] = centred / torch.sqrt((centred * centred).mean() + self.cfg.layer_norm_eps)
    return out * self.w + self.b


CORRECT = [by_hand, var_correction_0, std_unbiased_false, einsum_sum, row_loop]


@pytest.mark.parametrize("forward", CORRECT, ids=lambda f: f.__name__)
def test_correct_variants_pass(forward):
    cls = variant(forward)
    nb01.check_layernorm(cls)
    nb01.check_layernorm(cls, block=7, text=None, seed=11, batch=3)


def sample_variance(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.var(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def eps_outside(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps) * self.w + self.b


def not_centred(self, x):
    var = x.var(-1, keepdim=True, unbiased=False)
    return x / (var + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def no_scale(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() + self.b


def no_shift(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w


def divides_by_variance(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps) * self.w + self.b


def wrong_dimension(self, x):
    x = x - x.mean(-2, keepdim=True)
    return x / (x.pow(2).mean(-2, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def rms_style(self, x):
    return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def rms_style_einsum(self, x):
    mean_square = torch.einsum("bpd,bpd->bp", x, x)[..., None] / x.shape[-1]
    return x * torch.rsqrt(mean_square + self.cfg.layer_norm_eps) * self.w + self.b


def rms_style_norm(self, x):
    rms = (x.norm(dim=-1, keepdim=True) ** 2 / x.shape[-1] + self.cfg.layer_norm_eps) ** 0.5
    return self.w * (x / rms) + self.b


def uncentred_variance(self, x):
    centred = x - x.mean(-1, keepdim=True)
    return centred / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def sample_variance_loop(self, x):
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            row = x[b, p]
            out[b, p] = (row - row.mean()) / torch.sqrt(row.var() + self.cfg.layer_norm_eps)
    return out * self.w + self.b


def in_place(self, x):
    x -= x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def library(self, x):
    return F.layer_norm(x, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)


def library_module(self, x):
    ln = nn.LayerNorm(self.cfg.d_model)
    return ln(x) * self.w + self.b


def drops_keepdim(self, x):
    return (x - x.mean(-1, keepdim=True)).mean(-1)


def positions_sample_variance(self, x):
    mean, var = x.mean(dim=1, keepdim=True), x.var(dim=1, keepdim=True)
    return (x - mean) / (var + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def positions_mean(self, x):
    centred = x - x.mean(dim=1, keepdim=True)
    return centred / (centred.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def not_implemented(self, x):
    raise NotImplementedError()


BUGGY = [
    (sample_variance, "Likely mistake: sample variance"),
    (eps_outside, "Likely mistake: eps added outside the square root"),
    (not_centred, "Likely mistake: the mean is not subtracted"),
    (rms_style, "Likely mistake: RMS-style normalisation"),
    (rms_style_einsum, "Likely mistake: RMS-style normalisation"),
    (rms_style_norm, "Likely mistake: RMS-style normalisation"),
    (uncentred_variance, "Likely mistake: the variance is taken of the uncentred x"),
    (sample_variance_loop, "Likely mistake: sample variance"),
    (no_scale, "Likely mistake: the learned scale w is not applied"),
    (no_shift, "Likely mistake: the learned shift b is not added"),
    (divides_by_variance, "Likely mistake: dividing by the variance"),
    (wrong_dimension,
     "Likely mistake: normalising over the wrong dimension: the statistics are taken across positions"),
    (positions_sample_variance,
     "Likely mistake: normalising over the wrong dimension: the mean and the (sample) variance"),
    (positions_mean, "Likely mistake: normalising over the wrong dimension: the mean is taken across positions"),
    (in_place, "changed its input tensor in place"),
    (library, "calls `torch.nn.functional.layer_norm`"),
    (library_module, "calls `LayerNorm.forward`"),
    (drops_keepdim, "has 2 dimensions"),
    (not_implemented, "not written yet"),
]


@pytest.mark.parametrize("forward,message", BUGGY, ids=[f.__name__ for f, _ in BUGGY])
def test_buggy_variants_fail_with_their_diagnosis(forward, message):
    with pytest.raises(CheckFailed) as failure:
        nb01.check_layernorm(variant(forward), block=3)
    first_line = fix_only_last(str(failure.value)).splitlines()[0]
    assert message in first_line, str(failure.value)


def test_wrong_parameter_names_are_listed():
    class Renamed(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(cfg.d_model))
            self.bias = nn.Parameter(torch.zeros(cfg.d_model))

        def forward(self, x):
            return x

    with pytest.raises(CheckFailed) as failure:
        nb01.check_layernorm(Renamed)
    message = str(failure.value)
    assert "missing: w with shape [768]" in message and "unexpected: weight" in message


@pytest.mark.parametrize("forward", CORRECT, ids=lambda f: f.__name__)
def test_correct_variants_read_eps_from_their_config(forward):
    nb01.check_layernorm(variant(forward), layer_norm_eps=1e-3)
    nb01.check_layernorm(variant(forward), block=-1, text=None, seed=5, batch=2, layer_norm_eps=0.05)


def eps_literal(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * self.w + self.b


def eps_of_global_cfg(self, x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps).sqrt() * self.w + self.b


@pytest.mark.parametrize("forward,how", [(eps_literal, "not a literal"),
                                         (eps_of_global_cfg, "reads the notebook's global `cfg`")],
                         ids=["literal", "global_cfg"])
def test_eps_not_read_from_the_config_is_named(forward, how):
    nb01.check_layernorm(variant(forward))   # GPT-2's own eps: the default config cannot tell
    with pytest.raises(CheckFailed) as failure:
        nb01.check_layernorm(variant(forward), layer_norm_eps=1e-3)
    first_line = fix_only_last(str(failure.value)).splitlines()[0]
    assert ("Likely mistake: eps is not read from cfg.layer_norm_eps (your LayerNorm used 1e-05; "
            "this check's config has 0.001)") in first_line and how in first_line, str(failure.value)


def test_a_passing_check_writes_nothing_to_stderr(capfd):
    nb01.check_layernorm(variant(by_hand))
    out, err = capfd.readouterr()
    assert err == "" and "LayerNorm: correct" in out
