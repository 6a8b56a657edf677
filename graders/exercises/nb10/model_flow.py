"""Where a learner's ModernDecoder first differs from transformers' LlamaForCausalLM. Its layers and
final norm are the course's (model.with_course_layers), so what can differ is what the model
hands them: the embedding, the cos and sin, each layer's input and cache, the final norm's input,
the unembedding. Hooks on the layers and the final norm record these in the kernel, for the
whole sequence and for the chunk that runs on the cache; the judge walks them in forward order
against Llama's and names the first that differs, by its place and, where it can, its kind."""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

from graders.exercises.nb10 import reference as ref
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.tolerance import close

_LAYER_ARGS = inspect.signature(ref.DecoderLayer.forward)
DEPTH = ref.ModernConfig().n_layers + 1


def record(model: nn.Module, run: Callable, tag: str) -> tuple[object, dict]:
    """`run()` with what the model gave each layer and its final norm, as `{tag}.blocks.{i}.x`,
    `.cos`, `.sin`, `.past.0/1`, `.out`, `.cache.0/1` and `{tag}.ln_final.x`."""
    found: dict[str, torch.Tensor] = {}
    handles = []

    def given(i):
        def hook(module, args, kwargs):
            try:
                bound = _LAYER_ARGS.bind(module, *args, **kwargs).arguments
            except TypeError:
                return
            for name in ("x", "cos", "sin"):
                if isinstance(bound.get(name), torch.Tensor):
                    found[f"{tag}.blocks.{i}.{name}"] = bound[name].detach().clone()
            _pair(found, f"{tag}.blocks.{i}.past", bound.get("past"))
        return hook

    def returned(i):
        def hook(module, args, kwargs, out):
            if isinstance(out, tuple) and len(out) == 2:
                found[f"{tag}.blocks.{i}.out"] = out[0].detach().clone()
                _pair(found, f"{tag}.blocks.{i}.cache", out[1])
        return hook

    blocks = getattr(model, "blocks", None)
    for i, block in enumerate(blocks if isinstance(blocks, nn.ModuleList) else ()):
        handles.append(block.register_forward_pre_hook(given(i), with_kwargs=True))
        handles.append(block.register_forward_hook(returned(i), with_kwargs=True))
    if isinstance(getattr(model, "ln_final", None), nn.Module):
        handles.append(model.ln_final.register_forward_pre_hook(
            lambda module, args: found.__setitem__(f"{tag}.ln_final.x", args[0].detach().clone())
            if args and isinstance(args[0], torch.Tensor) else None))
    try:
        return run(), found
    finally:
        for handle in handles:
            handle.remove()


def _pair(found: dict, key: str, pair) -> None:
    if isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, torch.Tensor) for t in pair):
        found[f"{key}.0"], found[f"{key}.1"] = pair[0].detach().clone(), pair[1].detach().clone()


def llama_steps(hf, tokens: torch.Tensor) -> dict:
    """Llama's values at the same places, on the whole sequence: the embedding, each layer's
    input, cos, sin and output, and the final norm's input."""
    found, handles = {}, []
    layers = hf.model.layers
    for i, layer in enumerate(layers):
        def given(module, args, kwargs, i=i):
            found[f"blocks.{i}.x"] = args[0].detach().clone()
            cos, sin = kwargs["position_embeddings"]
            found[f"blocks.{i}.cos"], found[f"blocks.{i}.sin"] = cos[0].detach().clone(), sin[0].detach().clone()

        def returned(module, args, out, i=i):
            found[f"blocks.{i}.out"] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        handles += [layer.register_forward_pre_hook(given, with_kwargs=True), layer.register_forward_hook(returned)]
    handles.append(hf.model.norm.register_forward_pre_hook(
        lambda module, args: found.__setitem__("ln_final.x", args[0].detach().clone())))
    try:
        with torch.no_grad():
            found["logits"] = hf(tokens).logits
    finally:
        for handle in handles:
            handle.remove()
    return found


def _same(actual, expected) -> bool:
    """Within the tolerance of a value that went through every layer (rounding adds up)."""
    return isinstance(actual, torch.Tensor) and actual.shape == expected.shape and close(actual, expected, DEPTH)


def _scale_of(actual, expected) -> float | None:
    """c when actual = c * expected (the embedding scaled), else None."""
    if not (isinstance(actual, torch.Tensor) and actual.shape == expected.shape):
        return None
    c = float((actual * expected).sum() / expected.pow(2).sum())
    return c if _same(actual, c * expected) else None


