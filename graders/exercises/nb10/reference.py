"""Notebook 10's small Llama under the course's names: its config, the course's own modules, seeded
weights under Hugging Face's names (pure torch: a grading kernel never imports transformers) and
the converter between the two. Course names:

    W_E [d_vocab, d_model]
    blocks.{i}.ln1.w [d_model]
    blocks.{i}.attn.{W_Q [n_heads, d_model, d_head], W_K, W_V [n_kv_heads, d_model, d_head],
                     W_O [n_heads, d_head, d_model]}
    blocks.{i}.ln2.w   blocks.{i}.mlp.{W_gate, W_up [d_model, d_mlp], W_down [d_mlp, d_model]}
    ln_final.w   W_U [d_model, d_vocab]

The course's modules are the grader's second opinion: the judge compares with transformers'
Llama, and uses these (with a mistake switched on) to name what a wrong output did.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import einops
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from graders.marks import course_answer


@dataclass
class ModernConfig:
    """A small Llama-shaped decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention."""
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    d_head: int = 32
    d_mlp: int = 688
    d_vocab: int = 512
    n_ctx: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_range: float = 0.02


def variants(cfg: ModernConfig | None = None) -> list[ModernConfig]:
    """The configs every attention-level check runs: GQA (the default), MQA (one KV head) and
    MHA (as many KV heads as query heads)."""
    cfg = cfg or ModernConfig()
    return [cfg, replace(cfg, n_kv_heads=1), replace(cfg, n_kv_heads=cfg.n_heads)]


# --- The course's modules ----------------------------------------------------------------------

@course_answer("RMSNorm")
def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


@course_answer("RMSNorm")
class RMSNorm(nn.Module):
    def __init__(self, cfg: ModernConfig):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.w, self.cfg.rms_norm_eps)


@course_answer("rope_cos_sin")
def rope_cos_sin(positions: Tensor, d_head: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin [posn, d_head] in the rotate-half layout (each frequency twice: halves)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
    angles = positions.float()[:, None] * inv_freq          # [posn, d_head / 2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


@course_answer("apply_rope")
def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@course_answer("apply_rope")
def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + rotate_half(x) * sin


@course_answer("apply_rope")
def apply_rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The original paper's layout: pairs (0, 1), (2, 3), ...; cos/sin given in halves."""
    half = x.shape[-1] // 2
    cos_i, sin_i = (t[..., :half].repeat_interleave(2, dim=-1) for t in (cos, sin))
    pairs = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos_i + pairs * sin_i


@course_answer("SwiGLU")
def swiglu(x: Tensor, w: dict) -> Tensor:
    return (F.silu(x @ w["W_gate"]) * (x @ w["W_up"])) @ w["W_down"]


@course_answer("SwiGLU")
class SwiGLU(nn.Module):
    def __init__(self, cfg: ModernConfig):
        super().__init__()
        self.W_gate = nn.Parameter(torch.randn(cfg.d_model, cfg.d_mlp) * cfg.init_range)
        self.W_up = nn.Parameter(torch.randn(cfg.d_model, cfg.d_mlp) * cfg.init_range)
        self.W_down = nn.Parameter(torch.randn(cfg.d_mlp, cfg.d_model) * cfg.init_range)

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(x, dict(self.named_parameters()))


