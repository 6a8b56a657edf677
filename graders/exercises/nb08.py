"""Grader for 08_sampling: logit transforms, samplers, generation, beam search and the KV cache.

Deterministic by construction, never flaky: every input comes from a fixed seed; a transform is
judged by the exact set of tokens it keeps and, within the course tolerance, by the
distribution it leaves (softmax of its logits, so shifting every logit of a row by a constant
is not a mistake); a sampler is judged from many draws made with a generator the grader seeds,
so the same code gets the same verdict on every run.
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from graders.common import Case, Exercise, rand_float
from graders.config import Config
from graders.engine import (CheckFailed, check_shape, close, compare, judge_generator_use,
                             require_tensor, run_learner)

DIMS = ("batch", "d_vocab")
VOCAB = 50                       # vocabulary of the fixed logit batches
NEG_INF = float("-inf")


# --- The course's reference implementations ------------------------------------------------------

def greedy_search(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def token_counts(input_ids: torch.Tensor, d_vocab: int) -> torch.Tensor:
    """How often each vocabulary token occurs in each row of `input_ids`: [batch, d_vocab]."""
    counts = torch.zeros(input_ids.shape[0], d_vocab, dtype=torch.long)
    return counts.scatter_add(1, input_ids, torch.ones_like(input_ids))


def apply_frequency_penalty(input_ids: torch.Tensor, logits: torch.Tensor, freq_penalty: float):
    return logits - freq_penalty * token_counts(input_ids, logits.shape[-1]).to(logits.dtype)


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep every token whose logit is at least the k-th largest (ties at the k-th all stay)."""
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens until their total probability reaches top_p (at least one)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= top_p
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def sample_basic(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]


def next_token_logits(input_ids, logits, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
    """The logits `sample_next_token` draws from: penalty, temperature, top-k, then top-p."""
    logits = apply_frequency_penalty(input_ids, logits, freq_penalty)
    logits = apply_temperature(logits, temperature)
    if top_k > 0:
        logits = apply_top_k(logits, top_k)
    if top_p < 1.0:
        logits = apply_top_p(logits, top_p)
    return logits


def sample_next_token(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0,
                      freq_penalty=0.0):
    if temperature == 0.0:
        return greedy_search(apply_frequency_penalty(input_ids, logits, freq_penalty))
    return sample_basic(next_token_logits(input_ids, logits, temperature, top_k, top_p,
                                          freq_penalty), generator)


@torch.no_grad()
def generate(model, input_ids, max_new_tokens, generator, eos_token_id=None, use_cache=False,
             **sampling):
    """Sample up to `max_new_tokens`, cropping the context to the model's n_ctx.

    With `use_cache` (the notebook's demos, for speed) each step feeds only the newest token
    through `forward_with_cache`; the context cannot be cropped then, so it must fit n_ctx.
    """
    if use_cache and input_ids.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"with use_cache the prompt ({input_ids.shape[1]} tokens) plus "
                         f"max_new_tokens ({max_new_tokens}) must fit the context "
                         f"({model.cfg.n_ctx}); ask for fewer tokens or use_cache=False")
    tokens, cache = input_ids, None
    for _ in range(max_new_tokens):
        if use_cache:
            logits, cache = forward_with_cache(model, tokens if cache is None else tokens[:, -1:], cache)
            logits = logits[:, -1]
        else:
            logits = model(tokens[:, -model.cfg.n_ctx:])[:, -1]
        new = sample_next_token(tokens, logits, generator, **sampling)
        tokens = torch.cat([tokens, new[:, None]], dim=-1)
        if eos_token_id is not None and bool((new == eos_token_id).all()):
            break
    return tokens


@torch.no_grad()
def beam_search(model, input_ids, num_beams, max_new_tokens):
    """The `num_beams` best continuations (best first) and their total log-probabilities."""
    beams, scores = input_ids, torch.zeros(1, dtype=torch.float64)
    for _ in range(max_new_tokens):
        log_probs = model(beams)[:, -1].double().log_softmax(dim=-1)        # [beams, d_vocab]
        candidates = (scores[:, None] + log_probs).flatten()
        scores, best = candidates.topk(min(num_beams, len(candidates)))
        beam, token = best // log_probs.shape[-1], best % log_probs.shape[-1]
        beams = torch.cat([beams[beam], token[:, None]], dim=-1)
    return beams, scores


def attention_with_cache(attn, x, past, position_bug=False):
    """Attention over the cached keys/values plus the new positions: (out, (keys, values))."""
    q = torch.einsum("bpd,ndh->bpnh", x, attn.W_Q) + attn.b_Q
    k = torch.einsum("bpd,ndh->bpnh", x, attn.W_K) + attn.b_K
    v = torch.einsum("bpd,ndh->bpnh", x, attn.W_V) + attn.b_V
    if past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    scores = torch.einsum("bqnh,bknh->bnqk", q, k) / math.sqrt(attn.W_Q.shape[-1])
    n_new, n_all = q.shape[1], k.shape[1]
    offset = 0 if position_bug else n_all - n_new
    future = torch.arange(n_all)[None, :] > torch.arange(n_new)[:, None] + offset
    pattern = scores.masked_fill(future, NEG_INF).softmax(dim=-1)
    z = torch.einsum("bnqk,bknh->bqnh", pattern, v)
    return torch.einsum("bqnh,nhd->bqd", z, attn.W_O) + attn.b_O, (k, v)


def forward_with_cache(model, new_tokens, cache=None, mistake: str = ""):
    """Logits of the new positions given a cache of the earlier ones: (logits, new cache).

    `mistake` computes what a known wrong cache does (for diagnosis): "offset" embeds the new
    tokens at positions 0.. instead of after the cached ones, "no_append" never adds to the
    cache, "mask" builds the causal mask as if the new positions started at 0.
    """
    past_len = 0 if cache is None else cache[0][0].shape[1]
    start = 0 if mistake == "offset" else past_len
    residual = model.embed(new_tokens) + model.pos_embed.W_pos[start:start + new_tokens.shape[1]]
    new_cache = []
    for i, block in enumerate(model.blocks):
        past = None if cache is None else cache[i]
        attn_out, kv = attention_with_cache(block.attn, block.ln1(residual), past,
                                            position_bug=mistake == "mask")
        residual = residual + attn_out
        residual = residual + block.mlp(block.ln2(residual))
        new_cache.append(past if mistake == "no_append" and past is not None else kv)
    return model.unembed(model.ln_final(residual)), new_cache