def diverged(what: str, outputs: dict, steps: dict, tag: str, cfg: ref.ModernConfig, positions: range,
             w: dict, tokens: torch.Tensor, logits) -> None:
    """Raise, naming the first place in forward order where the model's `tag` run (on `positions`)
    differs from Llama's on the whole sequence; return when every recorded place agrees."""
    start, stop = positions.start, positions.stop

    def at(key):
        return steps[key][..., start:stop, :] if not key.endswith((".cos", ".sin")) else steps[key][start:stop]

    def fail(place: str, kind: Mistake) -> None:
        where = f" from position {start} on (the chunk that runs on the cache)" if start else ""
        raise CheckFailed(f"{what}: the first place in forward order that differs from LlamaForCausalLM's"
                          f"{where} is {place}. Likely mistake: {kind}.", mistake=mistake_key(kind))

    x0, embedding = outputs.get(f"{tag}.blocks.0.x"), at("blocks.0.x")
    if x0 is not None and not _same(x0, embedding):
        scale = _scale_of(x0, embedding)
        tied = w["W_U"].T[tokens[:, start:stop]]
        fail("the embedding (what blocks[0] reads)",
             Mistake("embedding_scaled", f"the embedding is multiplied by {scale:.4g}: Llama's is W_E[tokens], "
                     "unscaled") if scale is not None
             else Mistake("embedding_from_w_u", "the embedding is read from W_U: it is W_E[tokens]") if _same(x0, tied)
             else Mistake("embedding_wrong", "the embedding is not W_E[tokens]"))
    n_layers = cfg.n_layers
    for i in range(n_layers):
        cos, sin = outputs.get(f"{tag}.blocks.{i}.cos"), outputs.get(f"{tag}.blocks.{i}.sin")
        want_cos, want_sin = at(f"blocks.{i}.cos"), at(f"blocks.{i}.sin")
        if cos is not None and sin is not None and not (_same(cos, want_cos) and _same(sin, want_sin)):
            fail(f"the cos and sin given to blocks[{i}]", _rope_kind(cos, sin, want_cos, want_sin, start, cfg))
        x = outputs.get(f"{tag}.blocks.{i}.x")
        if i and x is not None and not _same(x, at(f"blocks.{i}.x")):
            fail(f"the input of blocks[{i}]", _fed_from(x, outputs, tag, i, n_layers))
        if start:
            kind = _cache_kind(outputs, tag, i, n_layers)
            if kind:
                fail(f"the cache given to blocks[{i}]", kind)
    last = outputs.get(f"{tag}.ln_final.x")
    if last is not None and not _same(last, at("ln_final.x")):
        fail("the final norm's input", _fed_from(last, outputs, tag, n_layers, n_layers))
    if isinstance(logits, torch.Tensor) and not _same(logits, at("logits")):
        normed = ref.rms_norm(at("ln_final.x"), w["ln_final.w"], cfg.rms_norm_eps)
        fail("the logits", Mistake("no_final_norm", "the final RMSNorm is missing: logits = ln_final(x) @ W_U")
             if last is None and _same(logits, at("ln_final.x") @ w["W_U"]) else
             Mistake("unembedding_tied", "the unembedding is tied to W_E: logits = ln_final(x) @ W_U, a matrix of "
                     "its own")
             if _same(logits, normed @ w["W_E"].T) else Mistake("logits_wrong", "the logits are not "
                                                                "ln_final(x) @ W_U"))


def _rope_kind(cos, sin, want_cos, want_sin, start: int, cfg: ref.ModernConfig) -> Mistake:
    if _same(cos, want_sin) and _same(sin, want_cos):
        return Mistake("cos_sin_swapped", "cos and sin are swapped")
    n, default = cos.shape[0], ref.ModernConfig().rope_theta
    if start and all(map(_same, (cos, sin), ref.rope_cos_sin(torch.arange(n), cfg.d_head, cfg.rope_theta))):
        return Mistake("positions_restart_in_cache", "positions restart at 0 in the cached chunk: its positions "
                       "are past_len, past_len + 1, ... (past_len = the cached keys' length)")
    if cfg.rope_theta != default and all(map(_same, (cos, sin), ref.rope_cos_sin(
            torch.arange(start, start + n), cfg.d_head, default))):
        return Mistake("rope_theta_not_from_config", f"rope_theta is not read from the config: cos and sin use "
                       f"{default:g} where this config has {cfg.rope_theta:g} (pass self.cfg.rope_theta to "
                       "rope_cos_sin)")
    return Mistake("cos_sin_wrong", "they are not rope_cos_sin(positions, d_head, cfg.rope_theta) for this chunk's "
                   f"positions {start} to {start + n - 1}")


def _fed_from(x, outputs: dict, tag: str, i: int, n_layers: int) -> Mistake:
    """What the input of layer i (or the final norm, i = n_layers) is, among the earlier values."""
    final = i == n_layers
    rule = ("the final norm reads the last layer's output" if i == n_layers
            else "each layer reads the previous layer's output")
    for j in range(i - 2, -1, -1):
        if _same(x, outputs.get(f"{tag}.blocks.{j}.out", torch.empty(0))):
            return Mistake("final_norm_skips_layers" if final else "layer_skipped",
                           f"it is blocks[{j}]'s output: {rule}")
    if _same(x, outputs.get(f"{tag}.blocks.0.x", torch.empty(0))):
        return Mistake("final_norm_reads_embedding" if final else "layer_reads_embedding",
                       f"it is the embedding: {rule}")
    return Mistake("final_norm_input_wrong" if final else "layer_input_wrong",
                   f"it is not blocks[{i - 1}]'s output: {rule}")


def _cache_kind(outputs: dict, tag: str, i: int, n_layers: int) -> Mistake | None:
    """How the cache given to layer i in the cached chunk differs from the one layer i returned
    in the first chunk (None when it is that one)."""
    given = [outputs.get(f"{tag}.blocks.{i}.past.{k}") for k in (0, 1)]
    own = [outputs.get(f"first.blocks.{i}.cache.{k}") for k in (0, 1)]
    if any(t is None for t in own):
        return None
    if any(t is None for t in given):
        return Mistake("no_cache_to_layers", "the layers get no cache: pass past[i] to blocks[i]")
    if all(_same(g, o) for g, o in zip(given, own)):
        return None
    for j in range(n_layers):
        other = [outputs.get(f"first.blocks.{j}.cache.{k}") for k in (0, 1)]
        if j != i and all(o is not None and _same(g, o) for g, o in zip(given, other)):
            return Mistake("layer_0_cache_everywhere" if j == 0 else "another_layer_cache",
                           f"blocks[{i}] is given layer {j}'s cache"
                           + (": every layer gets layer 0's" if j == 0 else "") + "; pass past[i] to blocks[i]")
    return Mistake("cache_wrong", "it is not the (keys, values) blocks[i] returned for the first chunk")
