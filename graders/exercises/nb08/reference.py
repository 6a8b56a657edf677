"""The course's reference implementations of notebook 08's functions, which the sampling checks
judge learners against (and which the notebook's demonstrations call)."""
from __future__ import annotations

import math

import torch
from graders.marks import course_answer

NEG_INF = float("-inf")


@course_answer("greedy_search")
def greedy_search(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


@course_answer("apply_temperature")
def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def token_counts(input_ids: torch.Tensor, d_vocab: int) -> torch.Tensor:
    """How often each vocabulary token occurs in each row of `input_ids`: [batch, d_vocab]."""
    counts = torch.zeros(input_ids.shape[0], d_vocab, dtype=torch.long)
    return counts.scatter_add(1, input_ids, torch.ones_like(input_ids))


@course_answer("apply_frequency_penalty")
def apply_frequency_penalty(input_ids: torch.Tensor, logits: torch.Tensor, freq_penalty: float):
    return logits - freq_penalty * token_counts(input_ids, logits.shape[-1]).to(logits.dtype)


@course_answer("apply_top_k")
def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep every token whose logit is at least the k-th largest (ties at the k-th all stay);
    k >= d_vocab keeps every token (as Hugging Face's TopKLogitsWarper does)."""
    kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


@course_answer("apply_top_p")
def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens until their total probability reaches top_p (at least one).

    Exact: the running total is summed in float64 (in float32 it reaches 1.0 early on sharp
    logits), and top_p >= 1 keeps every token; it agrees with Hugging Face's TopPLogitsWarper
    (tests/catalog/test_catalog_08_filters.py)."""
    if top_p >= 1.0:
        return logits.clone()
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.double().softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= top_p
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


@course_answer("sample_basic")
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


@course_answer("sample_next_token")
def sample_next_token(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0,
                      freq_penalty=0.0):
    if temperature == 0.0:
        return greedy_search(apply_frequency_penalty(input_ids, logits, freq_penalty))
    return sample_basic(next_token_logits(input_ids, logits, temperature, top_k, top_p,
                                          freq_penalty), generator)


@course_answer("generate")
@torch.no_grad()
def generate(model, input_ids, max_new_tokens, generator, eos_token_id=None, use_cache=False,
             **sampling):
    """Sample up to `max_new_tokens`, cropping the context to the model's n_ctx.

    With `eos_token_id`, each row stops on its own: once a row has sampled end-of-text (kept),
    its later tokens are end-of-text too (padding), and the loop stops when every row has
    finished. With `use_cache` (the notebook's demos, for speed) each step feeds only the newest
    token through `forward_with_cache`; the context cannot be cropped then, so it must fit n_ctx.
    """
    if use_cache:
        require_context(input_ids, max_new_tokens, model.cfg.n_ctx,
                        "generate with use_cache", "; ask for fewer tokens or use_cache=False")
    tokens, cache = input_ids, None
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        if use_cache:
            logits, cache = forward_with_cache(model, tokens if cache is None else tokens[:, -1:], cache)
            logits = logits[:, -1]
        else:
            logits = model(tokens[:, -model.cfg.n_ctx:])[:, -1]
        new = sample_next_token(tokens, logits, generator, **sampling)
        if eos_token_id is not None:
            new = new.masked_fill(finished, eos_token_id)     # finished rows: padded with end-of-text
            finished = finished | (new == eos_token_id)
        tokens = torch.cat([tokens, new[:, None]], dim=-1)
        if eos_token_id is not None and bool(finished.all()):
            break
    return tokens


@course_answer("beam_search")
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


@course_answer("attention_with_cache")
def attention_with_cache(attn, x, past, position_bug=False, mistake: str = ""):
    """Attention over the cached keys/values plus the new positions: (out, (keys, values)).
    (`position_bug` / `mistake` as in `forward_with_cache`, for diagnosis.)"""
    q = torch.einsum("bpd,ndh->bpnh", x, attn.W_Q) + attn.b_Q
    k = torch.einsum("bpd,ndh->bpnh", x, attn.W_K) + attn.b_K
    v = torch.einsum("bpd,ndh->bpnh", x, attn.W_V) + attn.b_V
    if past is not None and mistake == "new_first":
        k, v = torch.cat([k, past[0]], dim=1), torch.cat([v, past[1]], dim=1)
    elif past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    scores = torch.einsum("bqnh,bknh->bnqk", q, k) / math.sqrt(attn.W_Q.shape[-1])
    n_new, n_all = q.shape[1], k.shape[1]
    offset = 0 if position_bug or mistake == "mask" else n_all - n_new
    future = torch.arange(n_all)[None, :] > torch.arange(n_new)[:, None] + offset
    if mistake == "no_mask":
        future = torch.zeros_like(future)
    pattern = scores.masked_fill(future, NEG_INF).softmax(dim=-1)
    z = torch.einsum("bnqk,bknh->bqnh", pattern, v)
    kept = (k[:, -n_new:], v[:, -n_new:]) if mistake == "only_new" else (k, v)
    return torch.einsum("bqnh,nhd->bqd", z, attn.W_O) + attn.b_O, kept


@course_answer("forward_with_cache")
def forward_with_cache(model, new_tokens, cache=None, mistake: str = ""):
    """Logits of the new positions given a cache of the earlier ones: (logits, new cache).

    `mistake` computes what a known wrong cache does (for diagnosis): "offset" embeds the new
    tokens at positions 0.. instead of after the cached ones, "no_append" never adds to the
    cache, "mask" builds the causal mask as if the new positions started at 0, "no_mask" masks
    nothing (the new tokens see each other's future), "only_new" returns only the new keys and
    values as the cache, "ignored" never reads the cache (each call starts afresh), "new_first"
    puts the new keys and values before the cached ones.
    """
    if mistake == "ignored":
        cache = None
    past_len = 0 if cache is None else cache[0][0].shape[1]
    start = 0 if mistake == "offset" else past_len
    residual = model.embed(new_tokens) + model.pos_embed.W_pos[start:start + new_tokens.shape[1]]
    new_cache = []
    for i, block in enumerate(model.blocks):
        past = None if cache is None else cache[i]
        attn_out, kv = attention_with_cache(block.attn, block.ln1(residual), past, mistake=mistake)
        residual = residual + attn_out
        residual = residual + block.mlp(block.ln2(residual))
        new_cache.append(past if mistake == "no_append" and past is not None else kv)
    return model.unembed(model.ln_final(residual)), new_cache


def require_context(input_ids, max_new_tokens: int, n_ctx: int, what: str, remedy: str = "") -> None:
    """Refuse, with a ValueError naming n_ctx, a generation through the KV cache that would pass
    the context: the cache holds absolute positions, which stop at n_ctx, so it cannot crop."""
    if input_ids.shape[1] + max_new_tokens > n_ctx:
        raise ValueError(f"{what}: the prompt ({input_ids.shape[1]} tokens) plus max_new_tokens "
                         f"({max_new_tokens}) must fit the context, n_ctx = {n_ctx}{remedy}")


@course_answer("generate_with_cache")
@torch.no_grad()
def generate_with_cache(model, input_ids, max_new_tokens, mistake: str = ""):
    """Greedy generation that feeds each new token alone, reusing the cache; a request past
    the context (prompt + new tokens > n_ctx) is refused with a ValueError naming n_ctx."""
    require_context(input_ids, max_new_tokens, model.cfg.n_ctx, "generate_with_cache")
    logits, cache = forward_with_cache(model, input_ids, None, mistake)
    tokens = input_ids
    for step in range(max_new_tokens):
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, new], dim=-1)
        if step + 1 < max_new_tokens:      # the last token needs no forward pass of its own
            logits, cache = forward_with_cache(model, new, cache, mistake)
    return tokens


# The notebook's functions that have checks of their own, under the notebook's names: a check of
# a function that calls them runs these in place of the learner's (judging.learner.course_functions).
SAMPLING_PARTS = {f.__name__: f for f in (greedy_search, apply_temperature, apply_frequency_penalty,
                                          apply_top_k, apply_top_p, sample_basic)}
GENERATION_PARTS = {**SAMPLING_PARTS, "sample_next_token": sample_next_token}
