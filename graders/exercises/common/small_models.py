"""The small models that the training and sampling checks (notebooks 07 and 08) run on.

A transformer is built from a seed inside `torch.random.fork_rng`, so building one never moves
torch's global random state, and the same seed gives the same weights in every process.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from graders.judging.cases import rand_float
from graders.reference.config import Config


def seeded_model(cfg: Config, seed: int, model_class=None):
    """`model_class(cfg)` (default: the course's DemoTransformer) with weights drawn from `seed`,
    in training mode as built (call `.eval()` to generate with it)."""
    if model_class is None:
        from graders.reference.components import DemoTransformer as model_class
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return model_class(cfg)


@contextlib.contextmanager
def fed_lengths(model):
    """The number of positions of every sequence `model` (a seeded_model) is run on, while in the
    block: what a learner's generation loop feeds it, call by call."""
    fed = []
    handle = model.embed.register_forward_pre_hook(
        lambda module, args: fed.append(args[0].shape[-1] if args and isinstance(args[0], torch.Tensor) else -1))
    try:
        yield fed
    finally:
        handle.remove()


def sampling_config() -> Config:
    """A 1-layer model whose context (16) is shorter than prompt + new tokens."""
    return Config(d_vocab=300, n_ctx=16, d_model=32, n_layers=1, n_heads=2, d_head=16, d_mlp=64,
                  init_range=0.3)


def cache_config() -> Config:
    """A 2-layer model for the KV-cache checks. init_range 0.3 spreads its logits, so greedy
    choices are decided by margins far above rounding error (no near-ties)."""
    return Config(d_vocab=1000, n_ctx=128, d_model=64, n_layers=2, n_heads=4, d_head=16,
                  d_mlp=256, init_range=0.3)


class MarkovModel(nn.Module):
    """A tiny language model whose next-token logits depend only on the last token.

    Small enough that every continuation can be enumerated, so the true best sequences are known.
    """

    def __init__(self, table: torch.Tensor, n_ctx: int = 64):
        super().__init__()
        self.table = table                                           # [d_vocab, d_vocab]
        self.cfg = Config(d_vocab=table.shape[0], n_ctx=n_ctx)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]                                    # [batch, posn, d_vocab]


def markov_model(seed: int, d_vocab: int, scale: float = 2.0) -> MarkovModel:
    return MarkovModel(scale * rand_float(seed, d_vocab, d_vocab))
