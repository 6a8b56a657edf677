"""Where a learner's DecoderLayer first differs from transformers' LlamaDecoderLayer: the course's
parts sit under the learner's names (model.with_course_parts), so what can differ is how they
are wired. Forward hooks on ln1, attn, ln2 and mlp read each step, in forward order; the first
one that differs is named by its place in Llama's layer, and compared with what each known
wiring mistake makes there (graders.exercises.common.divergence)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from graders.exercises.common.properties import as_combination, combination_words
from graders.exercises.common.submodules import module_or_none, watch
from graders.judging.compare import Mistake
from graders.judging.tolerance import close

PARTS = ("ln1", "attn", "ln2", "mlp")
HOOKS = ("ln1.out", "attn.out", "resid_mid", "ln2.out", "mlp.out", "out")
# Each step as transformers' Llama names it.
PLACES = {
    "ln1.out": "ln1's output (Llama's input_layernorm)",
    "attn.out": "attn's output (Llama's self_attn)",
    "resid_mid": "the stream after attention's residual, what ln2 reads (Llama's post_attention_layernorm input)",
    "ln2.out": "ln2's output (Llama's post_attention_layernorm)",
    "mlp.out": "mlp's output (Llama's mlp)",
    "out": "the layer's output, after the MLP's residual",
}
HINTS = {
    "ln1.out": "ln1 reads the layer's input x, before attention (pre-norm).",
    "attn.out": "attn reads ln1(x), with cos, sin and past.",
    "resid_mid": "x = x + attn_out is what ln2 reads.",
    "ln2.out": "ln2 normalises x + attn_out.",
    "mlp.out": "the MLP reads ln2(x + attn_out).",
    "out": "the output is (x + attn_out) + mlp_out.",
}
TAPS = (("ln1.out", "ln1", 1), ("attn.out", "attn", 1), ("resid_mid", "ln2", 0), ("ln2.out", "ln2", 1),
        ("mlp.out", "mlp", 1))


def layer_trace(layer: nn.Module, x: torch.Tensor, cos, sin, forward: Callable | None = None,
                runner: Callable | None = None) -> dict:
    """The layer's steps, read with hooks on its parts, plus how often each part was called."""
    named = {name: module_or_none(layer, name) for name in PARTS}
    out, trace, rec = watch(named, forward or (lambda v: layer(v, cos, sin)), x, TAPS, runner)
    trace["out"] = out[0] if isinstance(out, tuple) else out
    for name in PARTS:
        trace[f"calls.{name}"] = torch.tensor(rec.count(name))
        module = named[name]
        if module is not None and sum(m is module for m in named.values()) == 1:   # not shared with another name
            for k, (given, returned) in enumerate(rec.calls.get(id(module), [])[1:4], start=1):
                trace.update({f"{name}.in.{k}": given, f"{name}.out.{k}": returned})
    return {key: value for key, value in trace.items() if value is not None}


def llama_trace(hf_layer: nn.Module, x: torch.Tensor, cos, sin, mask) -> dict:
    """The same steps of transformers' LlamaDecoderLayer."""
    named = {"ln1": hf_layer.input_layernorm, "attn": hf_layer.self_attn,
             "ln2": hf_layer.post_attention_layernorm, "mlp": hf_layer.mlp}
    with torch.no_grad():
        out, trace, _ = watch(named, lambda v: hf_layer(v, attention_mask=mask,
                                                         position_embeddings=(cos[None], sin[None])), x, TAPS)
    trace["out"] = out[0] if isinstance(out, tuple) else out
    return trace


def _attn(layer, v, cos, sin):
    return layer.attn(v, cos, sin)[0]


