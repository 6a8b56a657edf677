"""Notebook 09's encoder graders (embeddings, block, model) (graders/exercises/nb09/encoder.py): correct
variants (in other styles) pass, each catalogued mistake fails with its name, and the course's BERT
agrees with transformers' BertForMaskedLM."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb09
from graders.reference import bert
from graders.reference.components import MLP, Attention, LayerNorm
from graders.reference.config import Config

from catalog_helpers import fails_with
from test_catalog_09_norms import Parts, post_norm, pre_norm
from test_catalog_09_tying import Copied, Tied, TiedThroughModule


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
