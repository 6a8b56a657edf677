"""Notebook 13's model: notebook 06's GPT-2, with its weights laid out as OpenAI's checkpoint
stores them (and transformers' GPT2LMHeadModel names them): Q, K and V of every head in one
matrix `attn.c_attn` [d_model, 3 d_model], the heads' output in `attn.c_proj`. A projection is
y = x W + b with W [d_in, d_out], as in 03; LoRA wraps these layers, and a state dict loads into
transformers' GPT-2 (and back) name for name, which is how the LoRA check compares with peft.
Given code: the learner builds on it, never rewrites it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class GPTConfig:
    d_vocab: int = 100
    n_ctx: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    layer_norm_eps: float = 1e-5


class Linear(nn.Module):
    """y = x W + b, W [d_in, d_out] (transformers' Conv1D for GPT-2)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.c_attn = Linear(cfg.d_model, 3 * cfg.d_model)   # [W_Q | W_K | W_V], heads side by side
        self.c_proj = Linear(cfg.d_model, cfg.d_model)       # W_O

    def forward(self, x: Tensor) -> Tensor:
        batch, posn, d_model = x.shape
        heads = self.cfg.n_heads
        q, k, v = (t.reshape(batch, posn, heads, -1).transpose(1, 2) for t in self.c_attn(x).split(d_model, -1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_model // heads)       # [batch, heads, query, key]
        future = torch.ones(posn, posn, dtype=torch.bool, device=x.device).triu(1)
        pattern = scores.masked_fill(future, float("-inf")).softmax(-1)
        z = (pattern @ v).transpose(1, 2).reshape(batch, posn, d_model)
        return self.c_proj(z)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc, self.c_proj = Linear(cfg.d_model, 4 * cfg.d_model), Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))   # GPT-2's gelu_new


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.ln_2 = nn.LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg.d_vocab, cfg.d_model), nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, cfg.layer_norm_eps)


class GPT(nn.Module):
    """GPT-2 with transformers' parameter names; the unembedding is the embedding (tied)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = Transformer(cfg)
        nn.init.normal_(self.transformer.wte.weight, std=0.02)
        nn.init.normal_(self.transformer.wpe.weight, std=0.01)

    def forward(self, tokens: Tensor) -> Tensor:
        t = self.transformer
        x = t.wte(tokens) + t.wpe(torch.arange(tokens.shape[-1], device=tokens.device))
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.T                                    # [batch, posn, d_vocab]


def seeded_gpt(cfg: GPTConfig, seed: int) -> GPT:
    """A GPT whose weights are drawn from `seed` (torch's global generator left as it was)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return GPT(cfg)


@torch.no_grad()
def greedy(model: nn.Module, prompts: list[list[int]], stop: int, max_new: int) -> list[list[int]]:
    """Each prompt's greedy continuation, up to and including `stop` or `max_new` tokens (the
    model's ids). Prompts of one length at a time, so that no padding is needed."""
    answers: list[list[int]] = [[] for _ in prompts]
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(i)
    for indices in by_length.values():
        tokens = torch.tensor([prompts[i] for i in indices])
        done = torch.zeros(len(indices), dtype=torch.bool)
        for _ in range(max_new):
            next_token = model(tokens[:, -model.cfg.n_ctx:])[:, -1].argmax(-1)
            for row, i in enumerate(indices):
                if not done[row]:
                    answers[i].append(int(next_token[row]))
            done |= next_token == stop
            if done.all():
                break
            tokens = torch.cat([tokens, next_token[:, None]], 1)
    return answers


def jittered_gpt(cfg: GPTConfig, seed: int) -> GPT:
    """A seeded GPT whose biases and LayerNorm weights are not at their initial 0 and 1, so that a
    check sees every parameter at work."""
    model = seeded_gpt(cfg, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model