@torch.no_grad()
def generate_with_cache(model, input_ids, max_new_tokens, mistake: str = ""):
    """Greedy generation that feeds each new token alone, reusing the cache."""
    logits, cache = forward_with_cache(model, input_ids, None, mistake)
    tokens = input_ids
    for _ in range(max_new_tokens):
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, new], dim=-1)
        logits, cache = forward_with_cache(model, new, cache, mistake)
    return tokens


# --- Models the checks run on ------------------------------------------------------------------

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


def _seeded_model(cfg: Config, seed: int):
    from graders.components import DemoTransformer

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return DemoTransformer(cfg).eval()


def sampling_config() -> Config:
    """A 1-layer model whose context (16) is shorter than prompt + new tokens."""
    return Config(d_vocab=300, n_ctx=16, d_model=32, n_layers=1, n_heads=2, d_head=16, d_mlp=64,
                  init_range=0.3)


def cache_config() -> Config:
    """A 2-layer model for the KV-cache checks. init_range 0.3 spreads its logits, so greedy
    choices are decided by margins far above rounding error (no near-ties)."""
    return Config(d_vocab=1000, n_ctx=128, d_model=64, n_layers=2, n_heads=4, d_head=16,
                  d_mlp=256, init_range=0.3)


# --- Judging transformed logits ------------------------------------------------------------------

def _probs(logits: torch.Tensor) -> torch.Tensor:
    return logits.double().softmax(dim=-1)


def _looks_like_probabilities(x: torch.Tensor) -> bool:
    x = x.double()
    return bool(torch.isfinite(x).all() and (x >= 0).all() and (x <= 1).all()
                and (x.sum(-1) <= 1 + 1e-4).all())


def _token_list(ids: torch.Tensor) -> str:
    shown = ids.tolist()[:10]
    return ", ".join(map(str, shown)) + (" ..." if len(ids) > 10 else "")


def judge_logits(what: str, actual, expected: torch.Tensor, mistakes: dict, hint: str = "") -> None:
    """The tokens kept must be exactly the reference's; their probabilities must match."""
    check_shape(what, actual, expected.shape, DIMS)
    if not actual.is_floating_point():
        raise CheckFailed(f"{what}: dtype {actual.dtype}; return floating-point logits.")
    actual = actual.double()
    if torch.isnan(actual).any():
        raise CheckFailed(f"{what}: contains NaN (e.g. inf - inf, or 0 * inf). Removed tokens "
                          "should be set to -inf with masked_fill, not computed arithmetically.")
    if (actual == NEG_INF).all(-1).any():
        row = int((actual == NEG_INF).all(-1).nonzero()[0])
        raise CheckFailed(f"{what}: row {row} has every token removed (all -inf), so nothing can "
                          "be sampled. A filter must always keep at least the most likely token.")
    kept, kept_expected = _probs(actual) > 0, _probs(expected) > 0

    def same(x, kept_x, y, kept_y):
        return torch.equal(kept_x, kept_y) and close(_probs(x).float(), _probs(y))

    if same(actual, kept, expected, kept_expected):
        return
    for description, wrong in mistakes.items():
        if same(actual, kept, wrong, _probs(wrong) > 0):
            raise CheckFailed(f"{what} does not match the reference.\n  Likely mistake: "
                              f"{description}" + (f"\n  Hint: {hint}" if hint else ""))
    if _looks_like_probabilities(actual) and not _looks_like_probabilities(expected):
        raise CheckFailed(f"{what}: returned what looks like probabilities (values in [0, 1] "
                          "summing to at most 1). Return logits: leave the kept logits as they "
                          "are and set removed tokens to -inf; the sampler applies the softmax.")
    if not torch.equal(kept, kept_expected):
        row = int((kept != kept_expected).any(-1).nonzero()[0])
        extra = (kept[row] & ~kept_expected[row]).nonzero().flatten()
        missing = (~kept[row] & kept_expected[row]).nonzero().flatten()
        lines = [f"{what}: keeps the wrong tokens. In row {row} it keeps {int(kept[row].sum())} "
                 f"tokens, the reference keeps {int(kept_expected[row].sum())}."]
        if len(extra):
            lines.append(f"  kept but should be removed (-inf): token ids {_token_list(extra)}")
        if len(missing):
            lines.append(f"  removed but should be kept: token ids {_token_list(missing)}")
        for description, wrong in mistakes.items():
            if torch.equal(kept, _probs(wrong) > 0):
                lines.append(f"  Likely mistake: {description}")
                break
        if hint:
            lines.append(f"  Hint: {hint}")
        raise CheckFailed("\n".join(lines))
    compare(f"{what} (compared as probabilities: the softmax of your logits)",
            _probs(actual).float(), _probs(expected), DIMS, hint=hint)


def _run_transform(what: str, fn, cases: list[tuple[str, tuple]]) -> dict:
    """Run `fn(*args)` on each case, recording its output and whether it changed its inputs."""
    outputs = {}
    for key, args in cases:
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        outputs[key] = run_learner(what, fn, *copies)
        require_tensor(f"{what} on case {key}", outputs[key])
        outputs[f"{key}_modified"] = torch.tensor(any(
            isinstance(a, torch.Tensor) and not torch.equal(a, c) for a, c in zip(args, copies)))
    return outputs


def _no_in_place(what: str, outputs: dict, cases) -> None:
    for key, _ in cases:
        if bool(outputs[f"{key}_modified"]):
            raise CheckFailed(f"{what}: modified the tensor it was given in place (e.g. "
                              "masked_fill_ or -=). Return a new tensor; callers reuse their logits.")


