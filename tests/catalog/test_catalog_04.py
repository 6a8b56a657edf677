"""nb04's catalog: each common gelu_new / MLP mistake is caught and named; correct variants pass."""
import math

import einops
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fix_last import fix_only_last
from graders.exercises import nb04
from graders.judging.compare import CheckFailed
from graders.reference.config import Config

HIDDEN = dict(block=9, text=None, seed=3, batch=2)
C = math.sqrt(2 / math.pi)


# --- gelu_new ------------------------------------------------------------------------------

def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x ** 3)))


def gelu_exp(x):
    z = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (2 / (1 + torch.exp(-2 * z)))   # 1 + tanh(z) = 2 sigmoid(2z), via exp


def gelu_pow(x):
    inner = torch.sqrt(torch.tensor(2 / torch.pi)) * (x + 0.044715 * torch.pow(x, 3.0))
    return x * 0.5 * (1.0 + inner.tanh())


@pytest.mark.parametrize("fn", [gelu_tanh, gelu_exp, gelu_pow], ids=lambda f: f.__name__)
def test_correct_gelu_passes(fn):
    nb04.check_gelu_new(fn)
    nb04.check_gelu_new(fn, **HIDDEN)


def gelu_erf(x):
    return F.gelu(x)


def gelu_uses_module(x):
    return nn.GELU(approximate="tanh")(x)


def gelu_course(x):
    from graders.reference import components
    return components.gelu_new(x)


def gelu_inplace(x):
    inner = x + 0.044715 * x ** 3
    x.mul_(0.5)
    return x * 2 * 0.5 * (1 + torch.tanh(C * inner))


GELU_BUGGY = {
    "erf_by_hand": (lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))), "exact GELU"),
    "relu": (lambda x: x.clamp(min=0), "ReLU"),
    "sigmoid": (lambda x: x * torch.sigmoid(1.702 * x), "sigmoid approximation"),
    "no_cubic": (lambda x: 0.5 * x * (1 + torch.tanh(C * x)), "cubic term is missing"),
    "no_sqrt": (lambda x: 0.5 * x * (1 + torch.tanh(x + 0.044715 * x ** 3)), "sqrt(2/pi) is missing"),
    "square": (lambda x: 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x ** 2))), "x**2 instead of x**3"),
    "no_half": (lambda x: x * (1 + torch.tanh(C * (x + 0.044715 * x ** 3))), "0.5 is missing"),
    "identity": (lambda x: x.clone(), "no activation"),
    "F_gelu": (gelu_erf, "your code uses `F.gelu`"),
    "nn_GELU": (gelu_uses_module, "your code uses `nn.GELU`"),
    "course": (gelu_course, "graders.reference.components"),
    "in_place": (gelu_inplace, "in place"),
}


@pytest.mark.parametrize("name", GELU_BUGGY)
def test_buggy_gelu_is_named(name):
    fn, expected = GELU_BUGGY[name]
    with pytest.raises(CheckFailed) as info:
        nb04.check_gelu_new(fn)
    assert expected in fix_only_last(str(info.value)).splitlines()[0], str(info.value)


def test_a_named_gelu_mistake_ends_with_the_formula_and_no_recipe():
    with pytest.raises(CheckFailed) as info:
        nb04.check_gelu_new(GELU_BUGGY["square"][0])
    message = fix_only_last(str(info.value))
    assert message.endswith(f"\n  Show the fix: {nb04.GELU_FIX}"), message
    assert "Hint:" not in message, message   # the mistake is named: no general recipe under it


def test_gelu_tripwire_catches_hidden_library_call():
    def sneaky(x):
        return getattr(F, "ge" + "lu")(x, approximate="tanh")
    with pytest.raises(CheckFailed) as info:
        nb04.check_gelu_new(sneaky)
    assert "your code calls" in str(info.value), str(info.value)


# --- MLP -----------------------------------------------------------------------------------

