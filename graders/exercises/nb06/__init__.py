"""Grader for 06_gpt2: `Unembed`, the whole `DemoTransformer`, the next-token loss, and
`count_parameters` (graders.exercises.nb06.parameter_count).

The full model is graded on the reference logits. When they differ, forward hooks on the
learner's own submodules (embed, pos_embed, each block, ln_final) find the FIRST activation in
forward order that differs: hook_embed, hook_pos_embed, blocks.{i}.hook_resid_pre / hook_resid_post,
ln_final.hook_out, logits. A hidden case builds it with another config (n_layers, n_heads, d_head,
layer_norm_eps): the model must build its parts with the `cfg` it is given
(graders.exercises.common.config_cases).
"""
from __future__ import annotations

from graders.judging.notebook import ExampleBug, Notebook


import torch
import torch.nn.functional as F
from torch import nn

from graders.reference import components
from graders.judging.cases import Case, activations, rand_float, rand_int, unseen_variant
from graders.judging.exercise import Exercise
from graders.judging.learner import loaded
from graders.reference.store import part, weights
from graders.reference.config import Config
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, with_fix
from graders.exercises.common.config_cases import (built_with_another_config, course_module, fitted_weights,
                                                   how_cfg_is_read, load_or_name, record_how_cfg_is_read,
                                                   recorded_how_cfg_is_read)
from graders.exercises.common.diagnosis import crash, is_crash
from graders.judging.learner import Forbidden, build_loaded, build_module, run_learner
from graders.judging.tolerance import CHANGED_RELATIVE, close
from graders.exercises.common.divergence import first_divergence
from graders.exercises.common.next_token import FLATTENED_FIX, judge_loss_value, named_crash
from graders.exercises.nb06.parameter_count import check_count_parameters  # noqa: F401 (the notebook's check)
from graders.exercises.nb06.model_trace import mistake_traces, model_hooks, model_trace
from graders.integrity.library_kernels import LINEAR_KERNELS

DIMS = ("batch", "position", "d_model")
LOGIT_DIMS = ("batch", "position", "d_vocab")

# --- Unembed -------------------------------------------------------------------------------

UNEMBED_FORBIDDEN = Forbidden(
    "Unembed", targets=[(components.Unembed, "forward"), (F, "linear")],
    source_words=["components.Unembed", "F.linear", "nn.Linear"], kernels=LINEAR_KERNELS)


def unembed_mistakes(x, W_U, b_U):
    right = x @ W_U + b_U
    return {
        Mistake("no_b_u", "the bias b_U is not added"): x @ W_U,
        Mistake("b_u_subtracted", "the bias b_U is subtracted"): x @ W_U - b_U,
        Mistake("b_u_added_twice", "the bias b_U is added twice"): right + b_U,
        Mistake("softmax_applied", "softmax applied: Unembed returns logits (unnormalised scores), not "
                "probabilities"):
            right.softmax(-1),
        Mistake("log_softmax_applied", "log_softmax applied: Unembed returns raw logits"): right.log_softmax(-1),
    }


def _random_bias(seed: int) -> torch.Tensor:
    # GPT-2's b_U is zero, so a second run with a random bias shows whether it is used at all.
    return rand_float(seed + 1000, Config().d_vocab) * 0.1


def inputs_unembed(case: Case) -> dict:
    return {"x": activations(case)["ln_final.hook_out"]}


def produce_unembed(Unembed, case: Case, inputs: dict) -> dict:
    unembed = loaded("Unembed", Unembed, "unembed")
    x = inputs["x"]
    x_before = x.clone()
    out = run_learner("Unembed", unembed, x, forbidden=UNEMBED_FORBIDDEN)
    modified = not torch.equal(x, x_before)
    biased = build_loaded("Unembed", Unembed, Config(),
                          {"W_U": part("unembed")["W_U"], "b_U": _random_bias(case.seed)})
    random_in = rand_float(case.seed, 2, 4, Config().d_model)
    return {"out": out, "input_modified": torch.tensor(modified),
            "biased_out": run_learner("Unembed", biased, random_in, forbidden=UNEMBED_FORBIDDEN)}


