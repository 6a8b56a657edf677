"""Notebook 09's TiedUnembed grader (graders/exercises/nb09/tying.py): correct variants (in other
styles) pass, each catalogued mistake fails with its name."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fix_last import fix_only_last
from graders.exercises import nb09
from graders.judging.compare import CheckFailed

from catalog_helpers import fails_with


# --- 3. TiedUnembed -------------------------------------------------------------------------------

class Tied(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.W_E = embed.W_E
        self.b_U = nn.Parameter(torch.zeros(embed.W_E.shape[0]))

    def forward(self, x):
        return x @ self.W_E.T + self.b_U


class TiedThroughModule(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.embed = embed                                   # registers the embedding as a submodule
        self.b_U = nn.Parameter(torch.zeros(embed.W_E.shape[0]))

    def forward(self, x):
        return torch.einsum("bpd,vd->bpv", x, self.embed.W_E) + self.b_U


class TiedLinear(Tied):
    def forward(self, x):
        return F.linear(x, self.W_E, self.b_U)


@pytest.mark.parametrize("cls", [Tied, TiedThroughModule, TiedLinear], ids=lambda c: c.__name__)
def test_tying_correct_variants_pass(cls):
    nb09.check_tied_unembed(cls)
    nb09.check_tied_unembed(cls, seed=2, batch=3, seq=5)


class Copied(Tied):
    def __init__(self, embed):
        super().__init__(embed)
        self.W_E = nn.Parameter(embed.W_E.detach().clone())


class SecondParameter(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.W_U = nn.Parameter(embed.W_E.T)                 # views W_E's memory, but a new parameter
        self.b_U = nn.Parameter(torch.zeros(embed.W_E.shape[0]))

    def forward(self, x):
        return x @ self.W_U + self.b_U


class Detached(Tied):
    def forward(self, x):
        return x @ self.W_E.detach().T + self.b_U


class NoBiasAdded(Tied):
    def forward(self, x):
        return x @ self.W_E.T


class NoBias(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.W_E = embed.W_E

    def forward(self, x):
        return x @ self.W_E.T


@pytest.mark.parametrize("cls, message", [
    (Copied, "Likely mistake: W_U is a copy of W_E"),
    (SecondParameter, "Likely mistake: a second nn.Parameter views W_E's memory"),
    (Detached, "Likely mistake: no gradient flows from the unembedding into W_E"),
    (NoBiasAdded, "Likely mistake: the bias b_U is not added"),
    (NoBias, "needs its bias as a parameter `self.b_U`"),
], ids=lambda v: getattr(v, "__name__", None))
def test_tying_mistakes_are_named(cls, message):
    fails_with(nb09.check_tied_unembed, cls, expected=message)


@pytest.mark.parametrize("cls, fix", [(NoBiasAdded, "return x @ self.W_E.T + self.b_U"),
                                      (Copied, "self.W_E = embed.W_E")], ids=["no_bias_added", "copied"])
def test_a_named_tying_mistake_ends_with_the_line_it_corrects(cls, fix):
    with pytest.raises(CheckFailed) as failure:
        nb09.check_tied_unembed(cls)
    assert fix_only_last(str(failure.value)).endswith(f"\n  Show the fix: {fix}"), str(failure.value)
