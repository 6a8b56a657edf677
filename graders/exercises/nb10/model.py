"""Notebook 10, exercise 5: the decoder layer, the whole model and greedy generation with a KV
cache, judged against transformers' LlamaDecoderLayer and LlamaForCausalLM (seeded weights,
loaded into the learner's modules by the converter in `reference`).

- `DecoderLayer(cfg)`, `forward(x, cos, sin, past=None) -> (x, (keys, values))`: pre-RMSNorm,
  two residual additions.
- `ModernDecoder(cfg)`, `forward(tokens, past=None) -> (logits, cache)`: whole, and in two chunks
  through its own cache (the second chunk's positions continue from the cache's length).
- `generate_greedy(model, tokens, n_new)`: run on the course's model; each step after the prompt
  must feed one token and the cache.
"""
from __future__ import annotations

import torch
from torch import nn

from graders.exercises.common.diagnosis import judge_generated
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, mistake_key, with_fix
from graders.integrity.library_kernels import LINEAR_KERNELS
from graders.exercises.common.divergence import first_divergence
from graders.exercises.nb10 import layer_flow, model_flow
from graders.exercises.nb10 import reference as ref
from graders.exercises.nb10.attention import FORBIDDEN, ROPE_PARTS, load_attention
from graders.exercises.nb10.norm_mlp import DEFAULTS, NOTEBOOK, hf_model, weights
from graders.judging.cases import Case
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner
from graders.judging.tolerance import close
from graders.reference.weights import component

DIMS, LOGIT_DIMS = ("batch", "position", "d_model"), ("batch", "position", "d_vocab")


# --- DecoderLayer ------------------------------------------------------------------------------

CACHE_DIMS = ("batch", "kv_head", "position", "d_head")

def with_course_parts(module: nn.Module, cfg: ref.ModernConfig) -> nn.Module:
    """The learner's layer with the course's versions of the parts that have checks of their own
    (the norms, attention and the MLP), so that a mistake in a part costs that part's check, not
    the composite's too. A part under another name is left alone: loading the weights then names it."""
    parts = {"ln1": ref.RMSNorm, "attn": ref.GQAttention, "ln2": ref.RMSNorm, "mlp": ref.SwiGLU}
    for name, course in parts.items():
        if isinstance(getattr(module, name, None), nn.Module):
            setattr(module, name, course(cfg))
    return module


def with_course_layers(module: nn.Module, cfg: ref.ModernConfig) -> nn.Module:
    """The learner's model with the course's layers and final norm, likewise. (Apart from
    with_course_parts: a layer's check does not run the course's layer, so its kernel need not
    hold it: graders.integrity.kernel_plan.)"""
    if isinstance(getattr(module, "ln_final", None), nn.Module):
        module.ln_final = ref.RMSNorm(cfg)
    blocks = getattr(module, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        for i in range(len(blocks)):
            blocks[i] = ref.DecoderLayer(cfg)
    return module


def _layer_input(case: Case, cfg: ref.ModernConfig):
    x = ref.seeded_input(case.seed + 90, case.batch, case.seq, cfg.d_model)
    return (x, *ref.rope_cos_sin(torch.arange(case.seq), cfg.d_head, cfg.rope_theta))


def produce_layer(DecoderLayer, case: Case, inputs: dict) -> dict:
    cfg = ref.ModernConfig()
    layer = load_attention(DecoderLayer, cfg, component(weights(case.seed), f"blocks.{case.block}"), "DecoderLayer",
                           with_course_parts)
    x, cos, sin = _layer_input(case, cfg)
    result = run_learner("DecoderLayer", layer, x, cos, sin, forbidden=FORBIDDEN)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"DecoderLayer returned {type(result).__name__}; return (x, (keys, values)).")
    outputs = layer_flow.layer_trace(layer, x, cos, sin, runner=lambda fn, v: run_learner(
        "DecoderLayer", layer, v, cos, sin, forbidden=FORBIDDEN))
    outputs["out"] = result[0]
    cache = result[1]
    if isinstance(cache, (tuple, list)) and len(cache) == 2 and all(isinstance(t, torch.Tensor) for t in cache):
        outputs.update({"keys": cache[0], "values": cache[1]})
        split = case.seq // 2
        first, past = run_learner("DecoderLayer", layer, x[:, :split], cos[:split], sin[:split], forbidden=FORBIDDEN)
        second = run_learner("DecoderLayer (with the cache of the first chunk)", layer, x[:, split:], cos[split:],
                             sin[split:], past, forbidden=FORBIDDEN)
        if isinstance(second, tuple) and len(second) == 2:
            outputs["cached"] = torch.cat([first, second[0]], dim=1)
    return {k: v for k, v in outputs.items() if v is not None}