def judge_unembed(case: Case, outputs: dict) -> None:
    cfg, w = Config(), part("unembed")
    random_in, b_U = rand_float(case.seed, 2, 4, cfg.d_model), _random_bias(case.seed)
    if bool(outputs["input_modified"]):
        raise CheckFailed("Unembed changed its input tensor in place. Compute a new tensor instead.",
                          mistake="modifies_input_in_place")
    biased = outputs["biased_out"]
    if isinstance(biased, torch.Tensor) and tuple(biased.shape) == (2, cfg.d_vocab):
        raise CheckFailed("Unembed output on a random [2, 4, d_model] input: shape [2, d_vocab]. "
                          "Likely mistake: only the last position is unembedded (x[:, -1]); return "
                          "the logits of every position, [batch, position, d_vocab].",
                          mistake="last_position_only")
    compare("Unembed output on a random [2, 4, d_model] input with a nonzero bias b_U",
            outputs["biased_out"], random_in @ w["W_U"] + b_U, LOGIT_DIMS,
            mistakes=lambda: unembed_mistakes(random_in, w["W_U"], b_U),
            hint="logits = x @ W_U + b_U, with W_U of shape [d_model, d_vocab].")
    x = activations(case)["ln_final.hook_out"]
    compare("Unembed output (logits from ln_final.hook_out)", outputs["out"], activations(case)["logits"],
            LOGIT_DIMS, mistakes=lambda: unembed_mistakes(x, w["W_U"], w["b_U"]),
            hint="logits = x @ W_U + b_U, with W_U of shape [d_model, d_vocab].")


unembed = Exercise("06_gpt2", "Unembed", produce_unembed, judge_unembed,
                    inputs=inputs_unembed, forbidden=(UNEMBED_FORBIDDEN,))
check_unembed = unembed.checker(
    "Grade the learner's `Unembed` (visible check: the reference text).")


# --- DemoTransformer --------------------------------------------------------------------------

MODEL_FORBIDDEN = Forbidden(
    "DemoTransformer", targets=[(components.DemoTransformer, "forward")],
    source_words=["components.DemoTransformer", "GPT2LMHeadModel", "GPT2Model"])


_COURSE_MODEL: dict[tuple, nn.Module] = {}   # the last one built, by the settings of its config


def course_model(case: Case) -> nn.Module:
    """The course's model built with the case's config, with the reference weights fitted to it;
    kept for the next check of the same config, one model at a time (GPT-2 small is 650 MB)."""
    settings = tuple(case.settings().items())
    if settings not in _COURSE_MODEL:
        _COURSE_MODEL.clear()
        _COURSE_MODEL[settings] = course_module("DemoTransformer", weights(), case.config())
    return _COURSE_MODEL[settings]


CAUSAL_LEN = 6


def _changed_last(tokens: torch.Tensor) -> torch.Tensor:
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 12345) % Config().d_vocab
    return changed


def produce_model(DemoTransformer, case: Case, inputs: dict) -> dict:
    model = _loaded_model(DemoTransformer, case)
    tokens = case.tokens()

    def runner(fn, inp):
        return run_learner("DemoTransformer", fn, inp, forbidden=MODEL_FORBIDDEN)

    try:
        outputs = model_trace(model, tokens, runner=runner)
    except CheckFailed as failure:
        if not (case.settings() and is_crash(failure)):
            raise
        cfg = case.config()
        on = f"this check's config ({cfg.n_layers} layers, {cfg.n_heads} heads of {cfg.d_head})"
        raise crash("DemoTransformer", failure, on, (
            Mistake("n_layers_not_from_config",
                    f"n_layers is not read from cfg: this model has {cfg.n_layers} blocks; loop over "
                    f"self.blocks, or range(self.cfg.n_layers)"
                    + (how_cfg_is_read(DemoTransformer) or ", not range(12)"))
            if isinstance(failure.__cause__, IndexError) else
            Mistake("setting_hard_coded", "a setting is hard-coded (GPT-2's) instead of read from self.cfg"))
        ) from failure.__cause__
    short = tokens[:, :CAUSAL_LEN]  # a short prefix keeps the property check cheap
    base, changed = runner(model, short), runner(model, _changed_last(short))
    if isinstance(base, torch.Tensor) and isinstance(changed, torch.Tensor) and base.ndim == 3:
        outputs["causal_base"] = base[:, :-1].detach().clone()
        outputs["causal_changed"] = changed[:, :-1].detach().clone()
    outputs["random_out"] = runner(model, rand_int(case.seed, 2, 4))
    outputs.update(record_how_cfg_is_read(DemoTransformer, case))
    return {k: v for k, v in outputs.items() if v is not None}


