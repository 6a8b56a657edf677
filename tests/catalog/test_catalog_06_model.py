"""GPT-2 grader (06): DemoTransformer mistakes are named; correct variants pass. The model builds its
parts with the config it is given, and runs the course's Unembed."""
import dataclasses

import pytest
import torch
from torch import nn

from graders.exercises import nb06
from graders.judging.compare import CheckFailed
from graders.reference.components import Attention, Embed, LayerNorm, PosEmbed, TransformerBlock
from graders.reference.config import Config
from test_catalog_06_unembed import UnembedBase, matmul, no_bias, unembed_variant


# --- DemoTransformer ------------------------------------------------------------------------


class Unembed(UnembedBase):
    forward = matmul


class ModelBase(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed, self.pos_embed = Embed(cfg), PosEmbed(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final, self.unembed = LayerNorm(cfg), Unembed(cfg)


class PersistentIgnoreAttention(Attention):
    """The course's Attention with the widely copied persistent IGNORE buffer."""
    def __init__(self, cfg):
        super().__init__(cfg)
        del self.IGNORE
        self.register_buffer("IGNORE", torch.tensor(-1e5))


class PersistentIgnoreBlock(TransformerBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.attn = PersistentIgnoreAttention(cfg)


class PersistentIgnoreModel(ModelBase):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = nn.ModuleList([PersistentIgnoreBlock(cfg) for _ in range(cfg.n_layers)])


def test_a_model_whose_blocks_hold_a_persistent_ignore_buffer_passes():
    cls = model_variant(loop, base=PersistentIgnoreModel)
    assert "blocks.0.attn.IGNORE" in cls(nb06.Config()).state_dict()
    nb06.check_demo_transformer(cls)


def model_variant(forward, base=ModelBase):
    return type(forward.__name__, (base,), {"forward": forward})


def loop(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    for block in self.blocks:
        resid = block(resid)
    return self.unembed(self.ln_final(resid))


def indexed_loop(self, tokens):
    resid = self.pos_embed(tokens) + self.embed(tokens)
    for i in range(self.cfg.n_layers):
        resid = self.blocks[i](resid)
    return self.unembed(self.ln_final(resid))


def functools_reduce(self, tokens):
    import functools

    resid = functools.reduce(lambda r, b: b(r), self.blocks, self.embed(tokens) + self.pos_embed(tokens))
    return self.unembed(self.ln_final(resid))


@pytest.mark.parametrize("forward", [loop, indexed_loop, functools_reduce], ids=lambda f: f.__name__)
def test_correct_model_passes(forward):
    nb06.check_demo_transformer(model_variant(forward))


def test_correct_model_passes_hidden_cases():
    nb06.check_demo_transformer(model_variant(loop), text=None, seed=5, batch=2, seq=12)


def no_pos_embed(self, tokens):
    resid = self.embed(tokens)
    for block in self.blocks:
        resid = block(resid)
    return self.unembed(self.ln_final(resid))


def no_ln_final(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    for block in self.blocks:
        resid = block(resid)
    return self.unembed(resid)


def reversed_blocks(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    for block in reversed(self.blocks):
        resid = block(resid)
    return self.unembed(self.ln_final(resid))


def one_block(self, tokens):
    resid = self.blocks[0](self.embed(tokens) + self.pos_embed(tokens))
    return self.unembed(self.ln_final(resid))


def first_block_repeated(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    for _ in self.blocks:
        resid = self.blocks[0](resid)
    return self.unembed(self.ln_final(resid))


def double_residual(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    for block in self.blocks:
        resid = resid + block(resid)
    return self.unembed(self.ln_final(resid))


def not_causal(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    resid = resid + resid.mean(dim=1, keepdim=True)
    for block in self.blocks:
        resid = block(resid)
    return self.unembed(self.ln_final(resid))


def pos_embed_of_the_embedding(self, tokens):          # found in published code
    resid = self.embed(tokens)
    resid = resid + self.pos_embed(resid)
    for block in self.blocks:
        resid = block(resid)
    return self.unembed(self.ln_final(resid))


def blocks_given_tokens(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    resid = self.blocks[0](tokens) + resid
    for block in self.blocks[1:]:
        resid = block(resid)
    return self.unembed(self.ln_final(resid))


def unembed_before_ln_final_einsum(self, tokens):
    resid = torch.einsum("bpd->bpd", self.embed(tokens) + self.pos_embed(tokens))
    for block in self.blocks:
        resid = block(resid)
    return self.ln_final(self.unembed(resid))


class SharedBlocks(ModelBase):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg)] * cfg.n_layers)


MODEL_BUGGY = [
    (model_variant(no_pos_embed), "hook_pos_embed", "Likely mistake: no positional embedding"),
    (model_variant(no_ln_final), "ln_final.hook_out", "Likely mistake: ln_final is missing"),
    (model_variant(reversed_blocks), "blocks.0.hook_resid_pre, the first", "Likely mistake: the blocks run in reverse"),
    (model_variant(one_block), "could not see blocks.1.hook_resid_pre", "Likely mistake: only the first block runs"),
    (model_variant(first_block_repeated), "blocks.0 called 12x",
     "Likely mistake: blocks[0] is applied n_layers times"),
    (model_variant(double_residual), "blocks.1.hook_resid_pre, the first",
     "Likely mistake: the residual is added twice"),
    (model_variant(not_causal), "", "is not causal"),
    (model_variant(loop, SharedBlocks), "", "distinct block object"),
    (model_variant(pos_embed_of_the_embedding), "the call self.pos_embed(...) failed; it was given a float32 "
     "tensor of shape [1, 35, 768]", "pos_embed takes the token ids"),
    (model_variant(blocks_given_tokens), "the call self.blocks[0](...) failed; it was given an int64 tensor",
     "takes the residual stream"),
    (model_variant(unembed_before_ln_final_einsum), "", "self.ln_final(...) takes the residual stream"),
]


@pytest.mark.parametrize("cls, where, diagnosis", MODEL_BUGGY, ids=lambda v: getattr(v, "__name__", None))
def test_buggy_model_is_named(cls, where, diagnosis):
    with pytest.raises(CheckFailed) as failure:
        nb06.check_demo_transformer(cls)
    message = str(failure.value)
    first = message.splitlines()[0]
    assert where in first and diagnosis in first, message


# --- the parts built with the model's own config ---------------------------------------------

OTHER_CONFIG = dict(text=None, seed=3, seq=10, n_layers=2, layer_norm_eps=1e-3, n_heads=6, d_head=128)
cfg = Config()   # as in the notebook: a global beside the `cfg` each model is given


@pytest.mark.parametrize("forward", [loop, indexed_loop, functools_reduce], ids=lambda f: f.__name__)
def test_correct_model_builds_its_parts_with_the_config_it_is_given(forward):
    nb06.check_demo_transformer(model_variant(forward), **OTHER_CONFIG)


class TwelveBlocks(ModelBase):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(12)])

    forward = loop


class BlocksOfANewConfig(ModelBase):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(Config()) for _ in range(cfg.n_layers)])

    forward = loop


class LnFinalOfANewConfig(ModelBase):        # eps 1e-5 whatever the config says
    def __init__(self, cfg):
        super().__init__(cfg)
        self.ln_final = LayerNorm(Config())

    forward = loop


def loop_over_twelve(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    for i in range(12):
        resid = self.blocks[i](resid)
    return self.unembed(self.ln_final(resid))


def loop_over_the_global_config(self, tokens):
    resid = self.embed(tokens) + self.pos_embed(tokens)
    for i in range(cfg.n_layers):
        resid = self.blocks[i](resid)
    return self.unembed(self.ln_final(resid))


NOT_BUILT_WITH_ITS_CONFIG = [
    (TwelveBlocks, "cannot take this check's weights. Likely mistake: n_layers is not read from cfg: "
     "self.blocks holds 12 blocks; this check's config has n_layers 2", "not a literal"),
    (BlocksOfANewConfig, "cannot take this check's weights. Likely mistake: the submodules are not built "
     "with the cfg passed to __init__: blocks.0.ln1, blocks.0.attn, blocks.0.ln2, blocks.1.ln1 and 2 more "
     "have layer_norm_eps 1e-05, n_heads 12, d_head 64;", "builds a new Config()"),
    (LnFinalOfANewConfig, "ln_final.hook_out, the first activation in forward order that differs from the "
     "reference, does not match the reference. Likely mistake: eps is not read from cfg.layer_norm_eps: "
     "ln_final used 1e-05 (GPT-2's); this check's config has 0.001", "builds a new Config()"),
    (model_variant(loop_over_twelve), "crashed on this check's config (2 layers, 6 heads of 128). Likely "
     "mistake: n_layers is not read from cfg: this model has 2 blocks", "not range(12)"),
    (model_variant(loop_over_the_global_config), "crashed on this check's config (2 layers, 6 heads of 128). "
     "Likely mistake: n_layers is not read from cfg: this model has 2 blocks", "reads the notebook's global `cfg`"),
]


@pytest.mark.parametrize("cls, message, how", NOT_BUILT_WITH_ITS_CONFIG, ids=lambda v: getattr(v, "__name__", None))
def test_settings_not_read_from_the_models_config_are_named(cls, message, how):
    nb06.check_demo_transformer(cls)   # GPT-2's own config: the default check cannot tell
    with pytest.raises(CheckFailed) as failure:
        nb06.check_demo_transformer(cls, **OTHER_CONFIG)
    first_line = str(failure.value).splitlines()[0]
    assert message in first_line and how in first_line, str(failure.value)


def test_the_notebook_grades_the_model_on_that_config():
    """The case above is the one the notebook's hidden check runs."""
    from graders.harness.manifest import notebook_checks

    graded = [fields for _, fields in notebook_checks("06_gpt2")["model_test"]]
    assert dataclasses.asdict(nb06.model.case(**OTHER_CONFIG)) in graded


def test_a_wrong_unembed_costs_only_its_own_check():
    """The model's check runs the course's Unembed in the learner's model (06 charged
    a wrong or differently named Unembed twice)."""
    for wrong in (unembed_variant(no_bias), RenamedUnembed):
        with pytest.raises(CheckFailed):
            nb06.check_unembed(wrong)

        class WithWrongUnembed(ModelBase):
            def __init__(self, cfg, wrong=wrong):
                super().__init__(cfg)
                self.unembed = wrong(cfg)

        nb06.check_demo_transformer(model_variant(loop, base=WithWrongUnembed))


class RenamedUnembed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))

    def forward(self, x):
        return x @ self.W