def wiring_mistakes(cos, sin) -> dict[str, Callable]:
    """Each known wiring mistake as a forward of a layer with the course's parts."""
    def attn(b, v):
        return _attn(b, v, cos, sin)

    def then_mlp(b, m, norm=None):
        return m + b.mlp((norm or b.ln2)(m))

    return {
        Mistake("post_norm", "post-norm: the RMSNorms go before each sublayer (x + attn(ln1(x))), not after the "
                "addition"):
            lambda b, x: (lambda m: b.ln2(m + b.mlp(m)))(b.ln1(x + attn(b, x))),
        Mistake("parallel_block", "attention and the MLP both read the layer's input (a parallel block): the MLP "
                "reads the stream after attention's output is added"):
            lambda b, x: x + attn(b, b.ln1(x)) + b.mlp(b.ln2(x)),
        Mistake("no_attention_residual", "the residual is not added around attention: x = x + attn(ln1(x))"):
            lambda b, x: then_mlp(b, attn(b, b.ln1(x))),
        Mistake("no_mlp_residual", "the residual is not added around the MLP: the output is x + mlp(ln2(x))"):
            lambda b, x: (lambda m: b.mlp(b.ln2(m)))(x + attn(b, b.ln1(x))),
        Mistake("ln1_ln2_swapped", "ln1 and ln2 are swapped: ln1 before attention, ln2 before the MLP"):
            lambda b, x: then_mlp(b, x + attn(b, b.ln2(x)), b.ln1),
        Mistake("ln1_before_mlp", "ln1 is used before the MLP too, where ln2 belongs"):
            lambda b, x: then_mlp(b, x + attn(b, b.ln1(x)), b.ln1),
        Mistake("ln2_before_attention", "ln2 is used before attention too, where ln1 belongs"):
            lambda b, x: then_mlp(b, x + attn(b, b.ln2(x))),
        Mistake("no_ln1", "attention reads the raw stream x: ln1 is skipped"): lambda b, x: then_mlp(b, x + attn(b, x)),
        Mistake("no_ln2", "the MLP reads the raw stream: ln2 is skipped"):
            lambda b, x: then_mlp(b, x + attn(b, b.ln1(x)), nn.Identity()),
    }


def mistake_traces(course: nn.Module, x: torch.Tensor, cos, sin) -> dict[str, dict]:
    """What each wiring mistake makes of the course's layer, step by step."""
    with torch.no_grad():
        return {description: layer_trace(course, x, cos, sin, forward=lambda v, f=forward: f(course, v))
                for description, forward in wiring_mistakes(cos, sin).items()}


def combination_traces(outputs: dict, expected: dict, x: torch.Tensor) -> dict[str, dict]:
    """Residual additions nobody listed (a branch scaled, a residual dropped or doubled, a sublayer
    applied twice): the stream after each addition written as a combination of what was added,
    and of what any further call of attn or mlp returned, when it is one."""
    found = {}
    more = {f"{name}'s {ORDINALS[k]} call's output": outputs[f"{name}.out.{k}"] for name in ("attn", "mlp")
            for k in ORDINALS if isinstance(outputs.get(f"{name}.out.{k}"), torch.Tensor)
            and outputs[f"{name}.out.{k}"].shape == x.shape}
    for key, what, terms, right in (
            ("resid_mid", "the stream ln2 reads", {"x": x, "attn_out": expected["attn.out"]}, "x + attn_out"),
            ("out", "the layer's output", {"(x + attn_out)": expected["resid_mid"], "mlp_out": expected["mlp.out"]},
             "(x + attn_out) + mlp_out")):
        actual = outputs.get(key)
        if not (isinstance(actual, torch.Tensor) and actual.shape == x.shape and actual.is_floating_point()):
            continue
        # A further call that returned what a term is (attn called again on the same input for its
        # cache) adds nothing to the fit, and would split that term's coefficient in two.
        further = {name: t for name, t in more.items() if not any(close(t, term) for term in terms.values())}
        fit = as_combination(actual, {**terms, **further})
        if fit is None or all(abs(c - (name in terms)) < 1e-3 for name, c in fit.items()):
            continue
        repeated = [name for name, c in fit.items() if name in further and abs(c) > 1e-3]
        line = Mistake(RESIDUAL_KEYS[key], f"{what} is {combination_words(fit)}, not {right}")
        if repeated:
            line = Mistake("attention_applied_again" if repeated[0].startswith("attn'") else "mlp_applied_again",
                           f"{_repeated_words(repeated[0], outputs, expected)}: {line}")
        found[line] = {key: sum(c * {**terms, **further}[name].double() for name, c in fit.items())}
    return found


ORDINALS = {1: "second", 2: "third", 3: "fourth"}
# The key of a residual sum nobody listed, by the place it is read at.
RESIDUAL_KEYS = {"resid_mid": "attention_residual_miscombined", "out": "mlp_residual_miscombined"}


def _repeated_words(term: str, outputs: dict, expected: dict) -> str:
    """"attention is applied twice ...", with what the second call read when that is the stream
    after the first call's residual (the step repeated as it stands)."""
    name = term.split("'")[0]
    sublayer, norm, stream = (("attention", "ln1", "resid_mid") if name == "attn" else ("the MLP", "ln2", "out"))
    calls = int(outputs.get(f"calls.{name}", 0))
    said = f"{sublayer} is applied {'twice' if calls == 2 else f'{calls} times'} (self.{name} called {calls}x)"
    second_input = outputs.get(f"{norm}.in.1")
    if (name == "attn" and isinstance(second_input, torch.Tensor) and second_input.shape == expected[stream].shape
            and close(second_input, expected[stream])):
        said += ": the second time on ln1(x + attn_out), the step x = x + attn(ln1(x)) written twice"
    return said + "; the layer applies it once"