def judge_layer(case: Case, outputs: dict) -> None:
    cfg, i = ref.ModernConfig(), case.block
    x, cos, sin = _layer_input(case, cfg)
    w = component(weights(case.seed), f"blocks.{i}")
    expected = layer_flow.llama_trace(hf_model(case.seed).model.layers[i], x, cos, sin,
                                      ref.causal_mask(case.seq, case.seq))
    out, what = outputs.get("out"), f"DecoderLayer (blocks.{i}), compared with LlamaDecoderLayer"
    check_shape(what, out, tuple(expected["out"].shape), DIMS)
    if not close(out, expected["out"]):
        course = ref.DecoderLayer(cfg)
        course.load_state_dict(w)
        counts = ", ".join(f"self.{n} called {int(outputs.get(f'calls.{n}', 0))}x" for n in layer_flow.PARTS)
        first_divergence(what, outputs, expected, [(h, h) for h in layer_flow.HOOKS],
                         {**layer_flow.mistake_traces(course, x, cos, sin),
                          **layer_flow.combination_traces(outputs, expected, x)}, DIMS, layer_flow.HINTS, counts, "out",
                         layer_flow.PLACES)
        compare(what, out, expected["out"], DIMS, hint="x = x + attn(ln1(x)); x = x + mlp(ln2(x)).")
    if "keys" not in outputs or "values" not in outputs:
        raise CheckFailed("DecoderLayer: its x is right, but it does not return (keys, values) tensors as its "
                          "cache. Likely mistake: the `past` passed in is returned instead of the cache your "
                          "attention returned.", mistake="past_returned_as_cache")
    _, (keys, values) = ref.attention(ref.rms_norm(x, w["ln1.w"], cfg.rms_norm_eps), component(w, "attn"), cos, sin)
    for name, cached in (("keys", keys), ("values", values)):
        compare(f"DecoderLayer (blocks.{i})'s cached {name}", outputs.get(name), cached, CACHE_DIMS,
                hint="return the (keys, values) your attention returned: the cache of this call, "
                     "not the `past` passed in.")
    split, course = case.seq // 2, ref.DecoderLayer(cfg)
    course.load_state_dict(w)

    @torch.no_grad()
    def without_past():   # each chunk alone: the second one attends to itself only
        return torch.cat([course(x[:, :split], cos[:split], sin[:split])[0],
                          course(x[:, split:], cos[split:], sin[split:])[0]], dim=1)

    compare(f"DecoderLayer (blocks.{i}) in two chunks (positions 0-{split - 1}, then the rest with the cache it "
            "returned; the same positions at once are right)", outputs.get("cached"), expected["out"], DIMS,
            mistakes=lambda: {Mistake("past_not_passed_to_attention", "`past` is not passed on to the attention: "
                                      "self.attn(ln1(x), cos, sin, past)"):
                              without_past()},
            hint="pass `past` to the attention, and return the cache it returns.")


layer_exercise = Exercise(NOTEBOOK, "DecoderLayer", produce_layer, judge_layer,
                          forbidden=(FORBIDDEN,), defaults=DEFAULTS)
check_decoder_layer = layer_exercise.checker(
    "Grade `DecoderLayer` against transformers' LlamaDecoderLayer (seeded weights and inputs).")


# --- ModernDecoder -----------------------------------------------------------------------------

def tokens_for(case: Case, cfg: ref.ModernConfig) -> torch.Tensor:
    generator = torch.Generator().manual_seed(900 + case.seed)
    return torch.randint(0, cfg.d_vocab, (case.batch, case.seq), generator=generator)


