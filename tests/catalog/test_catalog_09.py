"""Notebook 09's graders: correct variants (in other styles) pass, each catalogued mistake fails
with its name, and the course's BERT agrees with transformers' BertForMaskedLM."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fix_last import fix_only_last
from graders.exercises import nb09
from graders.judging.compare import CheckFailed
from graders.reference import bert
from graders.reference.components import MLP, Attention, LayerNorm
from graders.reference.config import Config

from course_code import as_cell
from catalog_helpers import fails_with

N_ORDINARY, MASK, IGNORE = nb09.N_ORDINARY, nb09.MASK, nb09.IGNORE


# --- 1. sinusoidal_encoding ---------------------------------------------------------------------

def pe_solution(n_ctx, d_model):
    positions = torch.arange(n_ctx, dtype=torch.float32)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = positions / 10000 ** (two_i / d_model)
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)[:, :d_model]


def pe_slices(n_ctx, d_model):
    pe = torch.zeros(n_ctx, d_model)
    position = torch.arange(n_ctx).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe


def pe_loops(n_ctx, d_model):
    pe = torch.zeros(n_ctx, d_model, dtype=torch.float64)
    for pos in range(n_ctx):
        for j in range(d_model):
            angle = pos / 10000 ** (2 * (j // 2) / d_model)
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("fn", [pe_solution, pe_slices, pe_loops], ids=lambda f: f.__name__)
def test_sinusoidal_correct_variants_pass(fn):
    nb09.check_sinusoidal(fn)
    nb09.check_sinusoidal(fn, seq=50, seed=3)


def _pe(swap=False, exponent=2, first=0, halves=False, crash_on_odd=False):
    def fn(n_ctx, d_model):
        positions = torch.arange(first, first + n_ctx, dtype=torch.float32)[:, None]
        index = torch.arange(0, d_model, 2, dtype=torch.float32)
        angles = positions / 10000 ** (index * exponent / 2 / d_model)
        sin, cos = angles.sin(), angles.cos()
        if swap:
            sin, cos = cos, sin
        if halves:
            return torch.cat([sin, cos], dim=-1)[:, :d_model]
        pe = torch.zeros(n_ctx, d_model)
        pe[:, 0::2] = sin
        pe[:, 1::2] = cos if crash_on_odd else cos[:, : d_model // 2]
        return pe
    return fn


@pytest.mark.parametrize("fn, message", [
    (_pe(swap=True), "Likely mistake: sin and cos are swapped"),
    (_pe(exponent=1), "Likely mistake: the exponent uses i instead of 2i"),
    (_pe(first=1), "Likely mistake: positions start at 1"),
    (_pe(halves=True), "Likely mistake: sines and cosines are in two halves"),
    (_pe(crash_on_odd=True), "is odd"),
    (lambda n, d: pe_solution(n, d)[None], "without a batch dimension"),
])
def test_sinusoidal_mistakes_are_named(fn, message):
    fails_with(nb09.check_sinusoidal, fn, expected=message)


def test_a_named_sinusoidal_mistake_ends_with_the_line_it_corrects():
    from graders.exercises.nb09 import positions

    with pytest.raises(CheckFailed) as failure:
        nb09.check_sinusoidal(_pe(first=1))
    message = fix_only_last(str(failure.value))
    assert message.endswith(f"\n  Show the fix: {positions.POSITIONS}"), message
    assert "Hint:" not in message, message   # the mistake is named: no general recipe under it


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


# --- 4. The encoder -------------------------------------------------------------------------------

def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class Embeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_E = nn.Parameter(torch.randn(cfg.d_vocab, cfg.d_model) * cfg.init_range)
        self.W_pos = nn.Parameter(torch.randn(cfg.n_ctx, cfg.d_model) * cfg.init_range)
        self.W_type = nn.Parameter(torch.randn(cfg.n_token_types, cfg.d_model) * cfg.init_range)
        self.ln = LayerNorm(cfg)

    def forward(self, tokens, token_types):
        return self.ln(self.W_E[tokens] + self.W_pos[: tokens.shape[1]] + self.W_type[token_types])


class EmbeddingsOneHot(Embeddings):
    def forward(self, tokens, token_types):
        one_hot = F.one_hot(tokens, self.W_E.shape[0]).float() @ self.W_E
        types = torch.where(token_types[..., None] == 1, self.W_type[1], self.W_type[0])
        return self.ln(one_hot + types + self.W_pos[torch.arange(tokens.shape[1])])


@pytest.mark.parametrize("cls", [Embeddings, EmbeddingsOneHot], ids=lambda c: c.__name__)
def test_bert_embeddings_correct_variants_pass(cls):
    nb09.check_bert_embeddings(cls)
    nb09.check_bert_embeddings(cls, seed=5, batch=3, seq=19)


def _embeddings(forward, init=None):
    return type(forward.__name__, (Embeddings,), {"forward": forward, **({"__init__": init} if init else {})})


def _gpt2_eps(self, cfg):
    Embeddings.__init__(self, cfg)
    self.ln = LayerNorm(Config(d_model=cfg.d_model))


@pytest.mark.parametrize("cls, message", [
    (_embeddings(lambda s, t, y: s.W_E[t] + s.W_pos[: t.shape[1]] + s.W_type[y]), "the LayerNorm is missing"),
    (_embeddings(lambda s, t, y: s.ln(s.W_E[t] + s.W_pos[: t.shape[1]])),
     "the token-type (segment) embeddings are not added"),
    (_embeddings(lambda s, t, y: s.ln(s.W_E[t] + s.W_type[y])), "the positional embeddings are not added"),
    (_embeddings(lambda s, t, y: s.ln(s.W_E[t] + s.W_pos[1: t.shape[1] + 1] + s.W_type[y])),
     "the positions start at 1"),
    (_embeddings(Embeddings.forward, _gpt2_eps), "LayerNorm's eps is 1e-5"),
    (_embeddings(lambda s, t, y: s.ln(s.W_E[t]) + s.W_pos[: t.shape[1]] + s.W_type[y]),
     "only the token embeddings are normalised"),
])
def test_bert_embeddings_mistakes_are_named(cls, message):
    fails_with(nb09.check_bert_embeddings, cls, expected="Likely mistake: " + message)


class Bidirectional(Attention):
    def apply_causal_mask(self, attn_scores):
        return attn_scores


class BidirectionalZeroMask(Attention):
    def apply_causal_mask(self, attn_scores):
        return attn_scores.masked_fill(torch.zeros_like(attn_scores, dtype=torch.bool), float("-inf"))


class BertMLP(MLP):
    def forward(self, x):
        return gelu_erf(x @ self.W_in + self.b_in) @ self.W_out + self.b_out


class BertMLPTorchGelu(MLP):
    def forward(self, x):
        return F.gelu(x @ self.W_in + self.b_in) @ self.W_out + self.b_out


def encoder_block(attention=Bidirectional, mlp=BertMLP, forward=post_norm):
    def __init__(self, cfg):
        Parts.__init__(self, cfg)
        self.attn, self.mlp = attention(cfg), mlp(cfg)
    return type("EncoderBlock", (Parts,), {"__init__": __init__, "forward": forward})


@pytest.mark.parametrize("cls", [encoder_block(), encoder_block(BidirectionalZeroMask, BertMLPTorchGelu)])
def test_encoder_block_correct_variants_pass(cls):
    nb09.check_encoder_block(cls)
    nb09.check_encoder_block(cls, block=1, seed=2, batch=3, seq=9)


@pytest.mark.parametrize("cls, where, message", [
    (encoder_block(attention=Attention), "attn_out", "Likely mistake: the causal mask is still applied"),
    (encoder_block(mlp=MLP), "mlp_out", "Likely mistake: the MLP uses GPT-2's tanh GELU"),
    (encoder_block(forward=pre_norm), "attn_in", "Likely mistake: pre-norm"),
])
def test_encoder_block_mistakes_are_named(cls, where, message):
    fails_with(nb09.check_encoder_block, cls, expected=(where, message))


def mlm_model(head_forward=None, tied=Tied, n_layers_used=None, embeddings=Embeddings):
    class Head(nn.Module):
        def __init__(self, cfg, embed):
            super().__init__()
            self.W_dense = nn.Parameter(torch.randn(cfg.d_model, cfg.d_model) * cfg.init_range)
            self.b_dense = nn.Parameter(torch.zeros(cfg.d_model))
            self.ln = LayerNorm(cfg)
            self.unembed = tied(embed)

        def forward(self, x):
            if head_forward:
                return head_forward(self, x)
            return self.unembed(self.ln(gelu_erf(x @ self.W_dense + self.b_dense)))

    class Model(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.embed = embeddings(cfg)
            self.blocks = nn.ModuleList([encoder_block()(cfg) for _ in range(cfg.n_layers)])
            self.mlm_head = Head(cfg, self.embed)

        def forward(self, tokens, token_types):
            x = self.embed(tokens, token_types)
            for b in list(self.blocks)[: n_layers_used]:
                x = b(x)
            return self.mlm_head(x)

    return Model


@pytest.mark.parametrize("cls", [mlm_model(), mlm_model(tied=TiedThroughModule)], ids=["tied", "tied_module"])
def test_bert_correct_variants_pass(cls):
    nb09.check_bert(cls)
    nb09.check_bert(cls, seed=7, batch=1, seq=30)


@pytest.mark.parametrize("cls, message", [
    (mlm_model(lambda h, x: h.unembed(h.ln(torch.tanh(x @ h.W_dense + h.b_dense)))), "does not match"),
    (mlm_model(lambda h, x: h.unembed(h.ln(F.gelu(x @ h.W_dense + h.b_dense, approximate="tanh")))),
     "Likely mistake: the MLM head uses GPT-2's tanh GELU"),
    (mlm_model(lambda h, x: h.unembed(h.ln(x @ h.W_dense + h.b_dense))),
     "Likely mistake: the MLM head has no GELU"),
    (mlm_model(lambda h, x: h.unembed(gelu_erf(x @ h.W_dense + h.b_dense))),
     "Likely mistake: the MLM head skips its LayerNorm"),
    (mlm_model(lambda h, x: h.unembed(h.ln(gelu_erf(x @ h.W_dense + h.b_dense))) - h.unembed.b_U),
     "Likely mistake: the prediction bias b_U is not added"),
    (mlm_model(tied=Copied), "Likely mistake: the MLM head's unembedding is not tied"),
    (mlm_model(n_layers_used=1), "the output of blocks.1"),
])
def test_bert_mistakes_are_named(cls, message):
    fails_with(nb09.check_bert, cls, expected=message)


def test_course_bert_agrees_with_transformers_bert_for_masked_lm():
    cfg = nb09.mlm_config()
    hf_weights = bert.random_hf_weights(cfg, 123)
    hf = bert.hf_model(cfg, hf_weights)
    course = bert.load_tied(bert.BertForMLM(cfg), bert.course_weights(hf_weights, cfg), "BertForMLM").eval()
    tokens = torch.randint(0, cfg.d_vocab, (3, 17), generator=torch.Generator().manual_seed(0))
    types = (torch.arange(17) >= 9).long().expand(3, 17)
    with torch.no_grad():
        expected = hf(input_ids=tokens, token_type_ids=types, output_hidden_states=True)
        assert torch.allclose(course.embed(tokens, types), expected.hidden_states[0], atol=1e-5)
        assert torch.allclose(course(tokens, types), expected.logits, atol=1e-5)
    assert sum(p.numel() for p in course.parameters()) == sum(p.numel() for p in hf.parameters())


# --- One mistake, one exercise: the encoder's parts ---------------------------------

# The solution's answer cells of sections 2-4, run in order as a learner's notebook runs them.
ENCODER_CELLS = ("post_norm", "tied", "bert_embeddings", "encoder_block", "bert")
# Each check of sections 2-4, by the notebook name of the class it grades.
ENCODER_CHECKS = {"PostNormBlock": nb09.check_post_norm_block, "TiedUnembed": nb09.check_tied_unembed,
                  "BertEmbeddings": nb09.check_bert_embeddings, "EncoderBlock": nb09.check_encoder_block,
                  "BertForMLM": nb09.check_bert}


def encoder_notebook(*edits):
    """The answers run in order in one namespace, each edit (cell, solution's text, learner's text)
    made first."""
    from jaxtyping import Float, Int
    from torch import Tensor

    from graders.course.example_class import solution_answers

    answers = solution_answers("09_transformer_family")
    cells = {cell: answers[f"{cell}_answer"] for cell in ENCODER_CELLS}
    for cell, old, new in edits:
        assert old in cells[cell], (cell, old)
        cells[cell] = cells[cell].replace(old, new)
    notebook = {"math": math, "torch": torch, "F": F, "nn": nn, "Tensor": Tensor, "Float": Float, "Int": Int,
                "Config": Config, "EncoderConfig": bert.EncoderConfig, "Attention": Attention, "MLP": MLP,
                "LayerNorm": LayerNorm}
    exec(as_cell("\n\n".join(cells.values()), "09 answers"), notebook)
    return notebook


def failing_checks(notebook) -> set[str]:
    failing = set()
    for name, check in ENCODER_CHECKS.items():
        try:
            check(notebook[name])
        except CheckFailed:
            failing.add(name)
    return failing


NO_LN2 = ("post_norm", "return self.ln2(resid_mid + self.mlp(resid_mid))", "return resid_mid + self.mlp(resid_mid)")
ONE_LAYER_NORM = ("post_norm", "self.ln2 = LayerNorm(cfg)", "self.ln2 = self.ln1")
COPIED_W_E = ("tied", "self.W_E = embed.W_E", "self.W_E = nn.Parameter(embed.W_E.detach().clone())")


def test_the_encoder_solution_passes_every_check():
    assert failing_checks(encoder_notebook()) == set()


@pytest.mark.parametrize("edits, costs", [
    ([NO_LN2], "PostNormBlock"),
    ([ONE_LAYER_NORM], "PostNormBlock"),
    ([ONE_LAYER_NORM, ("encoder_block", "super().__init__(cfg)", "PostNormBlock.__init__(self, cfg)")],
     "PostNormBlock"),
    ([COPIED_W_E], "TiedUnembed"),
    ([("tied", "return x @ self.W_E.T + self.b_U", "return x @ self.W_E.T")], "TiedUnembed"),
    ([("bert_embeddings", "self.W_pos[:posn]", "self.W_pos[1:posn + 1]")], "BertEmbeddings"),
    ([("encoder_block", "0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", "F.gelu(x, approximate='tanh')")],
     "EncoderBlock"),
    ([("encoder_block", "return attn_scores", "return super().apply_causal_mask(attn_scores)")], "EncoderBlock"),
], ids=["no_ln2", "one_layer_norm", "one_layer_norm_explicit_init", "copied_W_E", "no_bias", "positions_from_1",
        "tanh_gelu_erf", "causal_mask"])
def test_a_wrong_encoder_part_costs_only_its_own_check(edits, costs):
    """One wrong part in a notebook whose other answers are the solution's: only the part's own
    check fails. The EncoderBlock's check runs the learner's block on the course's PostNormBlock
    and BertForMLM's builds the learner's model with the course's BertEmbeddings, EncoderBlock,
    TiedUnembed and gelu_erf under those names (09 charged them to both composites as
    well); the learner's names and bases are theirs again afterwards."""
    notebook = encoder_notebook(*edits)
    names = dict(notebook)
    assert failing_checks(notebook) == {costs}
    assert all(notebook[name] is value for name, value in names.items())
    assert notebook["EncoderBlock"].__bases__ == (notebook["PostNormBlock"],)


