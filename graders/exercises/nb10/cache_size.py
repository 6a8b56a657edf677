"""Notebook 10's `kv_cache_bytes(cfg, batch, seq_len, dtype)` with grouped-query attention, judged
against caches that were measured, not against a formula: the course's decoder (reference.py)
fills a float32 cache for the case's tokens, its tensors' bytes are counted and scaled to the
asked dtype. The configs have d_model != n_heads * d_head and n_kv_heads < n_heads, so that
using d_model or n_heads shows.
"""
from __future__ import annotations

import torch

from graders.exercises.nb10 import reference as ref
from graders.exercises.nb10.norm_mlp import NOTEBOOK
from graders.exercises.nb08.cache_size import DTYPES, cache_bytes
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner

FORBIDDEN = Forbidden("the cache size", source_words=[".numel", ".nbytes"],
                      instead="from the config's sizes, without building a cache", notebook_wide=False)


def size_config(case: Case) -> ref.ModernConfig:
    """Two KV heads of eight for seed 0; otherwise one KV head (multi-query) of six."""
    if case.seed == 0:
        return ref.ModernConfig(d_model=48, n_layers=3, n_heads=8, n_kv_heads=2, d_head=8, d_mlp=64, d_vocab=100)
    return ref.ModernConfig(d_model=40, n_layers=2, n_heads=6, n_kv_heads=1, d_head=12, d_mlp=64, d_vocab=100)


def produce(kv_cache_bytes, case: Case, inputs: dict) -> dict:
    cfg, outputs = size_config(case), {}
    for dtype in DTYPES:
        answer = run_learner("kv_cache_bytes", kv_cache_bytes, cfg, case.batch, case.seq, dtype, forbidden=FORBIDDEN)
        if isinstance(answer, torch.Tensor) and answer.numel() == 1 and not answer.is_floating_point():
            answer = int(answer)
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise CheckFailed(f"kv_cache_bytes(cfg, {case.batch}, {case.seq}, {dtype}) returned {answer!r}; "
                              "a number of bytes is a Python int.")
        outputs[str(dtype)] = torch.tensor(answer, dtype=torch.int64)
    return outputs


def measured(case: Case) -> int:
    """Bytes of the course decoder's float32 cache for this case's tokens."""
    cfg = size_config(case)
    tokens = torch.randint(0, cfg.d_vocab, (case.batch, case.seq), generator=torch.Generator().manual_seed(case.seed))
    with torch.no_grad(), torch.random.fork_rng():   # its random weights: the global generator is left as it was
        torch.manual_seed(case.seed)
        _, cache = ref.ModernDecoder(cfg).eval()(tokens)
    return cache_bytes(cache)


def _element(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def size_mistakes(cfg: ref.ModernConfig, batch: int, seq: int, element: int) -> dict[str, int]:
    """What each mistake in the cache's shape answers, for numbers of `element` bytes ("" is right)."""
    per_head = 2 * cfg.n_layers * batch * seq * cfg.d_head * element
    return {
        "": per_head * cfg.n_kv_heads,
        Mistake("n_heads_not_n_kv_heads", "n_heads is used: the cache holds the keys and values of the n_kv_heads "
                "KV heads only (that is what grouped-query attention saves)"): per_head * cfg.n_heads,
        Mistake("keys_only", "only the keys are counted: the cache holds keys and values, two tensors per layer"):
            per_head * cfg.n_kv_heads // 2,
        Mistake("one_layer", "one layer is counted: every layer has its own keys and values"):
            per_head * cfg.n_kv_heads // cfg.n_layers,
        Mistake("no_batch", "the batch is left out: every sequence of the batch has its own cache"):
            per_head * cfg.n_kv_heads // batch,
        Mistake("d_model_for_width", "d_model is used for the keys' width: a layer caches n_kv_heads * d_head "
                "numbers per position for the keys (and as many for the values)"): per_head // cfg.d_head * cfg.d_model,
    }


def element_mistakes() -> dict[str, callable]:
    """How an answer may size one number of each dtype, by the mistake it is ("" is right)."""
    found = {"": _element,
             Mistake("bits_not_bytes", "bits, not bytes: an element of this dtype takes dtype's bits / 8 bytes"):
                 lambda d: 8 * _element(d)}
    for size in (1, 2, 4, 8):
        found[Mistake("dtype_ignored", f"the dtype is ignored: every number is counted as {size} "
                      f"byte{'s' if size > 1 else ''}, whatever the dtype (float32 takes 4, bfloat16 2, "
                      "float64 8)")] = \
            lambda d, size=size: size
    return found


def explained(cfg: ref.ModernConfig, batch: int, seq: int, answers: dict) -> list[str]:
    """The fewest mistakes, in the cache's shape and in the size of a number, that give every
    dtype's answer at once: a factor that shows in one dtype only (2 bytes a number, or keys
    only, are both half of float32's) is told apart by the others."""
    found = [[m for m in (shaped, sized) if m] for sized, element in element_mistakes().items()
             for shaped in size_mistakes(cfg, batch, seq, 1)
             if all(size_mistakes(cfg, batch, seq, element(d))[shaped] == got for d, got in answers.items())]
    return min(found, key=len, default=[])   # one mistake before two that happen to agree


def judge(case: Case, outputs: dict) -> None:
    cfg, floats = size_config(case), measured(case) // 4   # the course's cache is float32
    answers = {dtype: int(outputs[str(dtype)]) for dtype in DTYPES}
    wrong = [dtype for dtype in DTYPES if answers[dtype] != floats * _element(dtype)]
    if not wrong:
        return
    dtype = wrong[0]
    message = (f"kv_cache_bytes(cfg, batch={case.batch}, seq_len={case.seq}, dtype={dtype}) = {answers[dtype]:,} "
               f"for n_layers={cfg.n_layers}, n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads}, "
               f"d_head={cfg.d_head}, d_model={cfg.d_model}: not the size of the cache for those tokens.")
    named = explained(cfg, case.batch, case.seq, answers)
    if named:
        message += f" Likely mistake: {'. And: '.join(named)}."
    # Two mistakes at once: their keys joined by "_and_".
    raise CheckFailed(message, mistake="_and_".join(mistake_key(m) for m in named) if named else None)


exercise = Exercise(NOTEBOOK, "kv_cache_bytes", produce, judge, forbidden=(FORBIDDEN,),
                    defaults={"text": None, "batch": 1, "seq": 20})
check_kv_cache_bytes = exercise.checker(
    "Grade `kv_cache_bytes(cfg, batch, seq_len, dtype)` for grouped-query attention against measured caches.")
