"""TransformerBlock grader: catalogued wiring mistakes fail with their name; correct variants pass."""
import dataclasses

import pytest
import torch
from torch import nn

from fix_last import fix_only_last
from graders.exercises import nb05
from graders.judging.compare import CheckFailed
from graders.reference.components import MLP, Attention, LayerNorm
from graders.reference.config import Config


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
    message = fix_only_last(str(failure.value))
    assert where in message.splitlines()[0], message
    assert diagnosis in message.splitlines()[0], message


def test_a_missing_residual_is_corrected_on_the_fix_line_only():
    with pytest.raises(CheckFailed) as failure:
        nb05.check_transformer_block(variant(no_mlp_residual))
    message = fix_only_last(str(failure.value))
    assert message.endswith("\n  Show the fix: resid_post = resid_mid + self.mlp(self.ln2(resid_mid))"), message
    assert "Hint:" not in message, message   # the mistake is named: no general recipe under it


def test_library_block_is_refused():
    from graders.reference import components

    def uses_course_block(self, x):
        return components.TransformerBlock.forward(self, x)

    with pytest.raises(CheckFailed, match="your code"):
        nb05.check_transformer_block(variant(uses_course_block))


# --- the parts built with the block's own config ----------------------------------------------

OTHER_CONFIG = dict(block=3, layer_norm_eps=1e-3, n_heads=6, d_head=128)
cfg = Config()   # as in the notebook: a global beside the `cfg` each block is given


@pytest.mark.parametrize("forward", CORRECT, ids=lambda f: f.__name__)
def test_correct_variants_build_their_parts_with_the_config_they_are_given(forward):
    nb05.check_transformer_block(variant(forward), **OTHER_CONFIG)


class PartsOfANewConfig(Base):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.ln1, self.attn = LayerNorm(Config()), Attention(Config())
        self.ln2, self.mlp = LayerNorm(Config()), MLP(Config())

    forward = textbook


class PartsOfTheGlobalConfig(Base):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.ln1, self.attn = LayerNorm(cfg), Attention(cfg)
        self.ln2, self.mlp = LayerNorm(cfg), MLP(cfg)

    forward = textbook


class LayerNormsOfANewConfig(Base):        # eps 1e-5 whatever the config says
    def __init__(self, cfg):
        super().__init__(cfg)
        self.ln1, self.ln2 = LayerNorm(Config()), LayerNorm(Config())

    forward = textbook


class Ln2OfTheGlobalConfig(Base):
    def __init__(self, config):
        super().__init__(config)
        self.ln2 = LayerNorm(cfg)

    forward = textbook


NOT_BUILT_WITH_ITS_CONFIG = [
    (PartsOfANewConfig, "cannot take this check's weights. Likely mistake: the submodules are not built "
     "with the cfg passed to __init__: ln1, attn and ln2 have", "builds a new Config()"),
    (PartsOfTheGlobalConfig, "cannot take this check's weights. Likely mistake: the submodules are not "
     "built with the cfg passed to __init__", "reads the notebook's global `cfg`"),
    (LayerNormsOfANewConfig, "ln1.hook_out, the first activation in forward order that differs from the "
     "reference, does not match the reference. Likely mistake: eps is not read from cfg.layer_norm_eps: "
     "ln1 and ln2 used 1e-05 (GPT-2's); this check's config has 0.001", "builds a new Config()"),
    (Ln2OfTheGlobalConfig, "ln2.hook_out, the first activation in forward order that differs from the "
     "reference, does not match the reference. Likely mistake: eps is not read from cfg.layer_norm_eps: "
     "ln2 used 1e-05", "reads the notebook's global `cfg`"),
]


@pytest.mark.parametrize("cls, message, how", NOT_BUILT_WITH_ITS_CONFIG, ids=lambda v: getattr(v, "__name__", None))
def test_parts_not_built_with_the_blocks_config_are_named(cls, message, how):
    nb05.check_transformer_block(cls)   # GPT-2's own config: the default check cannot tell
    with pytest.raises(CheckFailed) as failure:
        nb05.check_transformer_block(cls, **OTHER_CONFIG)
    first_line = fix_only_last(str(failure.value)).splitlines()[0]
    assert message in first_line and how in first_line, str(failure.value)


def test_the_notebook_grades_the_block_on_that_config():
    """The case above is the one the notebook's hidden check runs."""
    from graders.harness.manifest import notebook_checks

    graded = [fields for _, fields in notebook_checks("05_transformer_block")["block_test"]]
    assert dataclasses.asdict(nb05.block.case(**OTHER_CONFIG)) in graded
