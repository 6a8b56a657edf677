"""A small BERT under the course's names: the course's own encoder modules, seeded random weights
under Hugging Face's names, and the weight-name converter between the two.

Notebook 09 grades the learner's encoder against transformers' `BertForMaskedLM` (an
implementation the course did not write): the grader draws one set of weights under Hugging
Face's names (`random_hf_weights`, pure torch, so a grading kernel never imports transformers),
loads them strictly into `BertForMaskedLM` on the judge's side (`hf_model`), and into the
learner's modules through `course_weights`, the converter. Course names:

    embed.W_E [d_vocab, d_model]   embed.W_pos [n_ctx, d_model]   embed.W_type [n_token_types, d_model]
    embed.ln.{w,b}
    blocks.{i}.attn.{W_Q,W_K,W_V [n_heads, d_model, d_head], b_Q,b_K,b_V [n_heads, d_head],
                     W_O [n_heads, d_head, d_model], b_O}
    blocks.{i}.ln1.{w,b}   blocks.{i}.mlp.{W_in, b_in, W_out, b_out}   blocks.{i}.ln2.{w,b}
    mlm_head.{W_dense [d_model, d_model], b_dense}   mlm_head.ln.{w,b}   mlm_head.unembed.b_U
    (the head's unembedding is embed.W_E itself, transposed: one parameter, tied)

BERT differs from GPT-2 in ways that show in the numbers: attention has no mask, each block is
post-norm, the GELU is the exact erf one, LayerNorm's eps is 1e-12, token-type (segment)
embeddings are added, the embeddings are normalised, and the MLM head has a dense layer, a GELU
and a LayerNorm before its tied unembedding.
"""
from __future__ import annotations

from dataclasses import dataclass

import einops
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graders.reference.components import MLP, Attention, LayerNorm
from graders.reference.config import Config
from graders.marks import course_answer


@dataclass
class EncoderConfig(Config):
    """A Config for BERT-style encoders: BERT's LayerNorm eps, and segment (token-type) ids."""
    layer_norm_eps: float = 1e-12
    n_token_types: int = 2


# --- The course's encoder modules ------------------------------------------------------------

@course_answer("gelu_erf")
def gelu_erf(x: Tensor) -> Tensor:
    """The exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)), as BERT uses it (GPT-2 uses the
    tanh approximation). torch's fused version: the graded training run spends most of its time
    in elementwise functions of [batch, posn, d_mlp] tensors."""
    return F.gelu(x)


class FusedLayerNorm(LayerNorm):
    """The course's LayerNorm (same parameters, population variance, eps inside the square root),
    computed by torch's fused kernel: 10% of the graded training run's time."""

    def forward(self, residual: Tensor) -> Tensor:
        return F.layer_norm(residual, (residual.shape[-1],), self.w, self.b, self.cfg.layer_norm_eps)


@course_answer("BidirectionalAttention")
class BidirectionalAttention(Attention):
    """The course's attention without the causal mask: every position sees every position."""

    def apply_causal_mask(self, attn_scores: Tensor) -> Tensor:
        return attn_scores


@course_answer("BertMLP")
class BertMLP(MLP):
    def forward(self, normalized_resid_mid: Tensor) -> Tensor:
        return gelu_erf(normalized_resid_mid @ self.W_in + self.b_in) @ self.W_out + self.b_out


@course_answer("PostNormBlock")
class PostNormBlock(nn.Module):
    """The original Transformer's block: LayerNorm after each residual addition."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.attn, self.ln1 = Attention(cfg), LayerNorm(cfg)
        self.mlp, self.ln2 = MLP(cfg), LayerNorm(cfg)

    def forward(self, resid_pre: Tensor) -> Tensor:
        resid_mid = self.ln1(resid_pre + self.attn(resid_pre))
        return self.ln2(resid_mid + self.mlp(resid_mid))


@course_answer("EncoderBlock")
class EncoderBlock(PostNormBlock):
    """BERT's layer: a post-norm block with bidirectional attention and the erf GELU."""

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.attn, self.mlp = BidirectionalAttention(cfg), BertMLP(cfg)
        self.ln1, self.ln2 = FusedLayerNorm(cfg), FusedLayerNorm(cfg)


@course_answer("BertEmbeddings")
class BertEmbeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.randn(cfg.d_vocab, cfg.d_model) * cfg.init_range)
        self.W_pos = nn.Parameter(torch.randn(cfg.n_ctx, cfg.d_model) * cfg.init_range)
        self.W_type = nn.Parameter(torch.randn(cfg.n_token_types, cfg.d_model) * cfg.init_range)
        self.ln = FusedLayerNorm(cfg)

    def forward(self, tokens: Tensor, token_types: Tensor) -> Tensor:
        seq_len = tokens.shape[1]
        return self.ln(self.W_E[tokens] + self.W_pos[:seq_len] + self.W_type[token_types])


