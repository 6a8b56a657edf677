"""GPT-2 grader: Unembed, DemoTransformer and next-token-loss mistakes are named; correct variants pass."""
import dataclasses

import einops
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb06
from graders.judging.compare import CheckFailed
from graders.reference.components import Attention, Embed, LayerNorm, PosEmbed, TransformerBlock
from graders.reference.config import Config

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


# --- next-token loss ------------------------------------------------------------------------

def gather(logits, tokens):
    lp = logits.log_softmax(-1)[:, :-1]
    return -lp.gather(-1, tokens[:, 1:, None]).mean()


def cross_entropy(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def indexing(logits, tokens):
    lp = logits.log_softmax(-1)
    b, p = torch.meshgrid(torch.arange(tokens.shape[0]), torch.arange(tokens.shape[1] - 1), indexing="ij")
    return -lp[b, p, tokens[:, 1:]].mean()


def cross_entropy_vocabulary_second(logits, tokens):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:])


@pytest.mark.parametrize("fn", [gather, cross_entropy, indexing, cross_entropy_vocabulary_second],
                         ids=lambda f: f.__name__)
def test_correct_loss_passes(fn):
    nb06.check_loss(fn)
    nb06.check_loss(fn, text=None, seed=2, batch=2)


def no_shift(logits, tokens):
    return -logits.log_softmax(-1).gather(-1, tokens[..., None]).mean()


def wrong_shift(logits, tokens):
    return -logits.log_softmax(-1)[:, 1:].gather(-1, tokens[:, :-1, None]).mean()


def positive(logits, tokens):
    return -gather(logits, tokens)


def summed(logits, tokens):
    return -logits.log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).sum()


def raw_logits(logits, tokens):
    return -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


def probabilities(logits, tokens):
    return -logits.softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


def per_position(logits, tokens):
    return -logits.log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]


LOSS_BUGGY = [
    (no_shift, "Likely mistake: the loss is not shifted"),
    (wrong_shift, "Likely mistake: shifted the wrong way"),
    (positive, "Likely mistake: the minus sign is missing"),
    (summed, "Likely mistake: the losses are summed instead of averaged"),
    (raw_logits, "Likely mistake: raw logits are used instead of log-probabilities"),
    (probabilities, "Likely mistake: probabilities"),
    (per_position, "Likely mistake: one loss per position"),
]


@pytest.mark.parametrize("fn, diagnosis", LOSS_BUGGY, ids=lambda v: getattr(v, "__name__", None))
def test_buggy_loss_is_named(fn, diagnosis):
    with pytest.raises(CheckFailed) as failure:
        nb06.check_loss(fn)
    assert diagnosis in str(failure.value).splitlines()[0], str(failure.value)


def cross_entropy_vocabulary_last(logits, tokens):
    return F.cross_entropy(logits[:, :-1], tokens[:, 1:])


def cross_entropy_vocabulary_last_unshifted(logits, tokens):
    return F.cross_entropy(logits, tokens)


def cross_entropy_targets_not_flattened(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:])


@pytest.mark.parametrize("fn, diagnosis", [
    (cross_entropy_vocabulary_last, "reads the class scores from the second axis"),
    (cross_entropy_vocabulary_last_unshifted, "and the loss is not shifted"),
    (cross_entropy_targets_not_flattened, "the logits are flattened to [batch*position, d_vocab] but the targets"),
], ids=lambda v: getattr(v, "__name__", None))
def test_a_cross_entropy_call_that_crashes_is_named_and_ends_with_the_fix(fn, diagnosis):
    """torch's own words ("Expected target size ...") stay, after the mistake in the course's
    words; the corrected call is the message's last line."""
    with pytest.raises(CheckFailed) as failure:
        nb06.check_loss(fn)
    lines = str(failure.value).splitlines()
    assert "Likely mistake:" in lines[0] and diagnosis in lines[0], str(failure.value)
    assert lines[-1] == "  Show the fix: F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())"


def test_a_crash_no_listed_call_reproduces_is_not_named():
    def wrong_targets(logits, tokens):
        return F.cross_entropy(logits[:, :-1], tokens[:, 1:].flatten())

    with pytest.raises(CheckFailed) as failure:
        nb06.check_loss(wrong_targets)
    assert "Likely mistake" not in str(failure.value) and "Show the fix" not in str(failure.value)


# --- count_parameters ---------------------------------------------------------------------------

def _solution_count_parameters():
    from graders.course.example_class import solution_answers
    from graders.reference.config import Config

    namespace = {"Config": Config}
    exec(compile(solution_answers("06_gpt2")["count_answer"], "count_answer", "exec"), namespace)
    return namespace["count_parameters"]


def test_solution_count_parameters_passes_and_agrees_with_gpt2_small():
    count_parameters = _solution_count_parameters()
    for seed in (0, 5, 17, 101):
        nb06.check_count_parameters(count_parameters, seed=seed)
    # GPT-2 small as OpenAI released it, counted by transformers (the grader's independent reference).
    from graders.exercises.nb06.parameter_count import expected_counts
    from graders.reference.config import Config

    assert expected_counts(tuple(vars(Config()).values()))["total_tied"] == 124_439_808


