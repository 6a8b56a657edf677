"""The course's own versions of each component, for later notebooks to build on.

A later notebook imports these so that a mistake in an earlier notebook costs no points there.
Graders forbid them inside the exercise that asks the learner to build the same thing.
"""
import math

import einops
import torch
from torch import Tensor, nn

from graders.reference.config import Config
from graders.marks import course_answer


@course_answer("LayerNorm")
class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual: Tensor) -> Tensor:
        centred = residual - residual.mean(dim=-1, keepdim=True)
        variance = centred.pow(2).mean(dim=-1, keepdim=True)
        return centred / (variance + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


@course_answer("Embed")
class Embed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        nn.init.normal_(self.W_E, std=cfg.init_range)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.W_E[tokens]                                          # [batch, posn, d_model]


@course_answer("PosEmbed")
class PosEmbed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        nn.init.normal_(self.W_pos, std=cfg.init_range)

    def forward(self, tokens: Tensor) -> Tensor:
        batch, seq_len = tokens.shape
        return einops.repeat(self.W_pos[:seq_len], "posn d_model -> batch posn d_model", batch=batch)


@course_answer("Attention")
class Attention(nn.Module):
    IGNORE: Tensor

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        shape_in, shape_out = (cfg.n_heads, cfg.d_model, cfg.d_head), (cfg.n_heads, cfg.d_head, cfg.d_model)
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.empty(shape_in)) for _ in range(3))
        self.W_O = nn.Parameter(torch.empty(shape_out))
        self.b_Q, self.b_K, self.b_V = (nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head)) for _ in range(3))
        self.b_O = nn.Parameter(torch.zeros(cfg.d_model))
        for w in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(w, std=cfg.init_range)
        self.register_buffer("IGNORE", torch.tensor(float("-inf")), persistent=False)

    def forward(self, normalized_resid_pre: Tensor) -> Tensor:
        x = normalized_resid_pre                                          # [batch, posn, d_model]
        q = einops.einsum(x, self.W_Q, "b p d, n d h -> b p n h") + self.b_Q
        k = einops.einsum(x, self.W_K, "b p d, n d h -> b p n h") + self.b_K
        v = einops.einsum(x, self.W_V, "b p d, n d h -> b p n h") + self.b_V
        scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)
        pattern = self.apply_causal_mask(scores).softmax(dim=-1)           # [batch, n_heads, q, k]
        z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")      # [batch, posn, n_heads, d_head]
        return einops.einsum(z, self.W_O, "b p n h, n h d -> b p d") + self.b_O

    def apply_causal_mask(self, attn_scores: Tensor) -> Tensor:
        q_len, k_len = attn_scores.shape[-2:]
        future = torch.triu(torch.ones(q_len, k_len, dtype=torch.bool, device=attn_scores.device), diagonal=1)
        return attn_scores.masked_fill(future, self.IGNORE)


@course_answer("gelu_new")
def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's GELU: the tanh approximation of x * Phi(x)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


@course_answer("MLP")
class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        nn.init.normal_(self.W_in, std=cfg.init_range)
        nn.init.normal_(self.W_out, std=cfg.init_range)

    def forward(self, normalized_resid_mid: Tensor) -> Tensor:
        pre = normalized_resid_mid @ self.W_in + self.b_in               # [batch, posn, d_mlp]
        return gelu_new(pre) @ self.W_out + self.b_out                    # [batch, posn, d_model]


@course_answer("TransformerBlock")
class TransformerBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.ln1, self.attn = LayerNorm(cfg), Attention(cfg)
        self.ln2, self.mlp = LayerNorm(cfg), MLP(cfg)

    def forward(self, resid_pre: Tensor) -> Tensor:
        resid_mid = resid_pre + self.attn(self.ln1(resid_pre))
        return resid_mid + self.mlp(self.ln2(resid_mid))


@course_answer("Unembed")
class Unembed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab), requires_grad=False)
        nn.init.normal_(self.W_U, std=cfg.init_range)

    def forward(self, normalized_resid_final: Tensor) -> Tensor:
        return normalized_resid_final @ self.W_U + self.b_U              # [batch, posn, d_vocab]


@course_answer("DemoTransformer")
class DemoTransformer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed, self.pos_embed = Embed(cfg), PosEmbed(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final, self.unembed = LayerNorm(cfg), Unembed(cfg)

    def forward(self, tokens: Tensor) -> Tensor:
        residual = self.embed(tokens) + self.pos_embed(tokens)           # [batch, posn, d_model]
        for block in self.blocks:
            residual = block(residual)
        return self.unembed(self.ln_final(residual))                      # [batch, posn, d_vocab]
