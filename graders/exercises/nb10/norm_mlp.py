"""Notebook 10, exercises 1 and 3: `RMSNorm` and the `SwiGLU` MLP, judged against transformers'
LlamaRMSNorm and LlamaMLP loaded with the same seeded weights. A mistake no catalog lists is
named from the output's properties (graders.exercises.common.properties): RMSNorm's from how it scales
with the weight and from each row's direction and length; the MLP's as the reference plus its
input, times a factor or reordered; a matrix used or declared transposed from its sizes."""
from __future__ import annotations

import copy
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises.common.diagnosis import crash, is_crash
from graders.judging.compare import LIKELY, CheckFailed, Mistake, check_shape, compare, mistake_key
from graders.exercises.nb10 import reference as ref
from graders.exercises.common.properties import (is_constant, named_factor, power_mean_divisor, read_output,
                                                 row_lengths, scaling_degree, transposed_declaration,
                                                 transposed_operand)
from graders.judging.cases import Case
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, build_loaded, run_learner
from graders.judging.tolerance import close_in_half
from graders.reference.weights import component
from graders.integrity.library_kernels import LINEAR_KERNELS, RMS_NORM_CODE, RMS_NORM_KERNELS

NOTEBOOK = "10_modern_decoder"
DIMS = ("batch", "position", "d_model")
DEFAULTS = {"text": None, "batch": 2, "seq": 12}
SIZES = {"d_model": ref.ModernConfig().d_model, "d_mlp": ref.ModernConfig().d_mlp}
NORM_FORBIDDEN = Forbidden("RMSNorm", targets=[(F, "rms_norm"), (torch, "rms_norm"), (nn.RMSNorm, "forward")],
                           source_words=["F.rms_norm", "torch.rms_norm", "nn.RMSNorm"],
                           kernels=RMS_NORM_KERNELS, library_code=RMS_NORM_CODE)
MLP_FORBIDDEN = Forbidden("the SwiGLU MLP", targets=[(nn.Linear, "forward"), (F, "linear")],
                          source_words=["nn.Linear", "F.linear"],
                          instead="with matrix products of your parameters", kernels=LINEAR_KERNELS)


def config(n_kv_heads: int = 2, **settings) -> ref.ModernConfig:
    """The checks' config: another number of KV heads, or a hidden case's settings (`Case.settings`)."""
    from dataclasses import replace

    return replace(ref.ModernConfig(), n_kv_heads=n_kv_heads, **settings)


@lru_cache(maxsize=6)
def hf_weights(seed: int, n_kv_heads: int = 2) -> dict:
    return ref.random_hf_weights(config(n_kv_heads), seed)


@lru_cache(maxsize=6)
def weights(seed: int, n_kv_heads: int = 2) -> dict:
    """The seeded weights under the course's names (what the learner's modules are loaded with)."""
    return ref.course_weights(hf_weights(seed, n_kv_heads), config(n_kv_heads))


@lru_cache(maxsize=6)
def hf_model(seed: int, n_kv_heads: int = 2, **settings):
    """The judge's LlamaForCausalLM for a seed (a number of KV heads, a hidden case's settings)."""
    return ref.hf_model(config(n_kv_heads, **settings), hf_weights(seed, n_kv_heads))


# --- RMSNorm -----------------------------------------------------------------------------------

def _quiet(x: torch.Tensor) -> torch.Tensor:
    """`x` shrunk until its mean square is about eps: where eps's place in the formula shows."""
    return x * (1e-6 / x.pow(2).mean(-1, keepdim=True)).sqrt()


def _norm_inputs(case: Case) -> list[torch.Tensor]:
    x = ref.seeded_input(case.seed, case.batch, case.seq, ref.ModernConfig().d_model)
    return [x, _quiet(x)]


def _half_input(case: Case) -> torch.Tensor:
    """A float16 stream of root mean square 400: its squares (1.6e5) overflow float16 (largest
    65,504), which is why transformers normalises in float32."""
    x = ref.seeded_input(case.seed + 7, case.batch, case.seq, ref.ModernConfig().d_model)
    return (x * (400 / x.pow(2).mean(-1, keepdim=True).sqrt())).half()