def _model_run(what, model, *args):
    result = run_learner(what, model, *args, forbidden=FORBIDDEN)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"{what} returned {type(result).__name__}; return (logits, cache).")
    return result


def produce_model(ModernDecoder, case: Case, inputs: dict) -> dict:
    cfg = case.config(ref.ModernConfig())
    model = load_attention(ModernDecoder, cfg, weights(case.seed), "ModernDecoder", with_course_layers)
    tokens, split = tokens_for(case, cfg), case.seq // 2
    (logits, _), whole = model_flow.record(model, lambda: _model_run("ModernDecoder", model, tokens), "whole")
    (first, past), first_steps = model_flow.record(
        model, lambda: _model_run("ModernDecoder", model, tokens[:, :split]), "first")
    (second, cache), cached_steps = model_flow.record(model, lambda: _model_run(
        "ModernDecoder (with the cache of the first chunk)", model, tokens[:, split:], past), "cached")
    outputs = {"logits": logits, "cached": torch.cat([first, second], dim=1), **whole, **first_steps, **cached_steps}
    if not (isinstance(cache, (list, tuple)) and len(cache) == cfg.n_layers
            and all(isinstance(c, (list, tuple)) and len(c) == 2 for c in cache)):
        raise CheckFailed("ModernDecoder's cache: return one (keys, values) pair per layer, in a list.")
    outputs.update({f"cache.{i}.{j}": t for i, pair in enumerate(cache) for j, t in enumerate(pair)})
    return outputs


def _course_model(cfg: ref.ModernConfig, seed: int) -> nn.Module:
    model = ref.ModernDecoder(cfg)
    model.load_state_dict(weights(seed))
    return model.eval()


def _run_course(model: nn.Module, tokens: torch.Tensor, cached: bool) -> torch.Tensor:
    """The course model's logits: whole, or (`cached`) in the check's two chunks."""
    if not cached:
        return model(tokens)[0]
    split = tokens.shape[1] // 2
    first, past = model(tokens[:, :split])
    return torch.cat([first, model(tokens[:, split:], past)[0]], 1)


def model_mistakes(case: Case, cached: bool) -> dict[str, torch.Tensor]:
    cfg = case.config(ref.ModernConfig())
    model, tokens, split = _course_model(cfg, case.seed), tokens_for(case, cfg), case.seq // 2
    found = {}
    with torch.no_grad():
        if cfg.rope_theta != ref.ModernConfig().rope_theta:
            found[Mistake("rope_theta_not_from_config", f"rope_theta is not read from the config: cos and sin use "
                          f"{ref.ModernConfig().rope_theta:g} where this config has {cfg.rope_theta:g} (pass "
                          "self.cfg.rope_theta to rope_cos_sin)")] = \
                _run_course(_course_model(ref.ModernConfig(), case.seed), tokens, cached)
        if cached:
            first, past = model(tokens[:, :split])
            second, _ = model(tokens[:, split:])              # positions 0.. again, and no past
            found[Mistake("cache_not_used", "the cache is not used: the second chunk must see the first through "
                          "`past`")] = \
                torch.cat([first, second], 1)
            cos, sin = ref.rope_cos_sin(torch.arange(case.seq - split), cfg.d_head, cfg.rope_theta)
            x = model.W_E[tokens[:, split:]]
            for block, layer_past in zip(model.blocks, past):
                x, _ = block(x, cos, sin, layer_past)
            found[Mistake("positions_restart_in_cache", "positions restart at 0 in the cached chunk: its positions "
                          "are past_len, past_len + 1, ... (past_len = the cached keys' length)")] = \
                torch.cat([first, model.ln_final(x) @ model.W_U], 1)
        else:
            x = model.W_E[tokens]
            cos, sin = ref.rope_cos_sin(torch.arange(case.seq), cfg.d_head, cfg.rope_theta)
            for block in model.blocks:
                x, _ = block(x, cos, sin)
            found[Mistake("no_final_norm", "the final RMSNorm is missing: logits = ln_final(x) @ W_U")] = x @ model.W_U
    return found


