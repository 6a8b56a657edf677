"""Notebook 09's PostNormBlock grader (graders/exercises/nb09/norms.py): correct variants (in other
styles) pass, each catalogued mistake fails with its name."""
import pytest
import torch
from torch import nn

from fix_last import fix_only_last
from graders.exercises import nb09
from graders.judging.compare import CheckFailed
from graders.reference.components import MLP, Attention, LayerNorm

from catalog_helpers import fails_with


# --- 2. PostNormBlock -----------------------------------------------------------------------------

class Parts(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn, self.ln1, self.mlp, self.ln2 = Attention(cfg), LayerNorm(cfg), MLP(cfg), LayerNorm(cfg)


def block(forward, base=Parts):
    return type(forward.__name__, (base,), {"forward": forward})


def post_norm(self, x):
    mid = self.ln1(x + self.attn(x))
    return self.ln2(mid + self.mlp(mid))


def post_norm_swapped_adds(self, x):
    mid = self.ln1(torch.add(self.attn(x), x))
    return self.ln2(self.mlp(mid) + mid)


@pytest.mark.parametrize("forward", [post_norm, post_norm_swapped_adds], ids=lambda f: f.__name__)
def test_post_norm_correct_variants_pass(forward):
    nb09.check_post_norm_block(block(forward))
    nb09.check_post_norm_block(block(forward), seed=4, batch=3, seq=7)


def pre_norm(self, x):
    mid = x + self.attn(self.ln1(x))
    return mid + self.mlp(self.ln2(mid))


def norm_before_add(self, x):
    mid = x + self.ln1(self.attn(x))
    return mid + self.ln2(self.mlp(mid))


def swapped_norms(self, x):
    mid = self.ln2(x + self.attn(x))
    return self.ln1(mid + self.mlp(mid))


def mlp_reads_input(self, x):
    mid = self.ln1(x + self.attn(x))
    return self.ln2(mid + self.mlp(x))


def no_final_norm(self, x):
    mid = self.ln1(x + self.attn(x))
    return mid + self.mlp(mid)


def in_place(self, x):
    x += self.attn(x)
    x = self.ln1(x)
    return self.ln2(x + self.mlp(x))


class SharedNorm(Parts):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.ln2 = self.ln1


@pytest.mark.parametrize("cls, message", [
    (block(pre_norm), "Likely mistake: pre-norm (GPT-2's block)"),
    (block(norm_before_add), "Likely mistake: each sublayer's output is normalised before it is added"),
    (block(swapped_norms), "Likely mistake: ln1 and ln2 are swapped"),
    (block(mlp_reads_input), "Likely mistake: the MLP reads resid_pre"),
    (block(no_final_norm), "Likely mistake: ln2 is missing"),
    (block(in_place), "in place"),
    (block(post_norm, SharedNorm), "Likely mistake: ln1 and ln2 are one LayerNorm object"),
], ids=lambda v: getattr(v, "__name__", None))
def test_post_norm_mistakes_are_named(cls, message):
    fails_with(nb09.check_post_norm_block, cls, expected=message)


@pytest.mark.parametrize("cls, fix", [
    (block(no_final_norm), "return self.ln2(resid_mid + self.mlp(resid_mid))"),
    (block(post_norm, SharedNorm), "self.ln2 = LayerNorm(cfg)"),
], ids=["no_final_norm", "shared_norm"])
def test_a_named_post_norm_mistake_ends_with_the_line_it_corrects(cls, fix):
    with pytest.raises(CheckFailed) as failure:
        nb09.check_post_norm_block(cls)
    assert fix_only_last(str(failure.value)).endswith(f"\n  Show the fix: {fix}"), str(failure.value)


def test_post_norm_library_layer_is_refused():
    class Library(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads)

        def forward(self, x):
            return self.layer(x)

    with pytest.raises(CheckFailed):
        nb09.check_post_norm_block(Library)
