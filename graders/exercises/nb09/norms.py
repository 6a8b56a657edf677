"""Notebook 09, exercise 2: the post-norm block (LayerNorm after each residual addition).

    resid_mid  = ln1(resid_pre + attn(resid_pre))
    resid_post = ln2(resid_mid + mlp(resid_mid))

built from the course's Attention, MLP and LayerNorm and judged against the course's own
post-norm block with the same seeded weights. When the output differs, forward hooks on the
learner's submodules find the first value, in forward order, that differs: what attention reads,
its output, what ln1 normalises, resid_mid, the MLP's output, what ln2 normalises, the output.
BERT's encoder block (graders.exercises.nb09.encoder) is judged the same way.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from graders.exercises.nb09.tasks import block_config, seeded_residual, spread_weights
from graders.exercises.common.divergence import first_divergence
from graders.exercises.common.submodules import watch
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, with_fix
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, build_loaded, run_learner
from graders.judging.tolerance import close
from graders.reference import bert
from graders.reference.weights import load_strict
from graders.integrity.library_kernels import ENCODER_LAYER_CODE, ENCODER_LAYER_KERNELS

DIMS = ("batch", "position", "d_model")
SUBMODULES = ("attn", "ln1", "mlp", "ln2")
# (key, submodule, 0 = its input / 1 = its output), in forward order.
HOOKS = (("attn_in", "attn", 0), ("attn_out", "attn", 1), ("ln1_in", "ln1", 0), ("resid_mid", "ln1", 1),
         ("mlp_in", "mlp", 0), ("mlp_out", "mlp", 1), ("ln2_in", "ln2", 0))
ORDER = [key for key, _, _ in HOOKS] + ["resid_post"]
HINTS = {
    "attn_in": "post-norm: attention reads the block's input resid_pre itself (no LayerNorm before it).",
    "attn_out": "attention's output is attention applied to the block's input.",
    "ln1_in": "ln1 normalises the block's input plus attention's output (the first residual connection).",
    "resid_mid": "resid_mid is ln1's output: the first residual sum, normalised.",
    "mlp_in": "the MLP reads resid_mid, ln1's output.",
    "mlp_out": "the MLP's output is the MLP applied to resid_mid.",
    "ln2_in": "ln2 normalises resid_mid plus the MLP's output (the second residual connection).",
    "resid_post": "the block's output is ln2's: the second residual sum, normalised.",
}
# The corrected line of each place (the notebook's names).
RESID_MID = "resid_mid = self.ln1(resid_pre + self.attn(resid_pre))"
RESID_POST = "return self.ln2(resid_mid + self.mlp(resid_mid))"
FIXES = {"attn_in": RESID_MID, "attn_out": RESID_MID, "ln1_in": RESID_MID, "resid_mid": RESID_MID,
         "mlp_in": RESID_POST, "mlp_out": RESID_POST, "ln2_in": RESID_POST, "resid_post": RESID_POST}
FORBIDDEN = Forbidden(
    "the post-norm block",
    targets=[(bert.PostNormBlock, "forward"), (nn.TransformerEncoderLayer, "forward")],
    source_words=["nn.TransformerEncoderLayer", "nn.TransformerDecoderLayer", "nn.Transformer"],
    kernels=ENCODER_LAYER_KERNELS, library_code=ENCODER_LAYER_CODE)


def block_trace(block: nn.Module, x: torch.Tensor, forward: Callable | None = None,
                runner: Callable | None = None) -> dict:
    """A block's values at each hook, read from its submodules' inputs and outputs."""
    named = {name: getattr(block, name, None) for name in SUBMODULES}
    out, trace, rec = watch(named, forward or block, x, HOOKS, runner)
    trace["resid_post"] = out
    for name in SUBMODULES:
        trace[f"calls.{name}"] = torch.tensor(rec.count(name))
    trace["shared_ln"] = torch.tensor(named["ln1"] is not None and named["ln1"] is named["ln2"])
    return trace


# Each mistake as a forward of a block with the right submodules.
POST_NORM_MISTAKES: dict[str, Callable] = {
    Mistake("pre_norm", "pre-norm (GPT-2's block): the LayerNorm comes before each sublayer; post-norm normalises "
            "after each residual addition"):
        lambda b, x: (lambda m: m + b.mlp(b.ln2(m)))(x + b.attn(b.ln1(x))),
    Mistake("sublayer_output_normalised", "each sublayer's output is normalised before it is added "
            "(resid_pre + ln1(attn_out)): post-norm normalises the sum"):
        lambda b, x: (lambda m: m + b.ln2(b.mlp(m)))(x + b.ln1(b.attn(x))),
    Mistake("no_attention_residual", "no residual connection around attention: ln1 normalises the block's "
            "input plus attention's output"):
        lambda b, x: (lambda m: b.ln2(m + b.mlp(m)))(b.ln1(b.attn(x))),
    Mistake("no_mlp_residual", "no residual connection around the MLP: ln2 normalises resid_mid plus the "
            "MLP's output"):
        lambda b, x: b.ln2(b.mlp(b.ln1(x + b.attn(x)))),
    Mistake("ln1_ln2_swapped", "ln1 and ln2 are swapped: ln1 follows attention, ln2 follows the MLP"):
        lambda b, x: (lambda m: b.ln1(m + b.mlp(m)))(b.ln2(x + b.attn(x))),
    Mistake("mlp_reads_resid_pre", "the MLP reads resid_pre instead of resid_mid (ln1's output)"):
        lambda b, x: (lambda m: b.ln2(m + b.mlp(x)))(b.ln1(x + b.attn(x))),
    Mistake("second_residual_adds_resid_pre", "the second residual adds resid_pre instead of resid_mid, "
            "ln1's output"):
        lambda b, x: (lambda m: b.ln2(x + b.mlp(m)))(b.ln1(x + b.attn(x))),
    Mistake("no_ln2", "ln2 is missing: the block ends with a LayerNorm of the second residual sum"):
        lambda b, x: (lambda m: m + b.mlp(m))(b.ln1(x + b.attn(x))),
}
SHARED_LN = Mistake("shared_layernorm", "ln1 and ln2 are one LayerNorm object (e.g. `self.ln2 = self.ln1`): "
                    "create two separate LayerNorms, each gets its own weights")
SEPARATE_LN = "self.ln2 = LayerNorm(cfg)"


def mistake_traces(block: nn.Module, x: torch.Tensor, mistakes: dict[str, Callable]) -> dict[str, dict]:
    """Each mistake's trace: a forward `f(block, x)`, or (when `f.swaps`) a block `f(block)`."""
    with torch.no_grad():
        traces = {d: block_trace(f(block), x) if getattr(f, "swaps", False)
                  else block_trace(block, x, lambda inp, f=f: f(block, inp)) for d, f in mistakes.items()}
        shared = copy.deepcopy(block)
        shared.ln1 = shared.ln2
        traces[SHARED_LN] = block_trace(shared, x)
    return traces


