"""Notebook 09's shared definitions: the small configurations, seeded weights with spread-out
scales, the masked-language-modelling task on the reversal vocabulary, and the reference
masking and loss that the graders compare with."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from graders.reference.bert import EncoderConfig
from graders.reference.config import Config
from graders.marks import course_answer

# --- The MLM task: notebook 07's reversal sequences, as sentence pairs -----------------------
# Ordinary tokens are 0..99 (the reversal task's vocabulary); three special tokens follow.
N_ORDINARY = 100
CLS, SEP, MASK = 100, 101, 102
D_VOCAB = 103
SPECIALS = (CLS, SEP, MASK)
HALF = 8
SEQ_LEN = 2 * HALF + 3                  # [CLS] a_0..a_7 [SEP] a_7..a_0 [SEP]
IGNORE = -100                           # the target of a position that is not scored
P_CHOOSE, P_MASK, P_RANDOM, P_KEEP = 0.15, 0.8, 0.1, 0.1


def mlm_config() -> EncoderConfig:
    """The encoder of notebook 09: 2 layers, d_model 64, over the 103-token vocabulary."""
    return EncoderConfig(d_vocab=D_VOCAB, n_ctx=32, d_model=64, n_layers=2, n_heads=4, d_head=16,
                         d_mlp=256)


def train_config() -> EncoderConfig:
    """The encoder of the MLM training run: one layer is enough to look up each masked token's
    mirror, and trains twice as fast on a CPU."""
    return dataclasses.replace(mlm_config(), n_layers=1)


def block_config() -> Config:
    """The GPT-2-style model of the post-norm and weight-tying checks (eps 1e-5)."""
    return Config(d_vocab=100, n_ctx=32, d_model=64, n_layers=2, n_heads=4, d_head=16, d_mlp=256)


def reversal_pairs(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, token_types), each [n, 19]: `[CLS] a [SEP] reversed(a) [SEP]`, with segment 0
    for `[CLS] a [SEP]` and segment 1 for `reversed(a) [SEP]`."""
    half = torch.randint(0, N_ORDINARY, (n, HALF), generator=generator)
    column = lambda token: torch.full((n, 1), token, dtype=torch.long)  # noqa: E731
    tokens = torch.cat([column(CLS), half, column(SEP), half.flip(-1), column(SEP)], dim=-1)
    token_types = (torch.arange(SEQ_LEN) > HALF + 1).long().expand(n, SEQ_LEN).clone()
    return tokens, token_types


@course_answer("mask_tokens")
def reference_mask_tokens(tokens: torch.Tensor,
                          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's recipe: each ordinary position is chosen with probability 0.15; a chosen one
    becomes [MASK] (80%), a uniformly random ordinary token (10%) or stays (10%). Targets are
    the original token at chosen positions and IGNORE elsewhere."""
    chosen = (torch.rand(tokens.shape, generator=generator) < P_CHOOSE) & (tokens < N_ORDINARY)
    action = torch.rand(tokens.shape, generator=generator)
    random_tokens = torch.randint(0, N_ORDINARY, tokens.shape, generator=generator)
    inputs = torch.where(chosen & (action < P_MASK), MASK, tokens)
    inputs = torch.where(chosen & (action >= P_MASK) & (action < P_MASK + P_RANDOM), random_tokens, inputs)
    return inputs, torch.where(chosen, tokens, IGNORE)


@course_answer("mlm_loss")
def reference_mlm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the scored (chosen) positions only, in float64."""
    return F.cross_entropy(logits.double().flatten(0, -2), targets.flatten(), ignore_index=IGNORE)


# --- Seeded weights whose scales make mistakes visible ---------------------------------------

def _scale(name: str) -> tuple[float, float]:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "w":                                   # LayerNorm gains, far from 1
        return 1.0, 0.3
    if leaf == "b" or leaf.startswith("b_"):
        return 0.0, 0.1
    return 0.0, {"W_Q": 0.2, "W_K": 0.2, "W_V": 0.15, "W_O": 0.15, "W_in": 0.3, "W_out": 0.15,
                 "W_E": 0.5, "W_pos": 0.3}.get(leaf, 0.1)


def spread_weights(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights for every parameter of a course-named module: sharp attention, MLP
    pre-activations spread over +-4, LayerNorm gains and biases far from 1 and 0."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, param in module.named_parameters():
        mean, std = _scale(name)
        weights[name] = mean + std * torch.randn(param.shape, generator=generator)
    return weights


def seeded_residual(seed: int, batch: int, seq: int, d_model: int) -> torch.Tensor:
    """A residual stream no file holds: random, with a per-position offset and spread."""
    generator = torch.Generator().manual_seed(20_000 + seed)
    x = torch.randn(batch, seq, d_model, generator=generator)
    return x * (0.5 + torch.rand(batch, seq, 1, generator=generator) * 2) + \
        torch.randn(batch, seq, 1, generator=generator)