def judge_model(case: Case, outputs: dict) -> None:
    cfg = case.config(ref.ModernConfig())
    tokens, split = tokens_for(case, cfg), case.seq // 2
    steps, w = model_flow.llama_steps(hf_model(case.seed, **case.settings()), tokens), weights(case.seed)
    expected, cached = steps["logits"], outputs.get("cached")
    what = "ModernDecoder, compared with LlamaForCausalLM"
    if isinstance(outputs.get("logits"), torch.Tensor) and outputs["logits"].shape == expected.shape:
        model_flow.diverged(what, outputs, steps, "whole", cfg, range(case.seq), w, tokens, outputs["logits"])
    if isinstance(cached, torch.Tensor) and cached.shape == expected.shape:
        model_flow.diverged(what, outputs, steps, "first", cfg, range(split), w, tokens, cached[:, :split])
        model_flow.diverged(what, outputs, steps, "cached", cfg, range(split, case.seq), w, tokens, cached[:, split:])
    depth = cfg.n_layers + 1
    compare("ModernDecoder logits, compared with LlamaForCausalLM's", outputs.get("logits"), expected,
            LOGIT_DIMS, mistakes=lambda: model_mistakes(case, cached=False), depth=depth,
            hint="embed, the layers, ln_final, then @ W_U; cos and sin from rope_cos_sin.")
    compare(f"ModernDecoder logits in two chunks (positions 0-{case.seq // 2 - 1}, then the rest with "
            "the cache)", outputs.get("cached"), expected, LOGIT_DIMS,
            mistakes=lambda: model_mistakes(case, cached=True), depth=depth,
            hint="with a cache, the new positions start at the cached keys' length.")
    for i in range(cfg.n_layers):
        for j, part in enumerate(("keys", "values")):
            check_shape(f"ModernDecoder's cache, layer {i}: the {part}", outputs.get(f"cache.{i}.{j}"),
                        (case.batch, cfg.n_kv_heads, case.seq, cfg.d_head),
                        ("batch", "kv_head", "position", "d_head"))


model_exercise = Exercise(NOTEBOOK, "ModernDecoder", produce_model,
                          judge_model,
                          forbidden=(FORBIDDEN,), defaults=DEFAULTS,
                          course_parts=ROPE_PARTS, guard=Guard(may_run=LINEAR_KERNELS))   # F.linear for W_U
check_modern_decoder = model_exercise.checker(
    "Grade `ModernDecoder` against transformers' LlamaForCausalLM (whole, and through its cache).")


# --- generate_greedy ---------------------------------------------------------------------------

N_NEW = 8


def produce_generate(generate_greedy, case: Case, inputs: dict) -> dict:
    cfg = ref.ModernConfig()
    model, fed, cached = _course_model(cfg, case.seed), [], []
    forward = model.forward

    def counted(tokens, *args, **kwargs):   # model(...) and model.forward(...) alike
        fed.append(tokens.shape[-1])
        cached.append(_cached_positions(args[0] if args else kwargs.get("past")))
        return forward(tokens, *args, **kwargs)

    model.forward = counted
    out = run_learner("generate_greedy", generate_greedy, model, tokens_for(case, cfg), N_NEW, forbidden=FORBIDDEN)
    return {"out": out, "fed": torch.tensor(fed, dtype=torch.long), "cached": torch.tensor(cached, dtype=torch.long)}


def _cached_positions(past) -> int:
    """How many positions the cache passed in holds (0 without one; -1 if it is not a cache)."""
    try:
        return 0 if past is None else int(past[0][0].shape[2])
    except (TypeError, IndexError, AttributeError):
        return -1


# How a greedy loop can pick its next token from the last logits, by the mistake it would be.
PICKS = {
    None: lambda logits: logits[:, -1].argmax(-1, keepdim=True),
    Mistake("first_position_logits", "the next token is read from the first position's logits, not the last's "
            "(logits[:, -1])"):
        lambda logits: logits[:, 0].argmax(-1, keepdim=True),
    Mistake("argmin", "the least likely token is taken (argmin for argmax)"):
        lambda logits: logits[:, -1].argmin(-1, keepdim=True),
}


