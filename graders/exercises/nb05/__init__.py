"""Grader for 05_transformer_block: `TransformerBlock` (ln1, attn, ln2, mlp) against blocks.{i}.

The learner wires the course's LayerNorm / Attention / MLP into a pre-norm residual block. When
the block's output is wrong, the grader reports the FIRST activation in forward order that differs
from the reference, read with forward hooks on the learner's own submodules:
ln1.hook_out -> hook_attn_out -> hook_resid_mid (what goes into ln2) -> ln2.hook_out ->
hook_mlp_out -> hook_resid_post.

A hidden case builds the block with another config (n_heads, d_head, layer_norm_eps): the block
must build its parts with the `cfg` it is given (graders.exercises.common.config_cases).
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Callable

import torch

from graders.judging.notebook import ExampleBug, Notebook
from torch import nn

from graders.reference import components
from graders.judging.cases import Case, activations, rand_float, unseen_variant
from graders.judging.exercise import Exercise
from graders.reference.store import part
from graders.reference.config import Config
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, with_fix
from graders.exercises.common.config_cases import (built_with_another_config, course_module, fitted_weights,
                                                   load_or_name, record_how_cfg_is_read, recorded_how_cfg_is_read)
from graders.judging.rendering import fix_line
from graders.exercises.common.divergence import first_divergence
from graders.exercises.common.submodules import TAKES_RESIDUAL, module_or_none, submodule_crash, watch
from graders.judging.learner import Forbidden, build_module, run_learner
from graders.judging.tolerance import close

DIMS = ("batch", "position", "d_model")
FORBIDDEN = Forbidden(
    "TransformerBlock",
    targets=[(components.TransformerBlock, "forward")],
    source_words=["components.TransformerBlock", "nn.TransformerEncoderLayer", "nn.TransformerDecoderLayer"],
)


# --- What the learner's block computes, hook by hook ------------------------------------------

HOOKS = ("ln1.hook_out", "hook_attn_out", "hook_resid_mid", "ln2.hook_out", "hook_mlp_out",
         "hook_resid_post")
SUBMODULES = ("ln1", "attn", "ln2", "mlp")
HINTS = {
    "ln1.hook_out": "ln1 must read the block's input, the residual stream before attention (pre-norm).",
    "hook_attn_out": "attention reads the output of ln1, not the raw residual stream.",
    "hook_resid_mid": "what ln2 reads is the block's input plus attention's output (the first residual connection).",
    "ln2.hook_out": "ln2 normalises the residual stream after attention, resid_mid.",
    "hook_mlp_out": "the MLP reads the output of ln2.",
    "hook_resid_post": "the block's output is resid_mid plus the MLP's output (the second residual connection).",
}
RESID_MID = "resid_mid = resid_pre + self.attn(self.ln1(resid_pre))"
RESID_POST = "resid_post = resid_mid + self.mlp(self.ln2(resid_mid))"
FIXES = {"ln1.hook_out": RESID_MID, "hook_attn_out": RESID_MID, "hook_resid_mid": RESID_MID,
         "ln2.hook_out": RESID_POST, "hook_mlp_out": RESID_POST, "hook_resid_post": RESID_POST}


def block_trace(block: nn.Module, resid_pre: torch.Tensor, forward: Callable | None = None,
                runner: Callable | None = None) -> dict:
    """The block's graded activations, read with hooks on ln1/attn/ln2/mlp, plus call counts."""
    named = {name: module_or_none(block, name) for name in SUBMODULES}
    taps = (("ln1.hook_out", "ln1", 1), ("hook_attn_out", "attn", 1), ("hook_resid_mid", "ln2", 0),
            ("ln2.hook_out", "ln2", 1), ("hook_mlp_out", "mlp", 1))

    def crashed(failure, rec):
        return submodule_crash("TransformerBlock", failure, rec,
                               {n: TAKES_RESIDUAL for n in SUBMODULES}, resid_pre.shape[-1])

    out, trace, rec = watch(named, forward or block, resid_pre, taps, runner, crashed)
    trace["hook_resid_post"] = out
    for name in SUBMODULES:
        trace[f"calls.{name}"] = torch.tensor(rec.count(name))
    trace["shared_ln"] = torch.tensor(named["ln1"] is not None and named["ln1"] is named["ln2"])
    return trace


def course_block(case: Case) -> nn.Module:
    """The course's block built with the case's config, with the weights of the case's block."""
    return course_module("TransformerBlock", part(f"blocks.{case.block}"), case.config())