def produce_rms_norm(RMSNorm, case: Case, inputs: dict) -> dict:
    cfg = case.config(ref.ModernConfig())
    inputs = _norm_inputs(case)
    norm = build_loaded("RMSNorm", RMSNorm, cfg, component(weights(case.seed), "blocks.1.ln1"))
    outputs = {f"out_{i}": run_learner("RMSNorm", norm, x, forbidden=NORM_FORBIDDEN) for i, x in enumerate(inputs)}
    # How the output scales with the weight (read_rms_norm): the first stream, the weight doubled.
    doubled = {name: 2 * w for name, w in component(weights(case.seed), "blocks.1.ln1").items()}
    try:
        outputs["out_w_doubled"] = run_learner("RMSNorm", build_loaded("RMSNorm", RMSNorm, cfg, doubled), inputs[0],
                                               forbidden=NORM_FORBIDDEN)
    except CheckFailed as failure:   # a module that runs on the real weights only is judged without it
        if not is_crash(failure):
            raise
    outputs["half_out"] = run_learner("RMSNorm (a float16 model)", norm.half(), _half_input(case),
                                      forbidden=NORM_FORBIDDEN)
    return outputs


def rms_norm_mistakes(x: torch.Tensor, w: torch.Tensor, eps: float) -> dict:
    ms = x.pow(2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    found = {
        Mistake("mean_subtracted", "the mean is subtracted (that is LayerNorm): RMSNorm divides x itself by its "
                "root mean square, with no centring and no bias"):
            centred / (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w,
        Mistake("divides_by_std", "x is divided by its standard deviation (the centred variance): RMSNorm divides "
                "by the root of mean(x**2), x not centred"):
            x / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt() * w,
        Mistake("eps_outside_root", "eps is added outside the square root: it belongs inside, "
                "sqrt(mean(x**2) + eps)"):
            x / (ms.sqrt() + eps) * w,
        Mistake("no_eps", "eps is missing: sqrt(mean(x**2) + eps)"): x / ms.sqrt() * w,
        Mistake("no_sqrt", "the square root is missing: x / sqrt(mean(x**2) + eps)"): x / (ms + eps) * w,
        Mistake("no_weight", "the learned weight w is not applied"): x / (ms + eps).sqrt(),
        Mistake("one_plus_weight", "the weight is applied as (1 + w), Gemma's convention: Llama multiplies by w"):
            x / (ms + eps).sqrt() * (1 + w),
        Mistake("divides_by_norm", "dividing by the norm sqrt(sum(x**2)) instead of the root mean square "
                "sqrt(mean(x**2))"):
            x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt() * w,
    }
    for dim, axis, key in ((1, "positions", "mean_square_over_positions"), (0, "the batch", "mean_square_over_batch")):
        found[Mistake(key, f"the mean square is taken over {axis} (dim {dim}): it is over d_model, the last axis")] = \
            x / (x.pow(2).mean(dim, keepdim=True) + eps).sqrt() * w
    found[Mistake("mean_square_over_everything", "the mean square is taken over the whole tensor: it is over "
                  "d_model, per position")] = \
        x / (x.pow(2).mean() + eps).sqrt() * w
    default = ref.ModernConfig().rms_norm_eps
    if eps != default:
        found[Mistake("eps_not_from_config", f"eps is not read from the config: {default:g} is used where this "
                      f"config's rms_norm_eps is {eps:g} (use self.cfg.rms_norm_eps)")] = x / (ms + default).sqrt() * w
    return found


def read_rms_norm(actual: torch.Tensor, outputs: dict, x: torch.Tensor, expected: torch.Tensor,
                  eps: float) -> str | None:
    """A mistake nobody listed, named from the output's properties: how it scales with the
    weight (once, as x / rms(x) * w does), then whether each row keeps its direction and, if so,
    what its length says x was divided by."""
    doubled = outputs.get("out_w_doubled")
    degree = scaling_degree(actual, doubled, 2.0) if isinstance(doubled, torch.Tensor) else None
    if degree is not None and abs(degree) < 1e-3:
        return Mistake("weight_before_normalising", "your output does not change when the weight w is doubled: w "
                       "is applied before normalising, and the normalisation undoes it. Normalise x first, then "
                       "multiply by w")
    if degree is not None and abs(degree - 1) > 1e-3:
        return Mistake("weight_applied_twice" if abs(degree - 2) < 1e-3 else "weight_not_applied_once",
                       f"doubling the weight w multiplies your output by {2 ** degree:.3g}, where it doubles "
                       f"x / rms(x) * w" + (": w is applied twice" if abs(degree - 2) < 1e-3 else
                                             ": w multiplies the normalised x once"))
    lengths = row_lengths(actual, expected)
    if lengths is not None:
        if is_constant(lengths):
            return Mistake("scaled_by_a_constant", f"every row points the right way but is "
                           f"{named_factor(lengths.mean().item(), SIZES)} times as long, the same factor everywhere: "
                           "RMSNorm's output is x / sqrt(mean(x**2) + eps) * w, with no other factor")
        divisor = (x.double().pow(2).mean(-1) + eps).sqrt().flatten() / lengths
        what = power_mean_divisor(divisor, x, SIZES)
        if what:
            return Mistake("divides_by_another_mean", f"each row's direction is right but its length is not: x is "
                           f"divided by {what}; RMSNorm divides by the root mean square, sqrt(mean(x**2) + eps)")
        return Mistake("wrong_divisor", f"each row's direction is right but its length is not (off by a factor from "
                       f"{lengths.min().item():.3g} to {lengths.max().item():.3g}, changing from row to row): what x "
                       "is divided by is not sqrt(mean(x**2) + eps)")
    return None


def _hf_norm(case: Case, eps: float) -> nn.Module:
    norm = copy.deepcopy(hf_model(case.seed).model.layers[1].input_layernorm)
    norm.variance_epsilon = eps
    return norm


def judge_rms_norm(case: Case, outputs: dict) -> None:
    eps = case.config(ref.ModernConfig()).rms_norm_eps
    hf_norm, w = _hf_norm(case, eps), weights(case.seed)["blocks.1.ln1.w"]
    for i, (x, what) in enumerate(zip(_norm_inputs(case), ("a residual stream",
                                                            "a residual stream with mean square close to eps"))):
        with torch.no_grad():
            expected = hf_norm(x)
        compare(f"RMSNorm on {what} {list(x.shape)}", outputs.get(f"out_{i}"), expected, DIMS,
                mistakes=lambda: rms_norm_mistakes(x, w, eps),
                hint="x / sqrt(mean(x**2 over d_model) + eps) * w, in float32.",
                reading=None if i else lambda actual: read_rms_norm(actual, outputs, x, expected, eps))
    _judge_half(outputs.get("half_out"), hf_norm, _half_input(case))


def _judge_half(actual, hf_norm: nn.Module, x: torch.Tensor) -> None:
    what = f"RMSNorm in a float16 model, on a stream of root mean square 400 {list(x.shape)}"
    with torch.no_grad():
        expected = hf_norm.half()(x)
    check_shape(what, actual, tuple(expected.shape), DIMS)
    if actual.dtype != torch.float16:
        raise CheckFailed(f"{what}: your output is {actual.dtype}, LlamaRMSNorm's is float16. Likely mistake: "
                          "the normalised x is not cast back to x's dtype (.to(x.dtype)) before the weight.",
                          mistake="not_cast_back")
    if close_in_half(actual, expected):
        return
    overflowed = not torch.isfinite(actual).all() or bool((actual == 0).any())
    raise CheckFailed(f"{what}: your output differs from LlamaRMSNorm's by up to "
                      f"{(actual.float() - expected.float()).abs().nan_to_num(float('inf')).max():.3g}. "
                      + ("Likely mistake: the mean square is computed in float16, where x**2 overflows (its "
                         "largest number is 65,504): compute it in float32 (x.float()), then cast back."
                         if overflowed else "Normalise in float32 (x.float()), cast back to x's dtype, then "
                         "apply the weight."), mistake="mean_square_in_float16" if overflowed else None)


rms_norm_exercise = Exercise(NOTEBOOK, "RMSNorm", produce_rms_norm, judge_rms_norm,
                             forbidden=(NORM_FORBIDDEN,), defaults=DEFAULTS)
check_rms_norm = rms_norm_exercise.checker(
    "Grade `RMSNorm` against transformers' LlamaRMSNorm (seeded weight and residual streams).")


# --- SwiGLU ------------------------------------------------------------------------------------

def _mlp_input(case: Case) -> torch.Tensor:
    x = ref.seeded_input(case.seed + 50, case.batch, case.seq, ref.ModernConfig().d_model)
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()     # what the MLP reads: an RMS-normed stream


def produce_swiglu(SwiGLU, case: Case, inputs: dict) -> dict:
    part = component(weights(case.seed), f"blocks.{case.block}.mlp")
    try:
        mlp = build_loaded("SwiGLU", SwiGLU, ref.ModernConfig(), part)
    except CheckFailed as failure:
        declared = transposed_declaration(str(failure))
        if declared is None:
            raise
        raise CheckFailed(f"{str(failure).splitlines()[0]} {LIKELY} {declared}.\n"
                          + "\n".join(str(failure).splitlines()[1:]), mistake=mistake_key(declared)) from None
    try:
        return {"out": run_learner("SwiGLU", mlp, _mlp_input(case), forbidden=MLP_FORBIDDEN)}
    except CheckFailed as failure:
        used = transposed_operand(str(failure), {name: tuple(w.shape) for name, w in part.items()})
        if used is None or not is_crash(failure):
            raise
        raise crash("SwiGLU", failure, "an input " + str(list(_mlp_input(case).shape)), used) from failure.__cause__


# Activations a gate might be given, by name: the one the output matches is named.
ACTIVATIONS = {
    "SiLU": F.silu, "GELU": F.gelu, "GELU (tanh approximation)": lambda z: F.gelu(z, approximate="tanh"),
    "ReLU": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "softplus": F.softplus, "ELU": F.elu,
    "Mish": F.mish, "leaky ReLU": F.leaky_relu, "no activation": lambda z: z,
}
# Their parts of the keys of the mistakes that use them.
ACTIVATION_KEYS = {
    "SiLU": "silu", "GELU": "gelu", "GELU (tanh approximation)": "gelu_tanh", "ReLU": "relu", "sigmoid": "sigmoid",
    "tanh": "tanh", "softplus": "softplus", "ELU": "elu", "Mish": "mish", "leaky ReLU": "leaky_relu",
    "no activation": "no_activation",
}
# How the two branches might be combined, with what each says (SiLU's own wording).
STRUCTURES = {
    "gate": (lambda a, g, u: a(g) * u, ""),
    "swapped": (lambda a, g, u: a(u) * g, Mistake("gate_up_swapped", "gate and up are swapped: SiLU goes on the "
                                                                     "gate branch, silu(x @ W_gate) * (x @ W_up)")),
    "both": (lambda a, g, u: a(g) * a(u), Mistake("activation_on_both", "the activation is applied to both "
                                                                        "branches: only the gate goes through SiLU")),
    "self": (lambda a, g, u: a(g) * g, Mistake("gate_times_gate", "silu(gate) * gate (the SiLU formula z * "
                                                                  "sigmoid(z) mixed up with the gating): the gate's "
                                                                  "SiLU multiplies the *up* branch, x @ W_up")),
    "after": (lambda a, g, u: a(g * u), Mistake("activation_after_product", "the activation is applied after the "
                                                                            "product: silu(x @ W_gate) * (x @ W_up), "
                                                                            "not silu((x @ W_gate) * (x @ W_up))")),
    "no up": (lambda a, g, u: a(g), Mistake("no_up", "the up projection is missing from the product: "
                                                     "silu(x @ W_gate) * (x @ W_up)")),
    "no gate": (lambda a, g, u: a(u), Mistake("no_gate", "the gate projection is missing: silu(x @ W_gate) "
                                                         "multiplies x @ W_up")),
    "sum": (lambda a, g, u: a(g) + u, Mistake("branches_added", "the branches are added: SwiGLU multiplies them, "
                                                                "silu(gate) * up")),
}


def swiglu_mistakes(x: torch.Tensor, w: dict) -> dict:
    """Every way of combining the gate and up branches with every activation, but the right one."""
    gate, up = x @ w["W_gate"], x @ w["W_up"]
    found = {}
    for name, activation in ACTIVATIONS.items():     # SiLU's first: silu(g) is also sigmoid(g) * g
        for structure, (combine, says) in STRUCTURES.items():
            if structure == "gate" and name == "SiLU":
                continue
            if structure == "gate":
                description = Mistake(f"{ACTIVATION_KEYS[name]}_instead_of_silu",
                                      f"{name} instead of SiLU on the gate: SwiGLU's gate is silu(z) = z * sigmoid(z)")
            else:
                description = Mistake(says.key + ("" if name == "SiLU" else f"_and_{ACTIVATION_KEYS[name]}"),
                                      says + ("" if name == "SiLU" else f" (and {name} where SiLU belongs)"))
            found[description] = combine(activation, gate, up) @ w["W_down"]
    return found


def judge_swiglu(case: Case, outputs: dict) -> None:
    x = _mlp_input(case)
    with torch.no_grad():
        expected = hf_model(case.seed).model.layers[case.block].mlp(x)
    compare(f"SwiGLU on an input {list(x.shape)}", outputs.get("out"), expected, DIMS,
            mistakes=lambda: swiglu_mistakes(x, component(weights(case.seed), f"blocks.{case.block}.mlp")),
            hint="(silu(x @ W_gate) * (x @ W_up)) @ W_down, no biases.",
            reading=lambda actual: read_output(actual, expected, x, "the MLP", DIMS, SIZES))


swiglu_exercise = Exercise(NOTEBOOK, "SwiGLU", produce_swiglu, judge_swiglu,
                           forbidden=(MLP_FORBIDDEN,), defaults=DEFAULTS)
check_swiglu = swiglu_exercise.checker(
    "Grade the `SwiGLU` MLP against transformers' LlamaMLP (seeded weights and inputs).")