@course_answer("GQAttention")
def attention(x: Tensor, w: dict, cos: Tensor, sin: Tensor, past=None, *, groups="interleave",
              scale=None, rope_values=False, rope_keys=True, offset_mask=True, mask=True, softmax_dim=-1,
              cache_new_only=False, masked_value=float("-inf"), cache_unrotated=False, z_d_head_first=False):
    """Grouped-query attention; the keywords switch on the catalogued mistakes.
    Returns (output, (keys, values)) with the cache holding only the KV heads (after RoPE)."""
    n_heads, n_kv = w["W_Q"].shape[0], w["W_K"].shape[0]
    q = apply_rope(torch.einsum("bpd,ndh->bnph", x, w["W_Q"]), cos, sin)
    k = torch.einsum("bpd,ndh->bnph", x, w["W_K"])
    v = torch.einsum("bpd,ndh->bnph", x, w["W_V"])
    unrotated = k
    k = apply_rope(k, cos, sin) if rope_keys else k
    v = apply_rope(v, cos, sin) if rope_values else v
    new_k, new_v = k, v
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        unrotated = torch.cat([past[0], unrotated], dim=2)
    if groups == "interleave":   # query head h reads KV head h // (n_heads / n_kv)
        k_all, v_all = (t.repeat_interleave(n_heads // n_kv, dim=1) for t in (k, v))
    else:                        # `repeat`: query head h reads KV head h % n_kv
        k_all, v_all = (t.repeat(1, n_heads // n_kv, 1, 1) for t in (k, v))
    scores = q @ k_all.transpose(-1, -2) / (scale or math.sqrt(q.shape[-1]))
    n_q, n_k = scores.shape[-2:]
    diagonal = 1 + (n_k - n_q if offset_mask else 0)
    if mask:
        scores = scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(diagonal), masked_value)
    z = scores.softmax(softmax_dim) @ v_all                          # [batch, n_heads, posn, d_head]
    cache = (new_k, new_v) if cache_new_only else (unrotated, v) if cache_unrotated else (k, v)
    if z_d_head_first:   # z flattened [d_head, n_heads] against W_O read as [n_heads, d_head]
        return z.permute(0, 2, 3, 1).flatten(2) @ w["W_O"].flatten(0, 1), cache
    return torch.einsum("bnph,nhd->bpd", z, w["W_O"]), cache


@course_answer("GQAttention")
class GQAttention(nn.Module):
    def __init__(self, cfg: ModernConfig):
        super().__init__()
        self.cfg = cfg
        def shape(*s):
            return nn.Parameter(torch.randn(*s) * cfg.init_range)

        self.W_Q = shape(cfg.n_heads, cfg.d_model, cfg.d_head)
        self.W_K = shape(cfg.n_kv_heads, cfg.d_model, cfg.d_head)
        self.W_V = shape(cfg.n_kv_heads, cfg.d_model, cfg.d_head)
        self.W_O = shape(cfg.n_heads, cfg.d_head, cfg.d_model)

    def forward(self, x, cos, sin, past=None):
        return attention(x, dict(self.named_parameters()), cos, sin, past)


@course_answer("DecoderLayer")
class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModernConfig):
        super().__init__()
        self.ln1, self.attn = RMSNorm(cfg), GQAttention(cfg)
        self.ln2, self.mlp = RMSNorm(cfg), SwiGLU(cfg)

    def forward(self, x, cos, sin, past=None):
        attn_out, cache = self.attn(self.ln1(x), cos, sin, past)
        x = x + attn_out
        return x + self.mlp(self.ln2(x)), cache


@course_answer("ModernDecoder")
class ModernDecoder(nn.Module):
    def __init__(self, cfg: ModernConfig):
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.randn(cfg.d_vocab, cfg.d_model) * cfg.init_range)
        self.blocks = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = RMSNorm(cfg)
        self.W_U = nn.Parameter(torch.randn(cfg.d_model, cfg.d_vocab) * cfg.init_range)

    def forward(self, tokens, past=None):
        start = 0 if past is None else past[0][0].shape[2]
        cos, sin = rope_cos_sin(torch.arange(start, start + tokens.shape[1]), self.cfg.d_head,
                                self.cfg.rope_theta)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return self.ln_final(x) @ self.W_U, cache


# --- Hugging Face's names, seeded weights, and the converter ---------------------------------

def hf_shapes(cfg: ModernConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of `LlamaForCausalLM`'s state dict for `cfg` (untied head), by name."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    shapes = {"model.embed_tokens.weight": (cfg.d_vocab, d)}
    for i in range(cfg.n_layers):
        h = f"model.layers.{i}."
        shapes.update({h + "input_layernorm.weight": (d,), h + "post_attention_layernorm.weight": (d,),
                       h + "self_attn.q_proj.weight": (q, d), h + "self_attn.k_proj.weight": (kv, d),
                       h + "self_attn.v_proj.weight": (kv, d), h + "self_attn.o_proj.weight": (d, q),
                       h + "mlp.gate_proj.weight": (cfg.d_mlp, d), h + "mlp.up_proj.weight": (cfg.d_mlp, d),
                       h + "mlp.down_proj.weight": (d, cfg.d_mlp)})
    shapes.update({"model.norm.weight": (d,), "lm_head.weight": (cfg.d_vocab, d)})
    return shapes


def _std(name: str) -> tuple[float, float]:
    """(mean, std): scales at which the mistakes show (scores spread over a few units, SwiGLU
    pre-activations over +-3 where SiLU and GELU differ, gains far from 1)."""
    if "norm" in name:
        return 1.0, 0.3
    if "q_proj" in name or "k_proj" in name or "gate_proj" in name or "up_proj" in name:
        return 0.0, 0.1
    if "embed" in name:
        return 0.0, 1.0
    return 0.0, 0.06


def random_hf_weights(cfg: ModernConfig, seed: int) -> dict[str, Tensor]:
    """Seeded weights under Hugging Face's names, from their own generator."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in hf_shapes(cfg).items():
        mean, std = _std(name)
        weights[name] = mean + std * torch.randn(shape, generator=generator)
    return weights


def course_weights(hf: dict[str, Tensor], cfg: ModernConfig) -> dict[str, Tensor]:
    """The converter: `nn.Linear` stores [out, in], the course multiplies `x @ W` per head."""
    w = {"W_E": hf["model.embed_tokens.weight"], "ln_final.w": hf["model.norm.weight"],
         "W_U": hf["lm_head.weight"].T}
    for i in range(cfg.n_layers):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        for course, name in (("Q", "q"), ("K", "k"), ("V", "v")):
            w[f"{b}attn.W_{course}"] = einops.rearrange(
                hf[f"{h}self_attn.{name}_proj.weight"], "(n h) d -> n d h", h=cfg.d_head)
        w[b + "attn.W_O"] = einops.rearrange(hf[h + "self_attn.o_proj.weight"], "d (n h) -> n h d", h=cfg.d_head)
        w[b + "ln1.w"], w[b + "ln2.w"] = hf[h + "input_layernorm.weight"], hf[h + "post_attention_layernorm.weight"]
        for part in ("gate", "up", "down"):
            w[f"{b}mlp.W_{part}"] = hf[f"{h}mlp.{part}_proj.weight"].T
    return {k: v.float().contiguous().clone() for k, v in w.items()}


def seeded_input(seed: int, *shape: int) -> Tensor:
    """A residual stream [batch, posn, d_model] with a mean per position (so that centring shows)."""
    generator = torch.Generator().manual_seed(700 + seed)
    return torch.randn(shape, generator=generator) * 1.5 + torch.randn(*shape[:-1], 1, generator=generator)


# --- The judge's side: transformers' Llama ------------------------------------------------------

def hf_config(cfg: ModernConfig):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=cfg.d_vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
                       num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                       num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.d_head,
                       max_position_embeddings=cfg.n_ctx, rms_norm_eps=cfg.rms_norm_eps,
                       rope_theta=cfg.rope_theta, tie_word_embeddings=False, hidden_act="silu",
                       attention_bias=False, mlp_bias=False, attn_implementation="eager")


def hf_model(cfg: ModernConfig, weights: dict[str, Tensor]):
    """transformers' LlamaForCausalLM with exactly `weights` (strict), in eval mode."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng():
        model = LlamaForCausalLM(hf_config(cfg))
    model.load_state_dict(weights, strict=True)
    return model.eval()


def hf_rope(cfg: ModernConfig, positions: Tensor) -> tuple[Tensor, Tensor]:
    """LlamaRotaryEmbedding's cos and sin [posn, d_head] for these positions."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cos, sin = LlamaRotaryEmbedding(hf_config(cfg))(torch.zeros(1), positions[None])
    return cos[0], sin[0]


@course_answer("GQAttention")
def causal_mask(n_q: int, n_k: int) -> Tensor:
    """The additive mask [1, 1, n_q, n_k] for queries that are the last n_q of n_k positions."""
    allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    return torch.zeros(n_q, n_k).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