def mlp_class(forward):
    class MLP(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
            self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
            self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
            self.b_out = nn.Parameter(torch.zeros(cfg.d_model))

        def forward(self, x):
            return forward(self, x)
    return MLP


MLP_CORRECT = {
    "matmul": lambda m, x: gelu_tanh(x @ m.W_in + m.b_in) @ m.W_out + m.b_out,
    "einsum": lambda m, x: torch.einsum("bpm,md->bpd", gelu_exp(torch.einsum("bpd,dm->bpm", x, m.W_in) + m.b_in),
                                        m.W_out) + m.b_out,
    "einops": lambda m, x: einops.einsum(gelu_pow(einops.einsum(x, m.W_in, "b p d, d m -> b p m") + m.b_in),
                                         m.W_out, "b p m, m d -> b p d") + m.b_out,
    "linear": lambda m, x: F.linear(gelu_tanh(F.linear(x, m.W_in.T, m.b_in)), m.W_out.T, m.b_out),
    "position_loop": lambda m, x: torch.stack(
        [gelu_tanh(x[:, p] @ m.W_in + m.b_in) @ m.W_out + m.b_out for p in range(x.shape[1])], dim=1),
}


@pytest.mark.parametrize("name", MLP_CORRECT)
def test_correct_mlp_passes(name):
    cls = mlp_class(MLP_CORRECT[name])
    nb04.check_mlp(cls)
    nb04.check_mlp(cls, **HIDDEN)


class MLPWithLinear(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.fc_in, self.fc_out = nn.Linear(cfg.d_model, cfg.d_mlp), nn.Linear(cfg.d_mlp, cfg.d_model)

    def forward(self, x):
        return self.fc_out(gelu_tanh(self.fc_in(x)))


MLP_BUGGY = {
    "erf": (lambda m, x: 0.5 * (h := x @ m.W_in + m.b_in) * (1 + torch.erf(h / math.sqrt(2))) @ m.W_out + m.b_out,
            "exact GELU"),
    "relu": (lambda m, x: (x @ m.W_in + m.b_in).relu() @ m.W_out + m.b_out, "call gelu_new"),
    "sigmoid": (lambda m, x: (h := x @ m.W_in + m.b_in) * torch.sigmoid(1.702 * h) @ m.W_out + m.b_out,
                "sigmoid approximation"),
    "no_b_in": (lambda m, x: gelu_tanh(x @ m.W_in) @ m.W_out + m.b_out, "b_in is missing"),
    "no_b_out": (lambda m, x: gelu_tanh(x @ m.W_in + m.b_in) @ m.W_out, "b_out is missing"),
    "b_in_after": (lambda m, x: (gelu_tanh(x @ m.W_in) + m.b_in) @ m.W_out + m.b_out, "after the activation"),
    "residual": (lambda m, x: x + gelu_tanh(x @ m.W_in + m.b_in) @ m.W_out + m.b_out, "adds its input back"),
    "no_activation": (lambda m, x: (x @ m.W_in + m.b_in) @ m.W_out + m.b_out, "no activation"),
    "transposed": (lambda m, x: gelu_tanh(x @ m.W_in.T + m.b_in) @ m.W_out + m.b_out, "without a transpose"),
    "out_transposed": (lambda m, x: gelu_tanh(x @ m.W_in + m.b_in) @ m.W_out.T + m.b_out, "without a transpose"),
    "activation_after_out_matmul": (lambda m, x: gelu_tanh((x @ m.W_in + m.b_in) @ m.W_out + m.b_out),
                                    "the activation is applied after the output projection"),
    "activation_after_out_einsum": (
        lambda m, x: gelu_exp(torch.einsum("bpm,md->bpd", torch.einsum("bpd,dm->bpm", x, m.W_in) + m.b_in,
                                           m.W_out) + m.b_out),
        "the activation is applied after the output projection"),
    "activation_after_out_before_bias": (
        lambda m, x: gelu_pow(einops.einsum(x @ m.W_in + m.b_in, m.W_out, "b p m, m d -> b p d")) + m.b_out,
        "the activation is applied after the output projection, before b_out"),
    "activation_twice": (lambda m, x: gelu_tanh(gelu_tanh(x @ m.W_in + m.b_in) @ m.W_out + m.b_out),
                         "the activation is applied twice"),
    "no_b_out_einsum": (lambda m, x: torch.einsum("bpm,md->bpd", gelu_exp(x @ m.W_in + m.b_in), m.W_out),
                        "b_out is missing"),
}


@pytest.mark.parametrize("name", MLP_BUGGY)
def test_buggy_mlp_is_named(name):
    forward, expected = MLP_BUGGY[name]
    with pytest.raises(CheckFailed) as info:
        nb04.check_mlp(mlp_class(forward))
    assert expected in fix_only_last(str(info.value)).splitlines()[0], str(info.value)


@pytest.mark.parametrize("name, fix", [("no_b_in", nb04.HIDDEN_LAYER), ("relu", nb04.ACTIVATION),
                                       ("residual", nb04.OUTPUT),
                                       ("activation_after_out_matmul", f"{nb04.ACTIVATION}; {nb04.OUTPUT}")])
def test_a_named_mlp_mistake_ends_with_the_line_it_corrects(name, fix):
    with pytest.raises(CheckFailed) as info:
        nb04.check_mlp(mlp_class(MLP_BUGGY[name][0]))
    message = fix_only_last(str(info.value))
    assert message.endswith(f"\n  Show the fix: {fix}"), message
    assert "Hint:" not in message, message


def test_mlp_with_other_parameter_names_is_refused():
    with pytest.raises(CheckFailed) as info:
        nb04.check_mlp(MLPWithLinear)
    assert "missing: W_in" in str(info.value), str(info.value)


def gelu_new(x):
    """The example class's gelu_new (x**2 where x**3 belongs), which the MLP below calls by name."""
    return 0.5 * x * (1.0 + torch.tanh(C * (x + 0.044715 * x.pow(2))))


def test_a_wrong_gelu_new_costs_only_its_own_check():
    """The MLP's check runs the course's gelu_new under the learner's name for it (04
    charged a wrong gelu_new twice), and gives the learner's back afterwards."""
    with pytest.raises(CheckFailed, match=r"x\*\*2 instead of x\*\*3"):
        nb04.check_gelu_new(gelu_new)
    nb04.check_mlp(mlp_class(lambda m, x: gelu_new(x @ m.W_in + m.b_in) @ m.W_out + m.b_out))
    assert gelu_new.__module__ == __name__ and gelu_new(torch.tensor(2.0)) != gelu_tanh(torch.tensor(2.0))