def _loaded_model(DemoTransformer, case: Case):
    """The learner's model built with the case's config and the reference weights fitted to it,
    its `unembed` the course's: `Unembed` has a check of its own, so a mistake there costs that
    check, not this one too."""
    cfg = case.config()
    model = build_module("DemoTransformer", DemoTransformer, cfg)
    if isinstance(getattr(model, "unembed", None), nn.Module):
        model.unembed = components.Unembed(cfg)
    return load_or_name("DemoTransformer", model, fitted_weights(weights(), cfg), _not_built_with(model, case))


def _not_built_with(model: nn.Module, case: Case) -> str:
    """Why the learner's model does not fit the case's config, when a setting was not read."""
    blocks, cfg = getattr(model, "blocks", None), case.config()
    if case.settings() and isinstance(blocks, nn.ModuleList) and len(blocks) != cfg.n_layers:
        return Mistake("n_layers_not_from_config",
                       f"n_layers is not read from cfg: self.blocks holds {len(blocks)} blocks; this check's "
                       f"config has n_layers {cfg.n_layers}. Build cfg.n_layers of them"
                       + (how_cfg_is_read(type(model)) or ", not a literal"))
    return built_with_another_config("DemoTransformer", model, case)


def judge_model(case: Case, outputs: dict) -> None:
    """GPT-2's logits and activations from the files; a case with other settings is judged
    against the course's model built with them (GPT-2's weights fitted to its config)."""
    cfg, course, tokens = case.config(), course_model(case), case.tokens()
    check_shape("DemoTransformer logits on random tokens of shape [2, 4]", outputs.get("random_out"),
                (2, 4, cfg.d_vocab), LOGIT_DIMS)
    with torch.no_grad():
        acts = model_trace(course, tokens) if case.settings() else activations(case)
    expected = acts["logits"]
    logits = outputs.get("logits")
    check_shape("DemoTransformer logits", logits, expected.shape, LOGIT_DIMS)
    base, changed = outputs.get("causal_base"), outputs.get("causal_changed")
    if base is not None and changed is not None and base.numel() and not (
            changed.shape == base.shape and close(changed, base)):
        bad = ((changed.double() - base.double()).abs() > CHANGED_RELATIVE * base.double().abs().max()).any(-1)
        where = bad.nonzero()[:, 1].unique().tolist()
        raise CheckFailed(
            "DemoTransformer is not causal: changing only the LAST token changed the logits at "
            f"earlier positions {where[:8]}{' ...' if len(where) > 8 else ''}. A position may only "
            "see itself and earlier tokens: look for an operation that mixes positions (a mean or "
            "norm over the position dimension, a missing causal mask).")
    if logits.is_floating_point() and torch.isfinite(logits).all() and close(logits, expected, cfg.n_layers):
        # Tokens no file holds logits for: the expected ones are computed here, with the course's model.
        with torch.no_grad():
            random_expected = course(rand_int(case.seed, 2, 4))
        compare("DemoTransformer logits on random tokens of shape [2, 4]", outputs["random_out"],
                random_expected, LOGIT_DIMS, depth=cfg.n_layers)
        return
    if int(outputs["distinct_blocks"]) < cfg.n_layers:
        raise CheckFailed(with_fix(
            f"DemoTransformer logits do not match the reference. Likely mistake: self.blocks holds "
            f"{int(outputs['distinct_blocks'])} distinct block object(s) for {cfg.n_layers} layers (multiplying "
            "a list of one block repeats that ONE object, and its weights): build a new block for each layer.",
            "nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])"), mistake="shared_block_object")
    names = list(_submodules_names(cfg.n_layers))
    counts = ", ".join(f"{n} called {int(c)}x" for n, c in zip(names, outputs["calls"].tolist())
                       if not n.startswith("blocks.") or int(c) != 1)
    hooks = [(h, h) for h in model_hooks(cfg.n_layers)]
    hints = {"hook_embed": "embed(tokens) looks up each token's row of W_E.",
             "hook_pos_embed": "pos_embed(tokens) gives each position's row of W_pos.",
             "ln_final.hook_out": "ln_final normalises the output of the last block.",
             "logits": "logits = unembed(ln_final(resid))."}
    for i in range(cfg.n_layers):
        hints[f"blocks.{i}.hook_resid_pre"] = (
            "the first block reads embed(tokens) + pos_embed(tokens)" if i == 0 else
            f"blocks[{i}] reads the output of blocks[{i - 1}].")
    how_read = recorded_how_cfg_is_read(outputs)
    first_divergence("DemoTransformer", outputs, acts, hooks, mistake_traces(course, tokens, how_read),
                     ("batch", "position", "d"), hints, counts or "each submodule called once", "logits")
    compare("DemoTransformer logits", logits, expected, LOGIT_DIMS, depth=cfg.n_layers)


