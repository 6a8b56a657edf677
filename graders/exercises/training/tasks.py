"""The two training tasks of notebook 07, as the grader defines them: the reversal task and tiny
Shakespeare (sizes, step budgets, data, and Shakespeare's compact vocabulary)."""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from graders.reference.config import Config

# --- The reversal task ----------------------------------------------------------------------
D_VOCAB = 100
SEQ_LEN = 16
HALF = SEQ_LEN // 2
UNTRAINED_LOSS = math.log(D_VOCAB)                       # 4.605: uniform over 100 tokens
N_UNPREDICTABLE = HALF - 1                               # targets 1..7 are fresh random tokens
FLOOR = N_UNPREDICTABLE / (SEQ_LEN - 1) * math.log(D_VOCAB)   # 7/15 ln 100 = 2.149


def reversal_config() -> Config:
    return Config(d_vocab=D_VOCAB, n_ctx=SEQ_LEN, d_model=64, n_layers=2, n_heads=4, d_head=16,
                  d_mlp=256)


# The graded reversal run: a 2-layer d_model-64 model, batches of 64, AdamW at lr 5e-3.
# BAND_BELOW / BAND_ABOVE: see `judge_train` (training/train.py) and the measured runs there.
REVERSAL_STEPS = 150
REVERSAL_BATCH = 64
REVERSAL_LR = 5e-3
REVERSAL_EVAL_EVERY = 50
N_TEST_SEQUENCES = 1000
BAND_BELOW = 0.05
BAND_ABOVE = 0.05
STUCK_ABOVE = 4.3                 # within 0.3 of ln 100: the model has not learned anything
FIRST_HALF_MAX_ACCURACY = 0.05    # chance is 1%
SECOND_HALF_MIN_ACCURACY = 0.99

# --- Tiny Shakespeare -----------------------------------------------------------------------
# The graded run: the course's model (shakespeare_config) on the compact vocabulary, trained by
# the learner's `train` with constant lr on one thread; the bar is the train split's unigram
# entropy H minus BELOW_UNIGRAM. Measurements: see `judge_shakespeare` (training/shakespeare.py).
SHAKESPEARE_WINDOW = 64
SHAKESPEARE_BATCH = 32
SHAKESPEARE_D_MODEL = 128
SHAKESPEARE_LR = 5e-3
SHAKESPEARE_STEPS = 125           # the graded run (a hidden test); see judge_shakespeare
BELOW_UNIGRAM = 0.05              # nats: the bar is H - this; worst of 4 seeds: H - 0.117
N_VAL_WINDOWS = 128
MIN_CONTEXT_GAIN = 0.1            # nats a model using context loses when its windows are shuffled
SMOKE_STEPS = 4                   # the visible check; see judge_shakespeare_smoke
SMOKE_BELOW_UNIFORM = 1.5
N_SMOKE_VAL_WINDOWS = 32


def shakespeare_config() -> Config:
    """The graded model: 2 layers, d_model 128, one row per id of the compact vocabulary."""
    d = SHAKESPEARE_D_MODEL
    return Config(d_vocab=shakespeare_vocab().d_vocab, n_ctx=SHAKESPEARE_WINDOW, d_model=d,
                  n_layers=2, n_heads=4, d_head=d // 4, d_mlp=4 * d)


# --- The reference's data and per-position scores -------------------------------------

def reference_reversal(n: int, generator: torch.Generator) -> torch.Tensor:
    half = torch.randint(0, D_VOCAB, (n, HALF), generator=generator)
    return torch.cat([half, half.flip(-1)], dim=-1)


def per_position(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss, accuracy) of each prediction position 0..14, over the sequences."""
    logits = logits.double()[:, :-1]
    targets = tokens[:, 1:]
    loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(0)
    accuracy = (logits.argmax(-1) == targets).double().mean(0)
    return loss, accuracy


# --- Tiny Shakespeare's data ----------------------------------------------------------------

@lru_cache(maxsize=1)
def shakespeare_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) GPT-2 token ids of tiny Shakespeare: the first 90% and the last 10%."""
    from graders.reference.data import load_tinyshakespeare
    from graders.reference.tokenizer import gpt2_encoding

    ids = torch.tensor(gpt2_encoding().encode_ordinary(load_tinyshakespeare()), dtype=torch.long)
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:]


@lru_cache(maxsize=1)
def shakespeare_vocab():
    """The compact vocabulary (graders.reference.vocab): the ids of the train split, + unknown."""
    from graders.reference.vocab import CompactVocab

    return CompactVocab.from_ids(shakespeare_tokens()[0])


@lru_cache(maxsize=1)
def compact_shakespeare_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """`shakespeare_tokens()` in the compact vocabulary's ids (2.1% of validation is unknown)."""
    vocab = shakespeare_vocab()
    return tuple(vocab.encode_ids(ids) for ids in shakespeare_tokens())


@lru_cache(maxsize=1)
def unigram_entropy() -> float:
    """The entropy (nats) of the train split's token frequencies: the best loss without context."""
    train, _ = shakespeare_tokens()
    counts = torch.bincount(train, minlength=50257).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def random_windows(ids: torch.Tensor, n: int, generator: torch.Generator,
                   length: int = SHAKESPEARE_WINDOW) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - length, (n,), generator=generator)
    return torch.stack([ids[s:s + length] for s in starts.tolist()])