def _with(change):
    """The solution's counts with one mistake: `change(counts, cfg)` edits the dict in place."""
    solution = _solution_count_parameters()

    def count_parameters(cfg):
        counts = solution(cfg)
        change(counts, cfg)
        return counts
    return count_parameters


def _retotal(counts, cfg):
    per_block = counts["attn"] + counts["mlp"] + counts["layer_norms"]
    counts["total"] = (counts["embed"] + counts["pos_embed"] + cfg.n_layers * per_block
                       + counts["ln_final"] + counts["unembed"])
    counts["total_tied"] = counts["total"] - counts["unembed"]


def _attention_without_biases(counts, cfg):
    counts["attn"] = 4 * cfg.n_heads * cfg.d_head * cfg.d_model


def _one_layer_norm(counts, cfg):
    counts["layer_norms"] = 2 * cfg.d_model


def _one_block(counts, cfg):
    counts["total"] -= (cfg.n_layers - 1) * (counts["attn"] + counts["mlp"] + counts["layer_norms"])


def _tied_keeps_bias(counts, cfg):
    counts["total_tied"] += cfg.d_vocab


def _tied_is_untied(counts, cfg):
    counts["total_tied"] = counts["total"]


def _pos_per_token(counts, cfg):
    counts["pos_embed"] = cfg.d_vocab * cfg.d_model


def _one_head(counts, cfg):
    counts["attn"] = 4 * cfg.d_head * cfg.d_model + 3 * cfg.d_head + cfg.d_model


@pytest.mark.parametrize("change, message", [
    (_attention_without_biases, "attention biases b_Q, b_K, b_V, b_O are not counted"),
    (_one_head, "only one head is counted"),
    (_one_layer_norm, "each block has two LayerNorms"),
    (_one_block, "the blocks are counted once"),
    (_tied_keeps_bias, "GPT-2 has no unembedding bias"),
    (_tied_is_untied, "W_U and W_E are one matrix"),
    (_pos_per_token, "one row per position (n_ctx)"),
], ids=lambda x: getattr(x, "__name__", "msg"))
def test_count_parameters_mistakes_are_named(change, message):
    with pytest.raises(CheckFailed) as failure:
        nb06.check_count_parameters(_with(change))
    assert message in str(failure.value)


def test_count_parameters_is_graded_on_other_configs():
    """A count that hard-codes GPT-2 small passes the visible check and fails the hidden ones."""
    from graders.reference.config import Config

    small = _solution_count_parameters()(Config())
    nb06.check_count_parameters(lambda cfg: dict(small))
    with pytest.raises(CheckFailed, match="another config"):
        nb06.check_count_parameters(lambda cfg: dict(small), seed=5)


def test_count_parameters_that_builds_the_modules_is_refused():
    from graders.reference.components import DemoTransformer

    def count_parameters(cfg):
        return {"total": sum(p.numel() for p in DemoTransformer(cfg).parameters())}

    with pytest.raises(CheckFailed, match="runs code from graders/reference/components.py"):
        nb06.check_count_parameters(count_parameters)


def test_count_parameters_must_return_ints_under_every_key():
    with pytest.raises(CheckFailed, match="has no 'embed'"):
        nb06.check_count_parameters(lambda cfg: {})
    counts = _solution_count_parameters()
    with pytest.raises(CheckFailed, match="Python int"):
        nb06.check_count_parameters(lambda cfg: {**counts(cfg), "mlp": float(counts(cfg)["mlp"])})


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


# --- the text -----------------------------------------------------------------------------------

def _cells():
    import nbformat

    from graders.layout import SOLUTIONS
    return nbformat.read(SOLUTIONS / "06_gpt2.ipynb", as_version=4).cells


def _text_before(grade_id):
    """The markdown from the previous code cell up to the cell `grade_id` (where it is posed)."""
    cells, text = _cells(), []
    for cell in cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return "\n".join(text)
        text = text + [cell.source] if cell.cell_type == "markdown" else []
    raise AssertionError(f"no cell {grade_id}")


def test_count_parameters_is_posed_with_every_config_field_the_solution_reads():
    read = set()

    class Recording(Config):
        def __getattribute__(self, name):
            read.add(name)
            return super().__getattribute__(name)

    _solution_count_parameters()(Recording())
    posed = _text_before("count_answer")
    assert read and not [field for field in read if f"`{field}`" not in posed], sorted(read)


def test_the_frozen_unembedding_bias_is_explained_where_unembed_is_posed():
    """The given `__init__` creates b_U with requires_grad=False; the text says so and why."""
    given = next(c.source for c in _cells() if c.metadata.get("nbgrader", {}).get("grade_id") == "unembed_answer")
    posed = _text_before("unembed_answer")
    assert "requires_grad=False" in given and "`requires_grad=False`" in posed
    assert "no\nunembedding bias" in posed or "no unembedding bias" in posed


def test_the_debug_flag_print_cfg_shows_is_explained_before_it_shows():
    setup = next(i for i, c in enumerate(_cells()) if "print(cfg)" in c.source)
    before = "\n".join(c.source for c in _cells()[:setup] if c.cell_type == "markdown")
    assert "debug" in vars(Config()) and "`debug=True`" in before