def _submodules_names(n_layers: int):
    return ["embed", "pos_embed"] + [f"blocks.{i}" for i in range(n_layers)] + ["ln_final", "unembed"]


model = Exercise("06_gpt2", "DemoTransformer", produce_model, judge_model,
                  forbidden=(MODEL_FORBIDDEN,))
check_demo_transformer = model.checker(
    "Grade the learner's `DemoTransformer` on the reference logits (visible check: the reference text).")


# --- The next-token loss ---------------------------------------------------------------------

def inputs_loss(case: Case) -> dict:
    return {"logits": activations(case)["logits"]}


def _run_loss(next_token_loss, logits: torch.Tensor, tokens: torch.Tensor):
    try:
        return run_learner("next_token_loss", next_token_loss, logits, tokens)
    except CheckFailed as failure:
        likely = named_crash(failure.__cause__, logits, tokens) if is_crash(failure) else ""
        if not likely:
            raise
        on = f"logits of shape {list(logits.shape)} and tokens of shape {list(tokens.shape)}"
        named = crash("next_token_loss", failure, on, likely)
        raise CheckFailed(with_fix(str(named), FLATTENED_FIX), mistake=named.mistake) from failure.__cause__


def produce_loss(next_token_loss, case: Case, inputs: dict) -> dict:
    tokens = case.tokens()
    logits = inputs["logits"]
    before = logits.clone()
    out = _run_loss(next_token_loss, logits, tokens)
    unseen = _run_loss(next_token_loss, unseen_variant(logits, case.seed), tokens)
    return {"loss": out, "unseen_loss": unseen, "input_modified": torch.tensor(not torch.equal(logits, before))}


def judge_loss(case: Case, outputs: dict) -> None:
    if bool(outputs["input_modified"]):
        raise CheckFailed("next_token_loss changed the logits tensor in place. Compute new tensors instead.",
                          mistake="modifies_input_in_place")
    logits, tokens = activations(case)["logits"], case.tokens()
    judge_loss_value("next_token_loss", outputs["loss"], logits, tokens)
    judge_loss_value("next_token_loss on rescaled, noisy logits that no file holds",
                    outputs["unseen_loss"], unseen_variant(logits, case.seed), tokens)


loss = Exercise("06_gpt2", "next_token_loss", produce_loss, judge_loss,
                 inputs=inputs_loss)
check_loss = loss.checker(
    "Grade `next_token_loss(logits, tokens) -> scalar` on the reference model's logits.")


NOTEBOOK = Notebook(
    '06_gpt2',
    # The classic mistake of the example class's buggy student: no positional embedding.
    ExampleBug('model_answer', 'residual = self.embed(tokens) + self.pos_embed(tokens)',
               'residual = self.embed(tokens)',
               costs=('model_test',), named='no positional embedding'),
    pictures=2,
    course_code=('reference/components.py',),
)