def run_block(what: str, block: nn.Module, inputs: list[torch.Tensor], forbidden: Forbidden) -> dict:
    """The learner's block on each input: the first one traced hook by hook, the others' outputs."""
    def runner(fn, inp):
        return run_learner(what, fn, inp, forbidden=forbidden)

    x = inputs[0]
    before = x.clone()
    outputs = block_trace(block, x, runner=runner)
    outputs["input_modified"] = torch.tensor(not torch.equal(x, before))
    for i, other in enumerate(inputs[1:], 1):
        outputs[f"out_{i}"] = runner(block, other)
    return {k: v for k, v in outputs.items() if v is not None}


def judge_block(what: str, outputs: dict, inputs: list[torch.Tensor], reference: nn.Module,
                mistakes: dict[str, Callable], hints: dict, fixes: dict,
                expected_out: list[torch.Tensor] | None = None) -> None:
    """First divergence on the traced input, then the other inputs' outputs. `hints` say in words
    what each place computes, `fixes` hold its corrected line; `expected_out` (default: the
    reference's outputs) are the expected block outputs for each input."""
    with torch.no_grad():
        expected = block_trace(reference, inputs[0])
        expected_out = expected_out or [reference(x) for x in inputs]
    expected["resid_post"] = expected_out[0]
    out = outputs.get("resid_post")
    check_shape(f"{what} output", out, expected_out[0].shape, DIMS)
    if bool(outputs["input_modified"]):
        raise CheckFailed(with_fix(f"{what} changed its input tensor in place (e.g. `x += attn_out`): the "
                                   "residual stream must not be modified. Compute new tensors instead.", RESID_MID))
    if not (out.is_floating_point() and torch.isfinite(out).all() and close(out, expected_out[0])):
        if bool(outputs.get("shared_ln", False)):
            raise CheckFailed(with_fix(f"{what} output does not match the reference.\n  Likely mistake: {SHARED_LN}.",
                                       SEPARATE_LN), mistake=SHARED_LN.key)
        counts = ", ".join(f"self.{n} called {int(outputs[f'calls.{n}'])}x" for n in SUBMODULES)
        first_divergence(what, outputs, expected, [(k, k) for k in ORDER],
                         mistake_traces(reference, inputs[0], mistakes), DIMS, hints, counts, "resid_post",
                         fixes=fixes)
        compare(f"{what} output", out, expected_out[0], DIMS, hint=hints["resid_post"], fix=fixes["resid_post"])
    for i, x in enumerate(inputs[1:], 1):
        compare(f"{what} output on a second input of shape {list(x.shape)}", outputs.get(f"out_{i}"),
                expected_out[i], DIMS, hint=hints["resid_post"], fix=fixes["resid_post"])


# --- The exercise ------------------------------------------------------------------------------

def _setup(case: Case):
    cfg = block_config()
    weights = spread_weights(bert.PostNormBlock(cfg), 900 + case.seed)
    residuals = [seeded_residual(case.seed, case.batch, case.seq, cfg.d_model),
                 seeded_residual(case.seed + 1, 1, 5, cfg.d_model)]
    return cfg, weights, residuals


def inputs_post_norm(case: Case) -> dict[str, torch.Tensor]:
    """The seeded weights, made here: making them in the kernel would need the course's block."""
    return {name: value.contiguous() for name, value in _setup(case)[1].items()}


def produce_post_norm(PostNormBlock, case: Case, inputs: dict) -> dict:
    cfg = block_config()
    xs = [seeded_residual(case.seed, case.batch, case.seq, cfg.d_model),
          seeded_residual(case.seed + 1, 1, 5, cfg.d_model)]
    block = build_loaded("PostNormBlock", PostNormBlock, cfg, dict(inputs))
    return run_block("PostNormBlock", block, xs, FORBIDDEN)


def judge_post_norm(case: Case, outputs: dict) -> None:
    cfg, weights, xs = _setup(case)
    reference = load_strict(bert.PostNormBlock(cfg), weights).eval()
    judge_block("PostNormBlock", outputs, xs, reference, POST_NORM_MISTAKES, HINTS, FIXES)


exercise = Exercise("09_transformer_family", "PostNormBlock", produce_post_norm, judge_post_norm,
                    inputs=inputs_post_norm, forbidden=(FORBIDDEN,), defaults={"text": None, "batch": 2, "seq": 10})
check_post_norm_block = exercise.checker(
    "Grade the learner's `PostNormBlock` (the course's attention, MLP and LayerNorms, post-norm) "
    "with seeded weights on seeded residual streams.")