def transform_exercise(name: str, cases, reference, mistakes, signature, hint: str) -> Exercise:
    """An exercise for a logit transform `name(*args)`: the learner's function runs on each of
    `cases(case)` ((key, args) pairs), and each output is judged against `reference(*args)`
    with `mistakes(*args)` named; `signature(*args)` describes the call in messages."""
    def produce(fn, case: Case) -> dict:
        return _run_transform(name, fn, cases(case))

    def judge(case: Case, outputs: dict) -> None:
        chosen = cases(case)
        _no_in_place(name, outputs, chosen)
        for key, args in chosen:
            judge_logits(f"{name}({signature(*args)})", outputs[key], reference(*args),
                         mistakes(*args), hint=hint)

    return Exercise(name, produce, judge)


def _logits(seed: int, batch: int, scale: float = 3.0, vocab: int = VOCAB) -> torch.Tensor:
    return scale * rand_float(seed, batch, vocab)


# --- Exercise: greedy search --------------------------------------------------------------------

def _greedy_cases(case: Case):
    return [("main", (_logits(case.seed, max(case.batch, 4)),)),
            ("one", (_logits(case.seed + 1, 1),))]


def produce_greedy(fn, case: Case) -> dict:
    return _run_transform("greedy_search", fn, _greedy_cases(case))


def judge_greedy(case: Case, outputs: dict) -> None:
    cases = _greedy_cases(case)
    _no_in_place("greedy_search", outputs, cases)
    for key, (logits,) in cases:
        out, where = outputs[key], f"greedy_search(logits of shape {list(logits.shape)})"
        check_shape(where, out, (logits.shape[0],), ("batch",))
        if out.dtype != torch.long:
            raise CheckFailed(f"{where}: dtype {out.dtype}; return token ids (torch.long): the "
                              "index of the largest logit, not its value.")
        expected = greedy_search(logits)
        if not torch.equal(out, expected):
            why = ""
            if torch.equal(out, logits.argmin(-1)):
                why = " Likely mistake: argmin instead of argmax."
            elif logits.shape[0] > 1 and torch.equal(out[:1], logits.argmax(0)[:1]):
                why = " Likely mistake: argmax over the batch dimension (use dim=-1, the vocabulary)."
            raise CheckFailed(f"{where}: returned {out.tolist()}, expected the most likely token "
                              f"of each row, {expected.tolist()}.{why}")


greedy_exercise = Exercise("greedy_search", produce_greedy, judge_greedy)


def check_greedy(fn, **case) -> None:
    """Grade `greedy_search(logits) -> token ids`."""
    greedy_exercise.check(fn, **{"text": None, **case})


# --- Exercise: temperature ------------------------------------------------------------------------

def _temperature_cases(case: Case):
    logits = _logits(case.seed + 10, max(case.batch, 3))
    return [(f"t{i}", (logits, t)) for i, t in enumerate((2.0, 0.5, 1e-3))]


def temperature_mistakes(logits, t) -> dict:
    return {
        "multiplying by the temperature: divide, so that a low temperature sharpens": logits * t,
        "temperature applied after softmax: divide the LOGITS by the temperature, then let the "
        "sampler take the softmax": logits.softmax(-1) / t,
        "the temperature is subtracted: divide the logits by it": logits - t,
    }


temperature_exercise = transform_exercise(
    "apply_temperature", _temperature_cases, apply_temperature, temperature_mistakes,
    lambda logits, t: f"logits, temperature={t}", hint="return logits / temperature.")


def check_temperature(fn, **case) -> None:
    """Grade `apply_temperature(logits, temperature)`."""
    temperature_exercise.check(fn, **{"text": None, **case})


# --- Exercise: frequency penalty ------------------------------------------------------------------

def _penalty_cases(case: Case):
    batch = max(case.batch, 2)
    generator = torch.Generator().manual_seed(case.seed + 20)
    # Few distinct tokens per row, so that most are repeated and many vocabulary ids unseen.
    input_ids = torch.randint(0, 12, (batch, 15), generator=generator) + 5 * torch.arange(batch)[:, None]
    logits = _logits(case.seed + 21, batch)
    return [(f"p{i}", (input_ids, logits, penalty)) for i, penalty in enumerate((1.0, 0.35))]


def penalty_mistakes(input_ids, logits, penalty) -> dict:
    counts = token_counts(input_ids, logits.shape[-1]).to(logits.dtype)
    whole_batch = counts.sum(0, keepdim=True).expand_as(counts)
    return {
        "each token seen is penalised once (a presence penalty): subtract the penalty times the "
        "NUMBER of times the token occurs": logits - penalty * (counts > 0).to(logits.dtype),
        "tokens are counted over the whole batch: count each row's own tokens":
            logits - penalty * whole_batch,
        "the penalty is added: subtract it, to make repeated tokens less likely":
            logits + penalty * counts,
        "the logits are divided by the counts: subtract penalty * count":
            logits / (1 + penalty * counts),
    }


penalty_exercise = transform_exercise(
    "apply_frequency_penalty", _penalty_cases, apply_frequency_penalty, penalty_mistakes,
    lambda input_ids, logits, penalty: f"input_ids, logits, freq_penalty={penalty}",
    hint="count each token in its own row (torch.bincount or scatter_add) and subtract "
         "freq_penalty * count from its logit.")


def check_frequency_penalty(fn, **case) -> None:
    """Grade `apply_frequency_penalty(input_ids, logits, freq_penalty)`."""
    penalty_exercise.check(fn, **{"text": None, **case})


# --- Exercise: top-k ------------------------------------------------------------------------------

def _top_k_cases(case: Case):
    logits = _logits(case.seed + 30, max(case.batch, 3))
    k = 5
    # Row 0 has a tie at the k-th largest value: both tied tokens must stay.
    order = logits[0].argsort(descending=True)
    logits[0, order[k]] = logits[0, order[k - 1]]
    return [("k", (logits, k)), ("k1", (logits, 1)), ("kall", (logits, VOCAB))]


