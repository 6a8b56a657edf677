"""GPT-2 grader (06): Unembed mistakes are named; correct variants pass."""
import einops
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb06
from graders.judging.compare import CheckFailed


# --- Unembed ------------------------------------------------------------------------------


class UnembedBase(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))


def unembed_variant(forward):
    return type(forward.__name__, (UnembedBase,), {"forward": forward})


def matmul(self, x):
    return x @ self.W_U + self.b_U


def einsum(self, x):
    return torch.einsum("bpd,dv->bpv", x, self.W_U) + self.b_U


def einops_einsum(self, x):
    return einops.einsum(x, self.W_U, "b p d, d v -> b p v") + self.b_U


def addmm(self, x):
    flat = torch.addmm(self.b_U, x.reshape(-1, x.shape[-1]), self.W_U)
    return flat.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("forward", [matmul, einsum, einops_einsum, addmm], ids=lambda f: f.__name__)
def test_correct_unembed_passes(forward):
    nb06.check_unembed(unembed_variant(forward))
    nb06.check_unembed(unembed_variant(forward), text=None, seed=3, batch=2)


def no_bias(self, x):
    return x @ self.W_U


def minus_bias(self, x):
    return x @ self.W_U - self.b_U


def softmaxed(self, x):
    return (x @ self.W_U + self.b_U).softmax(-1)


def log_softmaxed(self, x):
    return F.log_softmax(x @ self.W_U + self.b_U, dim=-1)


def last_position_only(self, x):
    return x[:, -1] @ self.W_U + self.b_U


def linear(self, x):
    return F.linear(x, self.W_U.T, self.b_U)


class WrongNames(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))

    def forward(self, x):
        return x @ self.W


UNEMBED_BUGGY = [
    (unembed_variant(no_bias), "Likely mistake: the bias b_U is not added"),
    (unembed_variant(minus_bias), "Likely mistake: the bias b_U is subtracted"),
    (unembed_variant(softmaxed), "Likely mistake: softmax applied"),
    (unembed_variant(log_softmaxed), "Likely mistake: log_softmax applied"),
    (unembed_variant(last_position_only), "Likely mistake: only the last position is unembedded"),
    (unembed_variant(linear), "your code calls `torch.nn.functional.linear`"),
    (WrongNames, "missing: W_U"),
]


@pytest.mark.parametrize("cls, diagnosis", UNEMBED_BUGGY, ids=lambda v: getattr(v, "__name__", None))
def test_buggy_unembed_is_named(cls, diagnosis):
    with pytest.raises(CheckFailed) as failure:
        nb06.check_unembed(cls)
    message = str(failure.value)
    assert diagnosis in (message if cls is WrongNames else message.splitlines()[0]), message


def _wrong_from_column(first_wrong):
    def forward(self, x):
        logits = x @ self.W_U + self.b_U
        return torch.cat([logits[..., :first_wrong], 1.5 * logits[..., first_wrong:]], -1)
    return forward


def _wrong_below_column(end):
    def forward(self, x):
        logits = x @ self.W_U + self.b_U
        return torch.cat([1.5 * logits[..., :end], logits[..., end:]], -1)
    return forward


@pytest.mark.parametrize("forward, note", [
    (_wrong_below_column(100), "only some d_vocab values are wrong: d_vocab 0, 1, 2, 3, 4, 5, 6, 7 ... (100 of 50257)"),
    (_wrong_from_column(34), "most d_vocab values are wrong (50223 of 50257); right only at d_vocab 0, 1, 2, 3, 4, 5, "
                             "6, 7 ..."),
], ids=["some", "most"])
def test_the_quantifier_of_wrong_values_follows_their_count(forward, note):
    with pytest.raises(CheckFailed) as failure:
        nb06.check_unembed(type("Unembed", (UnembedBase,), {"forward": forward}))
    assert f"\n  {note}" in str(failure.value), str(failure.value)