# Each common mistake as a forward of a block with the course's submodules.
BLOCK_MISTAKES: dict[str, Callable] = {
    Mistake("post_norm", "post-norm (LayerNorm after each residual addition, as in the original Transformer): "
            "GPT-2 is pre-norm, resid_mid = resid_pre + attn(ln1(resid_pre))"):
        lambda b, x: (lambda m: b.ln2(m + b.mlp(m)))(b.ln1(x + b.attn(x))),
    Mistake("no_attention_residual", "no residual connection around attention: resid_mid = resid_pre + "
            "attn_out, not attn_out alone"):
        lambda b, x: (lambda m: m + b.mlp(b.ln2(m)))(b.attn(b.ln1(x))),
    Mistake("no_mlp_residual", "no residual connection around the MLP: resid_post = resid_mid + mlp_out, not "
            "mlp_out alone"):
        lambda b, x: (lambda m: b.mlp(b.ln2(m)))(x + b.attn(b.ln1(x))),
    Mistake("no_residuals", "no residual connections at all: each sublayer adds its output to the stream"):
        lambda b, x: b.mlp(b.ln2(b.attn(b.ln1(x)))),
    Mistake("ln1_used_twice", "the same LayerNorm (ln1) is used before attention and before the MLP: the MLP "
            "reads ln2(resid_mid), each sublayer has its own LayerNorm"):
        lambda b, x: (lambda m: m + b.mlp(b.ln1(m)))(x + b.attn(b.ln1(x))),
    Mistake("ln2_used_twice", "the same LayerNorm (ln2) is used before attention and before the MLP: attention "
            "reads ln1(resid_pre)"):
        lambda b, x: (lambda m: m + b.mlp(b.ln2(m)))(x + b.attn(b.ln2(x))),
    Mistake("parallel_shared_layernorm", "attention and MLP in parallel on one shared LayerNorm (GPT-J style): "
            "in GPT-2 the MLP reads ln2(resid_mid), after attention"):
        lambda b, x: x + b.attn(b.ln1(x)) + b.mlp(b.ln1(x)),
    Mistake("mlp_reads_resid_pre", "the MLP reads resid_pre instead of resid_mid, i.e. attention and MLP run in "
            "parallel (GPT-J style): in GPT-2 ln2 normalises resid_mid = resid_pre + attn_out, after attention"):
        lambda b, x: x + b.attn(b.ln1(x)) + b.mlp(b.ln2(x)),
    Mistake("no_mlp", "the MLP branch is missing: the block returns resid_mid"):
        lambda b, x: x + b.attn(b.ln1(x)),
    Mistake("no_ln1", "attention reads the raw residual stream (ln1 is skipped)"):
        lambda b, x: (lambda m: m + b.mlp(b.ln2(m)))(x + b.attn(x)),
    Mistake("no_ln2", "the MLP reads the raw resid_mid (ln2 is skipped)"):
        lambda b, x: (lambda m: m + b.mlp(m))(x + b.attn(b.ln1(x))),
}


def mistake_traces(block: nn.Module, resid_pre: torch.Tensor, how_read: str = "") -> dict[str, dict]:
    """What each known mistake makes of the course's `block` on `resid_pre`, hook by hook."""
    traces = {}
    with torch.no_grad():
        for description, forward in BLOCK_MISTAKES.items():
            traces[description] = block_trace(block, resid_pre, lambda x, f=forward: f(block, x))
        shared = copy.deepcopy(block)
        shared.ln1 = shared.ln2  # what loading does to `self.ln2 = self.ln1`: ln2's weights win
        traces[Mistake("shared_layernorm", "ln1 and ln2 are one LayerNorm object (e.g. `self.ln2 = self.ln1`): "
                       "create two separate LayerNorms, each gets its own weights")] = block_trace(shared, resid_pre)
        wanted, default = block.ln1.cfg.layer_norm_eps, Config().layer_norm_eps
        for names in (("ln1", "ln2"), ("ln1",), ("ln2",)) if wanted != default else ():
            gpt2_eps = copy.deepcopy(block)
            for name in names:
                getattr(gpt2_eps, name).cfg = replace(block.ln1.cfg, layer_norm_eps=default)
            traces[Mistake("eps_not_from_config",
                           f"eps is not read from cfg.layer_norm_eps: {' and '.join(names)} used {default:g} "
                           f"(GPT-2's); this check's config has {wanted:g}. Build the LayerNorms with the cfg "
                           f"given to TransformerBlock(cfg)" + how_read)] = block_trace(gpt2_eps, resid_pre)
    return traces


# --- The exercise ----------------------------------------------------------------------------

def inputs_block(case: Case) -> dict:
    return {"x": activations(case)[f"blocks.{case.block}.hook_resid_pre"]}