@pytest.mark.parametrize("edits, check, message", [
    ([NO_LN2, ("encoder_block", "self.attn = BidirectionalAttention(cfg)\n        ", "")],
     "EncoderBlock", "Likely mistake: the causal mask is still applied"),
    ([COPIED_W_E, ("bert", "MLMHead(cfg, self.embed)", "MLMHead(cfg, BertEmbeddings(cfg))")],
     "BertForMLM", "Likely mistake: the MLM head's unembedding is not tied"),
], ids=["block_keeps_the_mask", "head_tied_to_another_embedding"])
def test_a_composite_on_wrong_parts_still_fails_its_own_mistake(edits, check, message):
    """The course's parts stand in for the learner's, not for the learner's use of them: an
    EncoderBlock that keeps the causal attention, or a head tied to an embedding of its own, is
    named as before."""
    notebook = encoder_notebook(*edits)
    fails_with(ENCODER_CHECKS[check], notebook[check], expected=message)


# --- 5. mask_tokens and mlm_loss ------------------------------------------------------------------

def mask_solution(tokens, generator):
    ordinary = tokens < N_ORDINARY
    chosen = (torch.rand(tokens.shape, generator=generator) < 0.15) & ordinary
    action = torch.rand(tokens.shape, generator=generator)
    random_tokens = torch.randint(0, N_ORDINARY, tokens.shape, generator=generator)
    inputs = torch.where(chosen & (action < 0.8), MASK, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, torch.where(chosen, tokens, IGNORE)


def mask_hf_style(tokens, generator):
    """Hugging Face's data collator: bernoulli draws, 80% masked, then half of the rest random."""
    labels = tokens.clone()
    chosen = torch.bernoulli(torch.full(tokens.shape, 0.15), generator=generator).bool()
    chosen &= tokens < N_ORDINARY
    labels[~chosen] = IGNORE
    inputs = tokens.clone()
    masked = torch.bernoulli(torch.full(tokens.shape, 0.8), generator=generator).bool() & chosen
    inputs[masked] = MASK
    randomised = torch.bernoulli(torch.full(tokens.shape, 0.5), generator=generator).bool() & chosen & ~masked
    inputs[randomised] = torch.randint(N_ORDINARY, tokens.shape, generator=generator)[randomised]
    return inputs, labels


def mask_multinomial(tokens, generator):
    chosen = (torch.rand(tokens.shape, generator=generator) < 0.15) & (tokens < N_ORDINARY)
    action = torch.multinomial(torch.tensor([0.8, 0.1, 0.1]), tokens.numel(), replacement=True,
                               generator=generator).view(tokens.shape)
    replacement = torch.randint(0, N_ORDINARY, tokens.shape, generator=generator)
    inputs = tokens.clone()
    inputs[chosen & (action == 0)] = MASK
    inputs[chosen & (action == 1)] = replacement[chosen & (action == 1)]
    targets = torch.full_like(tokens, IGNORE)
    targets[chosen] = tokens[chosen]
    return inputs, targets


@pytest.mark.parametrize("fn", [mask_solution, mask_hf_style, mask_multinomial], ids=lambda f: f.__name__)
def test_mask_tokens_correct_variants_pass(fn):
    nb09.check_mask_tokens(fn)
    nb09.check_mask_tokens(fn, seed=11)


def _mask(choose_specials=False, all_tokens=False, split=(0.8, 0.9), random_high=N_ORDINARY,
          targets_everywhere=False, p=0.15, global_rng=False, targets_are_inputs=False):
    def fn(tokens, generator):
        def rand(shape):
            return torch.rand(shape) if global_rng else torch.rand(shape, generator=generator)
        eligible = torch.ones_like(tokens, dtype=torch.bool) if choose_specials else tokens < N_ORDINARY
        chosen = (rand(tokens.shape) < p) & eligible
        action = rand(tokens.shape)
        random_tokens = torch.randint(0, random_high, tokens.shape, generator=generator)
        apply = torch.ones_like(chosen) if all_tokens else chosen
        inputs = torch.where(apply & (action < split[0]), MASK, tokens)
        inputs = torch.where(apply & (action >= split[0]) & (action < split[1]), random_tokens, inputs)
        targets = torch.where(chosen, inputs if targets_are_inputs else tokens, IGNORE)
        if targets_everywhere:
            targets = tokens.clone()
        return inputs, targets
    return fn


@pytest.mark.parametrize("fn, message", [
    (_mask(targets_everywhere=True), "Likely mistake: loss on every position"),
    (_mask(choose_specials=True), "Likely mistake: masking special tokens"),
    (_mask(all_tokens=True), "Likely mistake: 80/10/10 is applied to all tokens"),
    (_mask(split=(1.0, 1.0)), "Likely mistake: every chosen token is replaced by [MASK]"),
    (_mask(split=(0.8, 0.8)), "Likely mistake: the random branch is missing"),
    (_mask(split=(0.8, 0.82)), "Likely mistake: the random branch takes 10% of the remaining 20%"),
    (_mask(random_high=nb09.D_VOCAB), "Likely mistake: the random token is drawn from the whole vocabulary"),
    (_mask(p=0.85), "Likely mistake: the comparison is reversed"),
    (_mask(p=0.10), "expected 15%"),
    (_mask(global_rng=True), "generator"),
    (_mask(targets_are_inputs=True), "Likely mistake: the targets are the corrupted inputs"),
])
def test_mask_tokens_mistakes_are_named(fn, message):
    fails_with(nb09.check_mask_tokens, fn, expected=message)


def loss_solution(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def loss_by_hand(logits, targets):
    chosen = targets != IGNORE
    picked = logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return -(picked * chosen).sum() / chosen.sum()


def loss_boolean_index(logits, targets):
    chosen = targets != IGNORE
    return F.cross_entropy(logits[chosen], targets[chosen])


@pytest.mark.parametrize("fn", [loss_solution, loss_by_hand, loss_boolean_index], ids=lambda f: f.__name__)
def test_mlm_loss_correct_variants_pass(fn):
    nb09.check_mlm_loss(fn)
    nb09.check_mlm_loss(fn, seed=3, batch=2, seq=11)


def _picked(logits, targets):
    return logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0], targets != IGNORE


@pytest.mark.parametrize("fn, message", [
    (lambda l, t: -(lambda p, c: (p * c).sum() / c.numel())(*_picked(l, t)),
     "the loss is averaged over every position"),
    (lambda l, t: -_picked(l, t)[0].mean(), "loss on every position"),
    (lambda l, t: -(lambda p, c: ((p * c).sum(1) / c.sum(1)).mean())(*_picked(l, t)),
     "each sequence's mean is averaged"),
    (lambda l, t: F.cross_entropy(l.flatten(0, 1), t.flatten(), reduction="sum"), "a sum instead of a mean"),
    (lambda l, t: -(lambda p, c: (p * c).sum() / c.sum())(*_picked(l, t)) * -1, "the sign"),
])
def test_mlm_loss_mistakes_are_named(fn, message):
    fails_with(nb09.check_mlm_loss, fn, expected="Likely mistake: " + message)


# --- 6. train_mlm (each run trains a model: ~5 s on one idle core) -------------------------------

def train_solution(model, make_batch, n_steps, lr, generator):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(n_steps):
        tokens, token_types = make_batch()
        inputs, targets = mask_solution(tokens, generator)
        loss = loss_solution(model(inputs, token_types), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_unmasked(model, make_batch, n_steps, lr, generator):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(n_steps):
        tokens, token_types = make_batch()
        _, targets = mask_solution(tokens, generator)
        loss = loss_solution(model(tokens, token_types), targets)   # the model sees the answers
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_one_batch_too_many(model, make_batch, n_steps, lr, generator):
    make_batch()
    return train_solution(model, make_batch, n_steps, lr, generator)


def test_mlm_training_solution_passes_its_bar():
    nb09.check_mlm_training(train_solution)


@pytest.mark.parametrize("fn, message", [
    (train_unmasked, "Likely mistake: the model is trained on unmasked tokens"),
    (train_one_batch_too_many, "draw exactly one per step"),
], ids=["unmasked", "extra_batch"])
def test_mlm_training_mistakes_are_named(fn, message):
    fails_with(nb09.check_mlm_training, fn, expected=message)


WRONG_MLM_PARTS = """
def mask_tokens(tokens, generator):             # nothing chosen: nothing to learn
    return tokens.clone(), torch.full_like(tokens, IGNORE)


def mlm_loss(logits, targets):                  # no ignore_index: scores every position
    return F.cross_entropy(logits.flatten(0, 1), targets.clamp(min=0).flatten())
"""


def test_a_wrong_mask_or_loss_costs_only_its_own_check():
    """A notebook whose mask_tokens and mlm_loss are wrong and whose train_mlm is right: each part
    fails its own check, and train_mlm passes its, which runs the course's parts under the
    notebook's names (09 charged them to the training run as well), and gives the
    learner's back afterwards."""
    from graders.course.example_class import solution_answers

    notebook = {"torch": torch, "F": F, "nn": nn, "IGNORE": IGNORE}
    exec(WRONG_MLM_PARTS + solution_answers("09_transformer_family")["train_answer"], notebook)
    parts = {name: notebook[name] for name in ("mask_tokens", "mlm_loss")}
    for check, name in ((nb09.check_mask_tokens, "mask_tokens"), (nb09.check_mlm_loss, "mlm_loss")):
        with pytest.raises(CheckFailed):
            check(parts[name])
    nb09.check_mlm_training(notebook["train_mlm"])
    assert all(notebook[name] is part for name, part in parts.items())