@course_answer("TiedUnembed")
class TiedUnembed(nn.Module):
    """Logits from the embedding matrix itself: W_U = W_E.T, one parameter."""

    def __init__(self, embed: nn.Module):
        super().__init__()
        self.W_E = embed.W_E                                   # the same nn.Parameter object
        self.b_U = nn.Parameter(torch.zeros(embed.W_E.shape[0]))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.W_E.T + self.b_U


@course_answer("MLMHead")
class MLMHead(nn.Module):
    def __init__(self, cfg: EncoderConfig, embed: nn.Module):
        super().__init__()
        self.W_dense = nn.Parameter(torch.randn(cfg.d_model, cfg.d_model) * cfg.init_range)
        self.b_dense = nn.Parameter(torch.zeros(cfg.d_model))
        self.ln = FusedLayerNorm(cfg)
        self.unembed = TiedUnembed(embed)

    def forward(self, x: Tensor) -> Tensor:
        return self.unembed(self.ln(gelu_erf(x @ self.W_dense + self.b_dense)))


@course_answer("BertForMLM")
class BertForMLM(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = BertEmbeddings(cfg)
        self.blocks = nn.ModuleList([EncoderBlock(cfg) for _ in range(cfg.n_layers)])
        self.mlm_head = MLMHead(cfg, self.embed)

    def forward(self, tokens: Tensor, token_types: Tensor) -> Tensor:
        resid = self.embed(tokens, token_types)
        for block in self.blocks:
            resid = block(resid)
        return self.mlm_head(resid)


# --- Hugging Face's names, seeded weights, and the converter ---------------------------------

def hf_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of `BertForMaskedLM`'s state dict for `cfg`, by name (tied ones included)."""
    d, m, v = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    shapes = {"bert.embeddings.word_embeddings.weight": (v, d),
              "bert.embeddings.position_embeddings.weight": (cfg.n_ctx, d),
              "bert.embeddings.token_type_embeddings.weight": (cfg.n_token_types, d),
              "bert.embeddings.LayerNorm.weight": (d,), "bert.embeddings.LayerNorm.bias": (d,)}
    for i in range(cfg.n_layers):
        h = f"bert.encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            shapes[h + name + ".weight"], shapes[h + name + ".bias"] = (d, d), (d,)
        shapes[h + "intermediate.dense.weight"], shapes[h + "intermediate.dense.bias"] = (m, d), (m,)
        shapes[h + "output.dense.weight"], shapes[h + "output.dense.bias"] = (d, m), (d,)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[h + ln + ".weight"], shapes[h + ln + ".bias"] = (d,), (d,)
    shapes.update({"cls.predictions.bias": (v,),
                   "cls.predictions.transform.dense.weight": (d, d),
                   "cls.predictions.transform.dense.bias": (d,),
                   "cls.predictions.transform.LayerNorm.weight": (d,),
                   "cls.predictions.transform.LayerNorm.bias": (d,),
                   "cls.predictions.decoder.weight": (v, d), "cls.predictions.decoder.bias": (v,)})
    return shapes


def _scale(name: str) -> tuple[float, float]:
    """(mean, std) of a seeded weight. Scales like a trained model's, so that mistakes show:
    sharp attention (query/key), MLP pre-activations spread over +-4 (where the erf and tanh
    GELUs differ), LayerNorm gains far from 1. The embeddings keep BERT's init scale (0.02), so
    the embedding LayerNorm's input has a variance near 1e-3, where its eps matters."""
    if "embeddings" in name and "LayerNorm" not in name:
        return 0.0, 0.02
    if "LayerNorm.weight" in name:
        return 1.0, 0.3
    if name.endswith("bias"):
        return 0.0, 0.1
    if ".query." in name or ".key." in name:
        return 0.0, 0.2
    if "intermediate" in name:
        return 0.0, 0.3
    return 0.0, 0.15


def random_hf_weights(cfg: EncoderConfig, seed: int) -> dict[str, Tensor]:
    """Seeded weights under Hugging Face's names (the tied decoder shares the word embeddings
    and the prediction bias). Drawn from their own generator: torch's global one never moves."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in hf_shapes(cfg).items():
        if name == "cls.predictions.decoder.weight":
            weights[name] = weights["bert.embeddings.word_embeddings.weight"]
        elif name == "cls.predictions.decoder.bias":
            weights[name] = weights["cls.predictions.bias"]
        else:
            mean, std = _scale(name)
            weights[name] = mean + std * torch.randn(shape, generator=generator)
    return weights


def course_weights(hf: dict[str, Tensor], cfg: EncoderConfig) -> dict[str, Tensor]:
    """Hugging Face's `BertForMaskedLM` weights under the course's names (the converter).

    `nn.Linear` stores [out, in]; the course multiplies `x @ W` with W as [in, out], and splits
    attention's d_model = n_heads * d_head into heads, head-major as in GPT-2."""
    n = cfg.n_heads
    w = {"embed.W_E": hf["bert.embeddings.word_embeddings.weight"],
         "embed.W_pos": hf["bert.embeddings.position_embeddings.weight"],
         "embed.W_type": hf["bert.embeddings.token_type_embeddings.weight"],
         "embed.ln.w": hf["bert.embeddings.LayerNorm.weight"],
         "embed.ln.b": hf["bert.embeddings.LayerNorm.bias"]}
    for i in range(cfg.n_layers):
        h, b = f"bert.encoder.layer.{i}.", f"blocks.{i}."
        for course, name in (("Q", "query"), ("K", "key"), ("V", "value")):
            w[f"{b}attn.W_{course}"] = einops.rearrange(
                hf[f"{h}attention.self.{name}.weight"], "(n h) d -> n d h", n=n)
            w[f"{b}attn.b_{course}"] = einops.rearrange(hf[f"{h}attention.self.{name}.bias"],
                                                         "(n h) -> n h", n=n)
        w[b + "attn.W_O"] = einops.rearrange(hf[h + "attention.output.dense.weight"], "d (n h) -> n h d", n=n)
        w[b + "attn.b_O"] = hf[h + "attention.output.dense.bias"]
        w[b + "ln1.w"], w[b + "ln1.b"] = (hf[h + "attention.output.LayerNorm.weight"],
                                          hf[h + "attention.output.LayerNorm.bias"])
        w[b + "mlp.W_in"] = hf[h + "intermediate.dense.weight"].T
        w[b + "mlp.b_in"] = hf[h + "intermediate.dense.bias"]
        w[b + "mlp.W_out"], w[b + "mlp.b_out"] = hf[h + "output.dense.weight"].T, hf[h + "output.dense.bias"]
        w[b + "ln2.w"], w[b + "ln2.b"] = hf[h + "output.LayerNorm.weight"], hf[h + "output.LayerNorm.bias"]
    p = "cls.predictions."
    w.update({"mlm_head.W_dense": hf[p + "transform.dense.weight"].T,
              "mlm_head.b_dense": hf[p + "transform.dense.bias"],
              "mlm_head.ln.w": hf[p + "transform.LayerNorm.weight"],
              "mlm_head.ln.b": hf[p + "transform.LayerNorm.bias"],
              "mlm_head.unembed.b_U": hf[p + "bias"]})
    return {k: v.float().contiguous().clone() for k, v in w.items()}


def seeded_course_weights(cfg: EncoderConfig, seed: int) -> dict[str, Tensor]:
    return course_weights(random_hf_weights(cfg, seed), cfg)


def load_tied(module: nn.Module, weights: dict[str, Tensor], what: str,
              embedding: str = "embed.W_E") -> nn.Module:
    """`load_strict`, where a parameter the module registers a second time (a tied unembedding
    holding `embed.W_E`, or the whole embedding module, under any name) takes its weights under
    each name, and any other `...W_E` of the embedding's shape (an untied copy, which the
    parameter count then exposes) takes the embedding's weights."""
    from graders.reference.weights import load_strict

    own = dict(module.named_parameters(remove_duplicate=False))
    first_name = {id(p): n for n, p in reversed(own.items()) if n in weights}
    aliases = {}
    for name, param in own.items():
        if name in weights:
            continue
        if id(param) in first_name:
            aliases[name] = weights[first_name[id(param)]]
        elif name.rsplit(".", 1)[-1] == "W_E" and param.shape == weights[embedding].shape:
            aliases[name] = weights[embedding]
    return load_strict(module, {**weights, **aliases}, what)


# --- The judge's side: transformers' BertForMaskedLM -------------------------------------------

def hf_config(cfg: EncoderConfig):
    from transformers import BertConfig

    return BertConfig(vocab_size=cfg.d_vocab, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                      num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_mlp,
                      max_position_embeddings=cfg.n_ctx, type_vocab_size=cfg.n_token_types,
                      layer_norm_eps=cfg.layer_norm_eps, hidden_act="gelu",
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      attn_implementation="eager")


def hf_model(cfg: EncoderConfig, weights: dict[str, Tensor]):
    """transformers' BertForMaskedLM with exactly `weights` (strict), in eval mode."""
    from transformers import BertForMaskedLM

    with torch.random.fork_rng():
        model = BertForMaskedLM(hf_config(cfg))
    model.load_state_dict(weights, strict=True)
    if model.cls.predictions.decoder.weight is not model.bert.embeddings.word_embeddings.weight:
        raise RuntimeError("transformers' BertForMaskedLM no longer ties its decoder to the embeddings")
    return model.eval()