def top_k_mistakes(logits, k) -> dict:
    ranked = logits.sort(dim=-1, descending=True, stable=True).indices

    def keep_first(n):
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, ranked[:, :max(n, 1)], True)
        return logits.masked_fill(~keep, NEG_INF)

    return {
        "ties at the k-th largest value are broken (torch.topk + scatter keeps exactly k): keep "
        "EVERY token whose logit is >= the k-th largest, so the result does not depend on the "
        "order of tied tokens": keep_first(k),
        "one token too few: the k-th largest must stay (remove only logits < the k-th value)":
            logits.masked_fill(logits <= logits.topk(k, -1).values[..., -1:], NEG_INF)
            if k > 1 else keep_first(0),
        "one token too many: keep the k largest, not k + 1": keep_first(k + 1),
        "the k SMALLEST logits are kept: keep the largest":
            logits.masked_fill(logits > (-logits).topk(k, -1).values[..., -1:].neg(), NEG_INF),
    }


top_k_exercise = transform_exercise(
    "apply_top_k", _top_k_cases, apply_top_k, top_k_mistakes, lambda logits, k: f"logits, k={k}",
    hint="kth = logits.topk(k).values[..., -1:]; set logits < kth to -inf.")


def check_top_k(fn, **case) -> None:
    """Grade `apply_top_k(logits, k)` (includes a tie at the k-th value, k = 1 and k = vocab)."""
    top_k_exercise.check(fn, **{"text": None, **case})


# --- Exercise: top-p ------------------------------------------------------------------------------

def _clear_p(logits: torch.Tensor, candidates) -> float:
    """The first p in `candidates` at least 1e-3 away from every row's cumulative probabilities,
    so that the nucleus is decided far above fp32 rounding error (~1e-7)."""
    cumulative = logits.double().softmax(-1).sort(-1, descending=True).values.cumsum(-1)
    return next(p for p in candidates if bool(((cumulative - p).abs() > 1e-3).all()))


def _top_p_cases(case: Case):
    batch = max(case.batch, 3)
    logits = _logits(case.seed + 40, batch)
    gentle = _logits(case.seed + 41, batch, scale=2.0)
    mid = _clear_p(logits, [0.5 + 0.013 * i for i in range(30)])
    high = _clear_p(logits, [0.9 + 0.003 * i for i in range(30)])
    return [("mid", (logits, mid)), ("high", (logits, high)),
            ("tiny", (logits, 1e-4)), ("one", (gentle, 1.0))]


def top_p_mistakes(logits, p) -> dict:
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    cumulative = probs.cumsum(-1)

    def keep_sorted(keep):
        keep = keep.clone()
        keep[..., 0] |= True
        return logits.masked_fill(~keep.scatter(-1, order, keep), NEG_INF)

    return {
        "one token too few: the token that takes the total past top_p must be kept too (keep a "
        "token while the probability BEFORE it is < top_p)": keep_sorted(cumulative < p),
        "one token too many: stop at the first token that brings the total to top_p":
            keep_sorted(((cumulative - probs) < p).roll(1, -1) | ((cumulative - probs) < p)),
        "the least likely tokens are kept (sorted in ascending order): sort descending":
            logits.masked_fill(~_ascending_keep(logits, p), NEG_INF),
    }


def _ascending_keep(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=False, stable=True)
    probs = sorted_logits.softmax(-1)
    keep = (probs.cumsum(-1) - probs) < p
    return keep.scatter(-1, order, keep)


top_p_exercise = transform_exercise(
    "apply_top_p", _top_p_cases, apply_top_p, top_p_mistakes,
    lambda logits, p: f"logits, top_p={p:.4g}",
    hint="sort descending, cumulative probabilities; keep a token while the total BEFORE it is "
         "< top_p (the top token always stays).")


def check_top_p(fn, **case) -> None:
    """Grade `apply_top_p(logits, top_p)` (includes top_p = 1.0 and a tiny top_p)."""
    top_p_exercise.check(fn, **{"text": None, **case})


# --- Judging samples by their distribution -------------------------------------------------------