def produce_block(TransformerBlock, case: Case, inputs: dict) -> dict:
    cfg = case.config()
    block = build_module("TransformerBlock", TransformerBlock, cfg)
    block = load_or_name("TransformerBlock", block, fitted_weights(part(f"blocks.{case.block}"), cfg),
                         built_with_another_config("TransformerBlock", block, case))
    x = inputs["x"]
    x_before = x.clone()

    def runner(fn, inp):
        return run_learner("TransformerBlock", fn, inp, forbidden=FORBIDDEN)

    outputs = block_trace(block, x, runner=runner)
    outputs["input_modified"] = torch.tensor(not torch.equal(x, x_before))
    outputs["random_out"] = run_learner("TransformerBlock", block,
                                        rand_float(case.seed, 2, 4, Config().d_model), forbidden=FORBIDDEN)
    outputs["unseen_out"] = run_learner("TransformerBlock", block, unseen_variant(x, case.seed), forbidden=FORBIDDEN)
    outputs.update(record_how_cfg_is_read(TransformerBlock, case))
    return {k: v for k, v in outputs.items() if v is not None}


def expected_activations(case: Case, course: nn.Module) -> dict:
    """The reference's activations of the case's block; on a case with other settings, those of
    the course's block built with them (`course`), which no file holds."""
    acts, i = activations(case), case.block
    if not case.settings():
        return acts
    resid_pre = acts[f"blocks.{i}.hook_resid_pre"]
    with torch.no_grad():
        trace = block_trace(course, resid_pre)
    return {f"blocks.{i}.hook_resid_pre": resid_pre, **{f"blocks.{i}.{hook}": trace[hook] for hook in HOOKS}}


def judge_block(case: Case, outputs: dict) -> None:
    i = case.block
    check_shape("TransformerBlock output on a random [2, 4, d_model] input", outputs.get("random_out"),
                (2, 4, Config().d_model), DIMS)
    if bool(outputs["input_modified"]):
        raise CheckFailed(with_fix("TransformerBlock changed its input tensor in place (e.g. `resid += attn_out`): "
                                   "the residual stream must not be modified. Compute a new tensor instead.",
                                   RESID_MID), mistake="modifies_input_in_place")
    course = course_block(case)
    acts = expected_activations(case, course)
    expected = acts[f"blocks.{i}.hook_resid_post"]
    out = outputs.get("hook_resid_post")
    check_shape(f"TransformerBlock output (blocks.{i})", out, expected.shape, DIMS)
    if out.is_floating_point() and torch.isfinite(out).all() and close(out, expected):
        _judge_unseen_inputs(case, course, outputs)
        return
    if bool(outputs["shared_ln"]):
        raise CheckFailed(f"TransformerBlock output (blocks.{i}) does not match the reference. "
                          "Likely mistake: ln1 and ln2 are one LayerNorm object (e.g. "
                          "`self.ln2 = self.ln1`): create two separate LayerNorms, each gets its own weights."
                          + fix_line("self.ln2 = LayerNorm(cfg)"), mistake="shared_layernorm")
    counts = ", ".join(f"self.{n} called {int(outputs[f'calls.{n}'])}x" for n in SUBMODULES)
    how_read = recorded_how_cfg_is_read(outputs)
    traces = mistake_traces(course, acts[f"blocks.{i}.hook_resid_pre"], how_read)
    first_divergence(f"TransformerBlock (blocks.{i})", outputs, acts,
                     [(h, f"blocks.{i}.{h}") for h in HOOKS], traces, DIMS, HINTS, counts,
                     "hook_resid_post", fixes=FIXES)
    compare(f"TransformerBlock output (blocks.{i})", out, expected, DIMS)  # e.g. NaNs


def _judge_unseen_inputs(case: Case, course: nn.Module, outputs: dict) -> None:
    """Inputs no file holds: the expected outputs are computed here, with the course's block."""
    resid_pre = activations(case)[f"blocks.{case.block}.hook_resid_pre"]
    for key, what, x in (("random_out", "a random [2, 4, d_model] input",
                          rand_float(case.seed, 2, 4, Config().d_model)),
                         ("unseen_out", "a rescaled, noisy input that no file holds",
                          unseen_variant(resid_pre, case.seed))):
        with torch.no_grad():
            expected = course(x)
        compare(f"TransformerBlock output (blocks.{case.block}) on {what}", outputs.get(key), expected, DIMS,
                hint="the block is pre-norm: each sublayer reads a LayerNorm of the residual stream and "
                     "adds its output to it; look for what differs from the reference text's case.")


block = Exercise("05_transformer_block", "TransformerBlock", produce_block, judge_block,
                  inputs=inputs_block, forbidden=(FORBIDDEN,))
check_transformer_block = block.checker(
    "Grade the learner's `TransformerBlock` class (visible check: block 0 on the reference text).")


NOTEBOOK = Notebook(
    '05_transformer_block',
    # The classic mistake of the example class's buggy student: no residual connection around attention.
    ExampleBug('block_answer', 'resid_mid = resid_pre + self.attn(self.ln1(resid_pre))',
               'resid_mid = self.attn(self.ln1(resid_pre))',
               costs=('block_test',), named='no residual connection around attention'),
    course_code=('reference/components.py',),
)