def _continued(hf, prompt: torch.Tensor, pick, cached: bool = False) -> torch.Tensor:
    """The prompt continued by N_NEW tokens, each chosen by `pick` from the logits the loop sees:
    the whole sequence's, or (`cached`) the prompt's first and then the new token's alone."""
    tokens = prompt
    with torch.no_grad():
        for step in range(N_NEW):
            logits = hf(tokens).logits
            tokens = torch.cat([tokens, pick(logits if step == 0 or not cached else logits[:, -1:])], dim=1)
    return tokens


def judge_generate(case: Case, outputs: dict) -> None:
    """The tokens first, with what a wrong one says of the loop; then how the model was called:
    the prompt once, then each new token alone with the cache. One more call after the last
    token (the usual append-then-call loop) is fine: its logits are not used."""
    cfg = ref.ModernConfig()
    prompt, hf = tokens_for(case, cfg), hf_model(case.seed)
    judge_generated("generate_greedy(model, tokens, 8)", outputs.get("out"), prompt, N_NEW)
    out, fed = outputs["out"], outputs["fed"].tolist()
    expected = _continued(hf, prompt, PICKS[None])
    cached = fed[:1] == [case.seq] and set(fed[1:]) <= {1}
    if not torch.equal(out, expected):
        wrong = (out != expected).nonzero()[0].tolist()
        named = next((m for m, pick in PICKS.items()
                      if m and torch.equal(out, _continued(hf, prompt, pick, cached))), None)
        if named is None:
            named = _whole_sequence_with_cache(fed, outputs["cached"].tolist())
        if named is None and cached:
            named = Mistake("cache_fed_wrongly", "the cache is fed wrongly (each new token must go in with the cache "
                            "the last call returned), or the next token is not the argmax (sampled?)")
        raise CheckFailed(f"generate_greedy: token {wrong[1]} of sequence {wrong[0]} is "
                          f"{int(out[tuple(wrong)])}, LlamaForCausalLM's greedy choice is "
                          f"{int(expected[tuple(wrong)])}. "
                          + (f"Likely mistake: {named}." if named else
                             "Pass the cache the model returned back in with the next token, and take "
                             "the argmax of the last position's logits."), mistake=mistake_key(named))
    if not cached or len(fed) not in (N_NEW, N_NEW + 1):
        whole = _whole_sequence_with_cache(fed, outputs["cached"].tolist())
        raise CheckFailed(with_fix(f"generate_greedy fed the model {fed} tokens per call; with a KV cache, the "
                          f"prompt ({case.seq} tokens) goes in once, then each new token alone, with the "
                          "cache the previous call returned. Likely mistake: "
                          + (f"{whole}." if whole else
                             "the cache is not used: the whole sequence is fed again at every step."
                             if len(fed) > 1 and fed[1] > 1 else
                             f"the model is called {len(fed)} times for {N_NEW} new tokens "
                             f"({N_NEW} calls, or {N_NEW + 1} with one after the last token, are right)."),
                          "model(next_token, past)"),
                          mistake=mistake_key(whole) if whole else "cache_not_used" if len(fed) > 1 and fed[1] > 1
                          else "wrong_number_of_calls")


def _whole_sequence_with_cache(fed: list[int], cached: list[int]) -> Mistake | None:
    """The call that passed a cache with positions it already holds, as a mistake's description."""
    for call, (n_tokens, n_cached) in enumerate(zip(fed, cached)):
        if 0 < n_cached < n_tokens:   # the whole sequence again, with the cache of its start
            return Mistake("whole_sequence_with_cache", f"call {call + 1} fed {n_tokens} tokens with a cache of "
                           f"{n_cached} positions: the cache already holds the earlier tokens, so they are counted "
                           "twice and the new ones get positions past the end. After the first call, feed only the "
                           "new token, with that cache")
    return None


generate_exercise = Exercise(NOTEBOOK, "generate_greedy", produce_generate, judge_generate,
                             forbidden=(FORBIDDEN,), defaults={**DEFAULTS, "batch": 2, "seq": 5},
                             guard=Guard(may_run=LINEAR_KERNELS))
check_generate_greedy = generate_exercise.checker(
    "Grade `generate_greedy` with a KV cache against LlamaForCausalLM's greedy continuation.")