DRAWS = 6000              # draws per distribution
P_VALUE_FLOOR = 1e-6      # a correct sampler fails this with probability 1e-6 per seed; the seed is
                          # fixed, so a given sampler passes or fails on every run alike


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of observed `counts` under `probs` (Pearson's chi-square over possible tokens)."""
    possible = probs > 0
    expected = probs[possible].double() * counts.sum()
    statistic = ((counts[possible].double() - expected) ** 2 / expected).sum()
    dof = int(possible.sum()) - 1
    if dof == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


def judge_draws(what: str, draws: torch.Tensor, probs: torch.Tensor, mistakes: dict) -> None:
    """`draws` [n_rows, DRAWS] against each row's distribution `probs` [n_rows, d_vocab]."""
    d_vocab = probs.shape[-1]
    if draws.dtype != torch.long:
        raise CheckFailed(f"{what}: dtype {draws.dtype}; return token ids as torch.long.")
    if int(draws.min()) < 0 or int(draws.max()) >= d_vocab:
        raise CheckFailed(f"{what}: token ids range over [{int(draws.min())}, {int(draws.max())}]; "
                          f"they must be in [0, {d_vocab - 1}].")
    counts = torch.stack([torch.bincount(row, minlength=d_vocab) for row in draws])
    for row, impossible in enumerate((counts > 0) & (probs == 0)):
        if impossible.any():
            raise CheckFailed(f"{what}: drew token ids {_token_list(impossible.nonzero().flatten())} "
                              f"which have probability 0 (they were filtered out) in distribution "
                              f"{row}. A -inf logit must never be drawn."
                              + _likely_mistake(counts[row], row, mistakes))
    for row, (row_counts, row_probs) in enumerate(zip(counts, probs)):
        p_value = chi_square_p_value(row_counts, row_probs)
        if p_value < P_VALUE_FLOOR:
            top = row_probs.argsort(descending=True)[:5].tolist()
            raise CheckFailed(
                f"{what}: {DRAWS} draws (fixed seed) do not follow distribution {row} (chi-square "
                f"p-value {p_value:.2g} < {P_VALUE_FLOOR:g}). Most likely tokens {top}: expected "
                f"frequencies {[round(float(row_probs[t]), 3) for t in top]}, drawn "
                f"{[round(int(row_counts[t]) / DRAWS, 3) for t in top]}."
                + _likely_mistake(row_counts, row, mistakes))


def _likely_mistake(counts: torch.Tensor, row: int, mistakes: dict) -> str:
    """The first named mistake whose distribution the draws do follow, as a message line."""
    for description, wrong in mistakes.items():
        if not ((counts > 0) & (wrong[row] == 0)).any() and \
                chi_square_p_value(counts, wrong[row]) >= P_VALUE_FLOOR:
            return f"\n  Likely mistake: {description}"
    return ""


def _repeat_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """Each row of `x` repeated n times in a row: [rows * n, ...]."""
    return x.repeat_interleave(n, dim=0)


# --- Exercise: the basic sampler -------------------------------------------------------------------

def _sampler_logits(case: Case) -> torch.Tensor:
    logits = _logits(case.seed + 50, 3, scale=1.5, vocab=8)
    logits[1, [2, 5]] = NEG_INF                  # filtered-out tokens: never to be drawn
    return logits


def produce_sampler(fn, case: Case) -> dict:
    logits = _repeat_rows(_sampler_logits(case), DRAWS)
    what = "sample_basic"
    state = torch.get_rng_state()
    outputs = {"a": run_learner(what, fn, logits.clone(), torch.Generator().manual_seed(case.seed)),
               "a_again": run_learner(what, fn, logits.clone(), torch.Generator().manual_seed(case.seed)),
               "b": run_learner(what, fn, logits.clone(), torch.Generator().manual_seed(case.seed + 1)),
               "one": run_learner(what, fn, logits[:1].clone(), torch.Generator().manual_seed(case.seed))}
    outputs["global_rng_used"] = torch.tensor(not torch.equal(state, torch.get_rng_state()))
    torch.set_rng_state(state)
    for key in ("a", "a_again", "b", "one"):
        require_tensor(f"sample_basic(logits of shape {list(logits.shape)}, generator)", outputs[key])
    return outputs


def sampler_mistakes(logits: torch.Tensor) -> dict:
    possible = logits > NEG_INF
    return {
        "sampling uniformly among the possible tokens: draw proportionally to softmax(logits)":
            possible.double() / possible.sum(-1, keepdim=True),
        "the softmax is taken twice (the sampler must apply it once, to the logits)":
            logits.double().softmax(-1).softmax(-1) * possible,
        "the logits are doubled (a temperature of 0.5 is applied)": (2 * logits.double()).softmax(-1),
    }


def judge_sampler(case: Case, outputs: dict) -> None:
    logits = _sampler_logits(case)
    n = logits.shape[0] * DRAWS
    where = f"sample_basic(logits of shape [{n}, {logits.shape[1]}], generator)"
    for key, rows in (("a", n), ("one", 1)):
        check_shape(where, outputs[key], (rows,), ("batch",))
    judge_generator_use("sample_basic", outputs, "tokens",
                        "torch.multinomial(probs, 1, generator=generator)")
    judge_draws(where, outputs["a"].reshape(logits.shape[0], DRAWS), _probs(logits),
                sampler_mistakes(logits))


sampler_exercise = Exercise("sample_basic", produce_sampler, judge_sampler)


def check_sampler(fn, **case) -> None:
    """Grade `sample_basic(logits, generator)` from many seeded draws."""
    sampler_exercise.check(fn, **{"text": None, **case})


# --- Exercise: sample_next_token (the whole pipeline) ----------------------------------------------

PIPELINE_VOCAB = 12
PIPELINES = {"all": dict(temperature=0.7, top_k=6, top_p=0.8, freq_penalty=0.8),
             "penalty": dict(temperature=1.3, freq_penalty=1.5),
             "top_p": dict(temperature=2.0, top_p=0.6)}


def _pipeline_inputs(case: Case):
    batch = max(case.batch, 2)
    generator = torch.Generator().manual_seed(case.seed + 60)
    input_ids = torch.randint(0, 4, (batch, 10), generator=generator)
    return input_ids, _logits(case.seed + 61, batch, scale=2.0, vocab=PIPELINE_VOCAB)


def pipeline_mistakes(input_ids, logits, settings) -> dict:
    t, k, p, a = (settings.get("temperature", 1.0), settings.get("top_k", 0),
                  settings.get("top_p", 1.0), settings.get("freq_penalty", 0.0))
    penalised = apply_frequency_penalty(input_ids, logits, a)
    wrong = {
        "the temperature is applied after top-k/top-p filtering (apply it before: filtering "
        "must see the tempered distribution)":
            apply_temperature(apply_top_p(apply_top_k(penalised, k) if k else penalised, p)
                              if p < 1 else (apply_top_k(penalised, k) if k else penalised), t),
        "the frequency penalty is applied after the temperature (penalise the raw logits first)":
            next_token_logits(input_ids, apply_temperature(logits, t), 1.0, k, p, a),
        "the frequency penalty is ignored": next_token_logits(input_ids, logits, t, k, p, 0.0),
        "the temperature is ignored": next_token_logits(input_ids, logits, 1.0, k, p, a),
    }
    return {d: _probs(w) for d, w in wrong.items()}


def produce_pipeline(fn, case: Case) -> dict:
    input_ids, logits = _pipeline_inputs(case)
    what = "sample_next_token"
    outputs = {}
    for key, settings in PIPELINES.items():
        outputs[key] = run_learner(what, fn, _repeat_rows(input_ids, DRAWS), _repeat_rows(logits, DRAWS),
                                   torch.Generator().manual_seed(case.seed), **settings)
    try:
        outputs["greedy"] = run_learner(what, fn, input_ids.clone(), logits.clone(),
                                        torch.Generator().manual_seed(case.seed), temperature=0.0)
    except CheckFailed as err:
        raise CheckFailed(f"{err}\n  (with temperature=0.0: temperature 0 means greedy decoding; "
                          "dividing the logits by 0 gives inf and NaN)") from None
    outputs["cold"] = run_learner(what, fn, input_ids.clone(), logits.clone(),
                                  torch.Generator().manual_seed(case.seed), temperature=1e-4)
    for key, value in outputs.items():
        require_tensor(f"sample_next_token ({key})", value)
    return outputs


def judge_pipeline(case: Case, outputs: dict) -> None:
    input_ids, logits = _pipeline_inputs(case)
    batch = logits.shape[0]
    expected = greedy_search(logits)
    for key, temperature in (("greedy", 0.0), ("cold", 1e-4)):
        where = f"sample_next_token(..., temperature={temperature})"
        check_shape(where, outputs[key], (batch,), ("batch",))
        if not torch.equal(outputs[key], expected):
            raise CheckFailed(f"{where} returned {outputs[key].tolist()}, expected the most likely "
                              f"tokens {expected.tolist()}: " + (
                                  "temperature 0 means greedy decoding (use greedy_search: "
                                  "dividing by 0 gives inf/nan)." if temperature == 0 else
                                  "a temperature near 0 makes sampling greedy. Likely mistake: "
                                  "the temperature multiplies the logits instead of dividing them."))
    for key, settings in PIPELINES.items():
        where = f"sample_next_token(..., {', '.join(f'{k}={v}' for k, v in settings.items())})"
        check_shape(where, outputs[key], (batch * DRAWS,), ("batch",))
        probs = _probs(next_token_logits(input_ids, logits, **settings))
        judge_draws(where, outputs[key].reshape(batch, DRAWS), probs,
                    pipeline_mistakes(input_ids, logits, settings))


pipeline_exercise = Exercise("sample_next_token", produce_pipeline, judge_pipeline)


def check_sample_next_token(fn, **case) -> None:
    """Grade `sample_next_token(input_ids, logits, generator, temperature, top_k, top_p,
    freq_penalty)`: greedy at temperature 0, and the sampled distribution otherwise."""
    pipeline_exercise.check(fn, **{"text": None, **case})


# --- Exercise: generate --------------------------------------------------------------------------

EOS = 7
N_NEW = 20


def _generate_inputs(case: Case):
    model = _seeded_model(sampling_config(), case.seed)
    prompt = torch.randint(0, 300, (max(case.batch, 2), 6),
                           generator=torch.Generator().manual_seed(case.seed + 70))
    chain = markov_model(case.seed + 71, 10)
    chain.table[:, EOS] = -5.0
    for a, b in ((2, 5), (5, 8), (8, 3), (3, EOS)):      # greedy from 2: 5, 8, 3, end-of-text
        chain.table[a, b] = 10.0
    return model, prompt, chain, torch.tensor([[1, 2]])


def produce_generate(fn, case: Case) -> dict:
    model, prompt, chain, chain_prompt = _generate_inputs(case)
    what = "generate"
    outputs = {}
    for key, seed, settings in (("greedy", 0, dict(temperature=0.0)),
                                ("a", 1, dict(top_k=5)), ("a_again", 1, dict(top_k=5)),
                                ("b", 2, dict(top_k=5))):
        copy = prompt.clone()
        try:
            outputs[key] = run_learner(what, fn, model, copy, N_NEW,
                                       torch.Generator().manual_seed(seed), **settings)
        except CheckFailed as err:
            if "not implemented" in str(err):
                raise
            raise CheckFailed(f"{err}\n  (the prompt plus {N_NEW} new tokens is longer than the "
                              f"model's n_ctx = {model.cfg.n_ctx}: did you crop the context to the "
                              "last n_ctx tokens before each forward pass?)") from None
        outputs[f"{key}_modified"] = torch.tensor(not torch.equal(copy, prompt))
    outputs["eos"] = run_learner(what, fn, chain, chain_prompt.clone(), 40,
                                 torch.Generator().manual_seed(3), eos_token_id=EOS, temperature=0.0)
    for key in ("greedy", "a", "a_again", "b", "eos"):
        require_tensor(f"generate ({key})", outputs[key])
    return outputs


def judge_generate(case: Case, outputs: dict) -> None:
    model, prompt, chain, chain_prompt = _generate_inputs(case)
    n_prompt = prompt.shape[1]
    for key in ("greedy", "a", "a_again", "b"):
        where = f"generate(model, prompt of shape {list(prompt.shape)}, max_new_tokens={N_NEW})"
        out = outputs[key]
        check_shape(where, out, (prompt.shape[0], n_prompt + N_NEW), ("batch", "position"))
        if out.dtype != torch.long:
            raise CheckFailed(f"{where}: dtype {out.dtype}; return token ids as torch.long.")
        if not torch.equal(out[:, :n_prompt], prompt):
            raise CheckFailed(f"{where}: the output must start with the prompt, then the new tokens.")
        if bool(outputs[f"{key}_modified"]):
            raise CheckFailed(f"{where}: the prompt tensor was modified in place.")
    expected = generate(model, prompt, N_NEW, None, temperature=0.0)
    if not torch.equal(outputs["greedy"], expected):
        first = int((outputs["greedy"] != expected).any(0).nonzero()[0]) - n_prompt
        why = ("Likely mistake: the context is not cropped to the LAST n_ctx tokens before each "
               "forward pass (tokens[:, -n_ctx:])." if first + n_prompt >= model.cfg.n_ctx else
               "Likely mistake: the next token must come from the logits of the LAST position, "
               "logits[:, -1].")
        raise CheckFailed(f"generate(..., temperature=0.0) differs from greedy decoding at new "
                          f"token {first} (the model's n_ctx is {model.cfg.n_ctx}, the prompt has "
                          f"{n_prompt} tokens). {why}")
    if not torch.equal(outputs["a"], outputs["a_again"]):
        raise CheckFailed("generate: the same generator seed gave different samples; pass the "
                          "generator down to the sampler.")
    if torch.equal(outputs["a"], outputs["b"]):
        raise CheckFailed("generate: different generator seeds gave the same samples at "
                          "temperature 1: it must sample, not decode greedily.")
    with torch.no_grad():
        for key in ("a", "b"):
            out = outputs[key]
            for step in range(N_NEW):
                context = out[:, :n_prompt + step][:, -model.cfg.n_ctx:]
                allowed = apply_top_k(model(context)[:, -1], 5) > NEG_INF
                token = out[:, n_prompt + step]
                if not allowed.gather(-1, token[:, None]).all():
                    raise CheckFailed(f"generate(..., top_k=5): new token {step} is not among the "
                                      "5 most likely; pass the sampling settings (top_k, top_p, "
                                      "temperature, freq_penalty) on to sample_next_token.")
    expected_eos = generate(chain, chain_prompt, 40, None, eos_token_id=EOS, temperature=0.0)
    out = outputs["eos"]
    where = f"generate(model, prompt, max_new_tokens=40, eos_token_id={EOS})"
    check_shape(where, out, (1, out.shape[-1]), ("batch", "position"))
    if not torch.equal(out, expected_eos):
        what = (f"it returned {out.shape[1] - 2} new tokens, expected {expected_eos.shape[1] - 2}: "
                f"{expected_eos[0, 2:].tolist()}")
        raise CheckFailed(f"{where}: {what}. Generation must stop right after the end-of-text "
                          "token is sampled (and include it).")


generate_exercise = Exercise("generate", produce_generate, judge_generate)


def check_generate(fn, **case) -> None:
    """Grade `generate(model, input_ids, max_new_tokens, generator, eos_token_id, **sampling)`."""
    generate_exercise.check(fn, **{"text": None, **case})


# --- Exercise: beam search ----------------------------------------------------------------------

BEAM_VOCAB = 6


def exhaustive_search(model: MarkovModel, prompt: torch.Tensor, n_new: int, top: int):
    """The `top` most likely continuations of `prompt`, by enumerating all of them."""
    log_probs = model.table.double().log_softmax(-1)
    scored = []
    for continuation in itertools.product(range(model.cfg.d_vocab), repeat=n_new):
        previous = [int(prompt[0, -1])] + list(continuation[:-1])
        score = sum(float(log_probs[a, b]) for a, b in zip(previous, continuation))
        scored.append((score, continuation))
    scored.sort(key=lambda item: -item[0])
    tokens = torch.tensor([prompt[0].tolist() + list(c) for _, c in scored[:top]])
    return tokens, torch.tensor([s for s, _ in scored[:top]], dtype=torch.float64)


BEAM_SETTINGS = {"exact": (36, 3), "narrow": (3, 5), "greedy": (1, 4)}   # (num_beams, new tokens)
# 36 = 6^2 beams hold every 2-token prefix, so beam search over 3 new tokens is exhaustive.


def _beam_margin(model: MarkovModel, prompt: torch.Tensor, num_beams: int, n_new: int) -> float:
    """The smallest score gap that decides the search: at every step between the last kept
    candidate and the first dropped one, and between consecutive final beams."""
    log_probs = model.table.double().log_softmax(-1)
    beams, scores, margin = prompt, torch.zeros(1, dtype=torch.float64), math.inf
    for _ in range(n_new):
        ranked, flat = (scores[:, None] + log_probs[beams[:, -1]]).flatten().sort(descending=True)
        if len(ranked) > num_beams:
            margin = min(margin, float(ranked[num_beams - 1] - ranked[num_beams]))
        scores, flat = ranked[:num_beams], flat[:num_beams]
        beams = torch.cat([beams[flat // BEAM_VOCAB], (flat % BEAM_VOCAB)[:, None]], dim=-1)
    return min([margin] + (scores[:-1] - scores[1:]).tolist())


def _beam_cases(case: Case):
    """A Markov model whose searches are decided by gaps of at least 1e-3 (far above fp32
    rounding), so that every correct implementation finds the same beams in the same order."""
    prompt = torch.tensor([[case.seed % BEAM_VOCAB, 4]])
    for attempt in itertools.count():
        model = markov_model(case.seed + 80 + 1000 * attempt, BEAM_VOCAB)
        if all(_beam_margin(model, prompt, *setting) > 1e-3 for setting in BEAM_SETTINGS.values()):
            return model, prompt, BEAM_SETTINGS


def sequence_log_prob(model: MarkovModel, tokens: torch.Tensor, n_prompt: int) -> torch.Tensor:
    """Total log-probability of each row's new tokens given everything before them."""
    log_probs = model.table.double().log_softmax(-1)
    return log_probs[tokens[:, n_prompt - 1:-1], tokens[:, n_prompt:]].sum(-1)


def produce_beam(fn, case: Case) -> dict:
    model, prompt, settings = _beam_cases(case)
    outputs = {}
    for key, (beams, new) in settings.items():
        result = run_learner("beam_search", fn, model, prompt.clone(), beams, new)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise CheckFailed("beam_search must return a pair (tokens, log_probs): tokens "
                              "[num_beams, prompt + new], log-probabilities [num_beams].")
        for part, value in zip(("tokens", "log_probs"), result):
            require_tensor(f"beam_search(...) {part}", value)
            outputs[f"{key}_{part}"] = value
    return outputs


def judge_beam(case: Case, outputs: dict) -> None:
    model, prompt, settings = _beam_cases(case)
    n_prompt = prompt.shape[1]
    for key, (beams, new) in settings.items():
        where = f"beam_search(model, prompt, num_beams={beams}, max_new_tokens={new})"
        tokens, scores = outputs[f"{key}_tokens"], outputs[f"{key}_log_probs"]
        check_shape(f"{where} tokens", tokens, (beams, n_prompt + new), ("beam", "position"))
        check_shape(f"{where} log_probs", scores, (beams,), ("beam",))
        if not torch.equal(tokens[:, :n_prompt], prompt.expand(beams, -1)):
            raise CheckFailed(f"{where}: every beam must start with the prompt.")
        true_scores = sequence_log_prob(model, tokens, n_prompt)
        if not close(scores, true_scores.float()):
            row = int((scores.double() - true_scores).abs().argmax())
            last = model.table.double().log_softmax(-1)[tokens[:, -2], tokens[:, -1]]
            if close(scores, last.float()):
                why = ("Likely mistake: the scores are not accumulated: a beam's score is the SUM "
                       "of the log-probabilities of all its new tokens, not the last one's.")
            elif any(close(scores, (true_scores / n).float()) for n in (new, n_prompt + new)):
                why = ("Likely mistake: the score is divided by the length. Return the plain total "
                       "log-probability of the new tokens, the same measure for every beam.")
            else:
                why = ("A beam's score must be the sum of log_softmax(logits) of each new token "
                       "given the tokens before it (log-probabilities, not probabilities or raw "
                       "logits), over the new tokens only.")
            raise CheckFailed(f"{where}: beam {row} has log-probability {float(scores[row]):.5f}, "
                              f"but its tokens {tokens[row].tolist()} have total log-probability "
                              f"{float(true_scores[row]):.5f}. {why}")
        expected_tokens, expected_scores = (exhaustive_search(model, prompt, new, beams)
                                            if key == "exact" else beam_search(model, prompt, beams, new))
        if torch.equal(tokens, expected_tokens):
            continue
        if set(map(tuple, tokens.tolist())) == set(map(tuple, expected_tokens.tolist())):
            raise CheckFailed(f"{where}: the right beams, but return them best first "
                              "(log-probabilities in decreasing order).")
        versus = "exhaustive search" if key == "exact" else "the reference beam search"
        raise CheckFailed(
            f"{where}: the beams differ from {versus} (first difference in beam "
            f"{int((tokens != expected_tokens).any(-1).nonzero()[0])}). Expected best "
            f"log-probability {float(expected_scores[0]):.5f}, got {float(scores[0]):.5f}. "
            "At every step, extend each beam by every token, score each candidate by its "
            "total log-probability, and keep the num_beams best candidates overall.")


beam_exercise = Exercise("beam_search", produce_beam, judge_beam)


def check_beam_search(fn, **case) -> None:
    """Grade `beam_search(model, input_ids, num_beams, max_new_tokens)` on a tiny Markov model."""
    beam_exercise.check(fn, **{"text": None, **case})


# --- Exercise: the KV cache ------------------------------------------------------------------------

CACHE_CHUNKS = (6, 1, 3, 1, 1)
CACHE_MISTAKES = {
    "offset": "the new tokens get position embeddings 0, 1, ... instead of continuing after the "
              "cached positions (use W_pos[past_len : past_len + n_new])",
    "no_append": "the cache is not extended: the new keys and values must be appended to the "
                 "cached ones and returned for the next call",
    "mask": "the causal mask ignores the cached positions: new query i sits at position "
            "past_len + i and may attend to every key up to that position",
}


def _cache_tokens(case: Case) -> torch.Tensor:
    return torch.randint(0, cache_config().d_vocab, (max(case.batch, 1), sum(CACHE_CHUNKS)),
                         generator=torch.Generator().manual_seed(case.seed + 90))


def _chunked_logits(forward, model, tokens, **kwargs) -> torch.Tensor:
    cache, pieces, start = None, [], 0
    for size in CACHE_CHUNKS:
        logits, cache = forward(model, tokens[:, start:start + size], cache, **kwargs)
        pieces.append(logits)
        start += size
    return torch.cat(pieces, dim=1)


def produce_forward_cache(fn, case: Case) -> dict:
    model = _seeded_model(cache_config(), case.seed)
    tokens = _cache_tokens(case)

    def learner_forward(m, chunk, cache):
        result = run_learner("forward_with_cache", fn, m, chunk, cache)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise CheckFailed("forward_with_cache must return a pair (logits, cache).")
        require_tensor("forward_with_cache logits", result[0])
        return result

    return {"logits": _chunked_logits(learner_forward, model, tokens)}


def judge_forward_cache(case: Case, outputs: dict) -> None:
    model = _seeded_model(cache_config(), case.seed)
    tokens = _cache_tokens(case)
    with torch.no_grad():
        expected = model(tokens)
        mistakes = {d: _chunked_logits(forward_with_cache, model, tokens, mistake=m)
                    for m, d in CACHE_MISTAKES.items()}
    compare(f"forward_with_cache fed {len(tokens[0])} tokens in chunks of {list(CACHE_CHUNKS)} "
            "(logits of every position, against one uncached forward pass)",
            outputs["logits"], expected, ("batch", "position", "d_vocab"), mistakes=mistakes,
            depth=model.cfg.n_layers,
            hint="positions 0-5 are the first call (no cache); a mismatch from position 6 on is "
                 "in how the cache is reused.")


forward_cache_exercise = Exercise("forward_with_cache", produce_forward_cache, judge_forward_cache)


def check_forward_with_cache(fn, **case) -> None:
    """Grade `forward_with_cache(model, new_tokens, cache) -> (logits, cache)`."""
    forward_cache_exercise.check(fn, **{"text": None, **case})


CACHE_STEPS = 50


def _cache_prompt(case: Case) -> torch.Tensor:
    return _cache_tokens(case)[:, :5]


def produce_generate_cache(fn, case: Case) -> dict:
    model = _seeded_model(cache_config(), case.seed)
    prompt = _cache_prompt(case)
    out = run_learner("generate_with_cache", fn, model, prompt.clone(), CACHE_STEPS)
    require_tensor("generate_with_cache(...)", out)
    return {"tokens": out}


def judge_generate_cache(case: Case, outputs: dict) -> None:
    model = _seeded_model(cache_config(), case.seed)
    prompt = _cache_prompt(case)
    out = outputs["tokens"]
    where = f"generate_with_cache(model, prompt of shape {list(prompt.shape)}, {CACHE_STEPS})"
    check_shape(where, out, (prompt.shape[0], prompt.shape[1] + CACHE_STEPS), ("batch", "position"))
    with torch.no_grad():
        expected = generate(model, prompt, CACHE_STEPS, None, temperature=0.0)
    if torch.equal(out, expected):
        return
    first = int((out != expected).any(0).nonzero()[0]) - prompt.shape[1]
    lines = [f"{where}: differs from greedy generation without a cache at new token {first} "
             f"(expected {expected[0, prompt.shape[1]:][:first + 3].tolist()} ..., got "
             f"{out[0, prompt.shape[1]:][:first + 3].tolist()} ...)."]
    with torch.no_grad():
        for mistake, description in CACHE_MISTAKES.items():
            if torch.equal(out, generate_with_cache(model, prompt, CACHE_STEPS, mistake)):
                lines.append(f"  Likely mistake: {description}")
                break
    raise CheckFailed("\n".join(lines))


generate_cache_exercise = Exercise("generate_with_cache", produce_generate_cache, judge_generate_cache)


def check_generate_with_cache(fn, **case) -> None:
    """Grade `generate_with_cache(model, input_ids, max_new_tokens)`: 50 greedy tokens, identical
    to generation without a cache."""
    generate_cache_exercise.check(fn, **{"text": None, **case})
