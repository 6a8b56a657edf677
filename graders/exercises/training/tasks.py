"""The two training tasks of notebook 07, as the grader defines them: the reversal task and tiny
Shakespeare (sizes, step budgets, data)."""
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
SHAKESPEARE_WINDOW = 64
SHAKESPEARE_BATCH = 16
SHAKESPEARE_LR = 2e-3
SHAKESPEARE_STEPS = 20            # the graded run (a hidden test); see judge_shakespeare
ABOVE_UNIGRAM = 1.0               # nats: the bar is the unigram entropy + this
N_VAL_WINDOWS = 128
SMOKE_STEPS = 4                   # the visible check; see judge_shakespeare_smoke
SMOKE_BELOW_UNIFORM = 1.5
N_SMOKE_VAL_WINDOWS = 32


def shakespeare_config() -> Config:
    return Config(d_vocab=50257, n_ctx=SHAKESPEARE_WINDOW, d_model=256, n_layers=2, n_heads=4,
                  d_head=64, d_mlp=1024)


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
