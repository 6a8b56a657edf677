"""TransformerBlock grader: catalogued wiring mistakes fail with their name; correct variants pass."""
import pytest
import torch
from torch import nn

from graders.exercises import nb05
from graders.judging.compare import CheckFailed
from graders.reference.components import MLP, Attention, LayerNorm


class Base(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn = LayerNorm(cfg), Attention(cfg)
        self.ln2, self.mlp = LayerNorm(cfg), MLP(cfg)


def variant(forward, base=Base):
    return type(forward.__name__, (base,), {"forward": forward})


# --- correct variants ---------------------------------------------------------------------

def textbook(self, resid_pre):
    resid_mid = resid_pre + self.attn(self.ln1(resid_pre))
    return resid_mid + self.mlp(self.ln2(resid_mid))


def add_order_swapped(self, resid_pre):
    resid_mid = self.attn(self.ln1(resid_pre)) + resid_pre
    return self.mlp(self.ln2(resid_mid)) + resid_mid


def torch_add(self, x):
    x = torch.add(x, self.attn(self.ln1(x)))
    x = torch.add(x, self.mlp(self.ln2(x)))
    return x


def out_of_place_accumulate(self, x):
    attn_out = self.attn(self.ln1(x))
    x = x + attn_out          # rebinding, not in place
    mlp_out = self.mlp(self.ln2(x))
    return x + mlp_out


CORRECT = [textbook, add_order_swapped, torch_add, out_of_place_accumulate]


@pytest.mark.parametrize("forward", CORRECT, ids=lambda f: f.__name__)
def test_correct_variants_pass(forward):
    cls = variant(forward)
    nb05.check_transformer_block(cls)
    nb05.check_transformer_block(cls, block=7, text=None, seed=11, batch=2)


# --- buggy variants -----------------------------------------------------------------------

def post_norm(self, x):
    x = self.ln1(x + self.attn(x))
    return self.ln2(x + self.mlp(x))


def no_attn_residual(self, x):
    mid = self.attn(self.ln1(x))
    return mid + self.mlp(self.ln2(mid))


def no_mlp_residual(self, x):
    mid = x + self.attn(self.ln1(x))
    return self.mlp(self.ln2(mid))


def ln1_twice(self, x):
    mid = x + self.attn(self.ln1(x))
    return mid + self.mlp(self.ln1(mid))


def ln2_twice(self, x):
    mid = x + self.attn(self.ln2(x))
    return mid + self.mlp(self.ln2(mid))


def mlp_reads_resid_pre(self, x):
    mid = x + self.attn(self.ln1(x))
    return mid + self.mlp(self.ln2(x))


def parallel_gptj(self, x):
    return x + self.attn(self.ln1(x)) + self.mlp(self.ln1(x))


def in_place(self, x):
    x += self.attn(self.ln1(x))
    x += self.mlp(self.ln2(x))
    return x


def no_mlp(self, x):
    return x + self.attn(self.ln1(x))


def sublayers_in_a_loop_post_norm(self, x):
    for norm, sublayer in ((self.ln1, self.attn), (self.ln2, self.mlp)):
        x = norm(x + sublayer(x))
    return x


def mlp_given_the_layernorm(self, x):
    mid = x + self.attn(self.ln1(x))
    return mid + self.mlp(self.ln2)          # the module, not ln2(mid)


def attn_given_tokens_shape(self, x):
    mid = x + self.attn(self.ln1(x)[0])     # drops the batch dimension
    return mid + self.mlp(self.ln2(mid))


class SharedLN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn = LayerNorm(cfg), Attention(cfg)
        self.ln2, self.mlp = self.ln1, MLP(cfg)


BUGGY = [
    (variant(post_norm), "the first activation in forward order", "post-norm"),
    (variant(no_attn_residual), "hook_resid_mid, the first", "no residual connection around attention"),
    (variant(no_mlp_residual), "hook_resid_post, the first", "no residual connection around the MLP"),
    (variant(ln1_twice), "could not see hook_resid_mid", "the same LayerNorm (ln1)"),
    (variant(ln2_twice), "could not see ln1.hook_out", "the same LayerNorm (ln2)"),
    (variant(mlp_reads_resid_pre), "hook_resid_mid, the first", "the MLP reads resid_pre instead"),
    (variant(parallel_gptj), "could not see hook_resid_mid", "in parallel on one shared LayerNorm"),
    (variant(in_place), "", "changed its input tensor in place"),
    (variant(no_mlp), "could not see hook_resid_mid", "the MLP branch is missing"),
    (variant(textbook, SharedLN), "", "ln1 and ln2 are one LayerNorm object"),
    (variant(sublayers_in_a_loop_post_norm), "the first activation in forward order", "post-norm"),
    (variant(mlp_given_the_layernorm), "the call self.mlp(...) failed; it was given LayerNorm",
     "self.mlp(...) takes the residual stream"),
    (variant(attn_given_tokens_shape),
     "the call self.attn(...) failed; it was given a float32 tensor of shape [35, 768]",
     "self.attn(...) takes the residual stream"),
]


@pytest.mark.parametrize("cls, where, diagnosis", BUGGY, ids=lambda v: getattr(v, "__name__", None))
def test_buggy_variants_are_named(cls, where, diagnosis):
    with pytest.raises(CheckFailed) as failure:
        nb05.check_transformer_block(cls)
    message = str(failure.value)
    assert where in message.splitlines()[0], message
    assert diagnosis in message.splitlines()[0], message


def test_library_block_is_refused():
    from graders.reference import components

    def uses_course_block(self, x):
        return components.TransformerBlock.forward(self, x)

    with pytest.raises(CheckFailed, match="your code"):
        nb05.check_transformer_block(variant(uses_course_block))
