"""Notebook 08's `kv_cache_bytes(cfg, batch, seq_len, dtype)`: the KV cache's memory, judged
against caches that were measured, not against a formula.

In the kernel, the learner's own `forward_with_cache` fills a cache for `seq_len` tokens and its
tensors' bytes are counted. The judge counts the course's cache for the same model and tokens,
and scales the count to the asked dtype by its element size. Hidden cases use another config
(with d_model != n_heads * d_head, so that using d_model shows), batch and dtypes.
"""
from __future__ import annotations

import torch

from graders.exercises.nb08.reference import forward_with_cache
from graders.exercises.common.small_models import cache_config, seeded_model
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, recorded_text, run_learner, text_record
from graders.reference.config import Config

DTYPES = (torch.float32, torch.bfloat16, torch.float64)
SIZE_FORBIDDEN = Forbidden(
    "the cache size", source_words=[".numel", ".nbytes", "forward_with_cache", ".forward_with_cache"],
    instead="from the config's sizes, without building a cache",
    notebook_wide=False)   # 08's beam search counts candidates with .numel; its KV cache is forward_with_cache


def size_config(case: Case) -> Config:
    """The checks' model: 08's KV-cache model for seed 0, otherwise one whose heads do not add
    up to d_model."""
    if case.seed == 0:
        return cache_config()
    return Config(d_vocab=500, n_ctx=64, d_model=40, n_layers=3, n_heads=3, d_head=8, d_mlp=80,
                  init_range=0.3)


def _tokens(case: Case, cfg: Config) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, (case.batch, case.seq),
                         generator=torch.Generator().manual_seed(case.seed + 300))


def cache_bytes(cache) -> int:
    """Bytes held by every tensor in a cache (any nesting of lists, tuples and dicts)."""
    if isinstance(cache, torch.Tensor):
        return cache.numel() * cache.element_size()
    if isinstance(cache, dict):
        cache = list(cache.values())
    if isinstance(cache, (list, tuple)):
        return sum(cache_bytes(part) for part in cache)
    return 0


def produce(learner, case: Case, inputs: dict) -> dict:
    kv_cache_bytes, learner_forward = learner
    if not callable(kv_cache_bytes):
        raise CheckFailed(f"kv_cache_bytes: expected your function, got {kv_cache_bytes!r}.")
    cfg = size_config(case)
    outputs = {}
    for dtype in DTYPES:
        answer = run_learner("kv_cache_bytes", kv_cache_bytes, cfg, case.batch, case.seq, dtype,
                             forbidden=SIZE_FORBIDDEN)
        if isinstance(answer, torch.Tensor) and answer.numel() == 1 and not answer.is_floating_point():
            answer = int(answer)
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise CheckFailed(f"kv_cache_bytes(cfg, {case.batch}, {case.seq}, {dtype}) returned "
                              f"{answer!r}; a number of bytes is a Python int.")
        outputs[str(dtype)] = torch.tensor(answer, dtype=torch.int64)
    try:   # the learner's own cache, measured (a forward_with_cache that fails is reported, not fatal)
        _, cache = run_learner("forward_with_cache", learner_forward,
                               seeded_model(cfg, case.seed).eval(), _tokens(case, cfg))
        outputs["own_cache"] = torch.tensor(cache_bytes(cache), dtype=torch.int64)
    except Exception as failure:   # noqa: BLE001  (its own check reports it; here it is a note)
        outputs["own_cache_error"] = text_record(str(failure).splitlines()[0][:300])
    return outputs


def measured(case: Case) -> int:
    """Bytes of the course's float32 cache for this case."""
    cfg = size_config(case)
    with torch.no_grad():
        _, cache = forward_with_cache(seeded_model(cfg, case.seed).eval(), _tokens(case, cfg))
    return cache_bytes(cache)


def size_mistakes(cfg: Config, batch: int, seq: int, element: int) -> dict[str, int]:
    heads = cfg.n_heads * cfg.d_head
    right = 2 * cfg.n_layers * batch * seq * heads * element
    return {
        Mistake("keys_only", "only the keys are counted: the cache holds keys and values, two tensors per "
                "layer"): right // 2,
        Mistake("one_layer", "one layer is counted: every layer has its own keys and values"): right // cfg.n_layers,
        Mistake("bits_not_bytes", "bits, not bytes: an element of this dtype takes dtype's bits / 8 bytes"):
            right * 8,
        Mistake("batch_left_out", "the batch is left out: every sequence of the batch has its own cache"):
            right // batch,
        Mistake("d_model_width", "d_model is used for the keys' width: a layer caches n_heads * d_head numbers "
                "per position for the keys (and as many for the values)"):
            2 * cfg.n_layers * batch * seq * cfg.d_model * element,
    }


def judge(case: Case, outputs: dict) -> None:
    cfg, floats = size_config(case), measured(case) // 4   # the course's cache is float32
    where = f"kv_cache_bytes(cfg, batch={case.batch}, seq_len={case.seq}, dtype={{}}) for {_short(cfg)}"
    own = int(outputs["own_cache"]) if "own_cache" in outputs else None
    for dtype in DTYPES:
        element = torch.empty((), dtype=dtype).element_size()
        got, right = int(outputs[str(dtype)]), floats * element
        if got == right:
            continue
        message = f"{where.format(dtype)} = {got:,}: not the size of the cache for those tokens."
        key = None
        if dtype != torch.float32 and got == floats * 4:
            message += f" Likely mistake: the dtype is ignored: {dtype} takes {element} bytes per number."
            key = "dtype_ignored"
        else:
            named = [why for why, value in size_mistakes(cfg, case.batch, case.seq, element).items() if value == got]
            if named:   # several when the sizes coincide (e.g. 2 layers: keys only = one layer)
                message += f" Likely mistake: {' Or: '.join(named)}."
                key = mistake_key(named[0])      # the first named counts it
        if own is not None and got == own * element // 4 and own != floats * 4:
            message += (" It matches the cache your forward_with_cache builds, which holds another "
                        "amount than a KV cache needs: fix forward_with_cache first (its check above).")
        elif "own_cache_error" in outputs:
            message += (" (Your forward_with_cache could not be measured: "
                        f"{recorded_text(outputs['own_cache_error'])})")
        raise CheckFailed(message, mistake=key)


def _short(cfg: Config) -> str:
    return (f"n_layers={cfg.n_layers}, n_heads={cfg.n_heads}, d_head={cfg.d_head}, "
            f"d_model={cfg.d_model}")


cache_size = Exercise("08_sampling", "kv_cache_bytes", produce, judge,
                      defaults={"text": None, "seq": 20}, forbidden=(SIZE_FORBIDDEN,))
check_kv_cache_bytes = cache_size.checker(
    "Grade `kv_cache_bytes(cfg, batch, seq_len, dtype)` against measured caches "
    "(call it with your forward_with_cache as well).",
    learner=lambda kv_cache_bytes, forward_with_cache: (kv_cache_bytes, forward_with_cache))
