"""Notebook 13, exercise 3: `LoRALinear`, `add_lora` and `merge_lora`, judged against peft 0.21.2
(LoraConfig, get_peft_model, merge_and_unload) on transformers' GPT-2 holding the same weights:
the output at initialisation, the output after each of a few AdamW steps on the same tokens
(peft's adapters start from the learner's own A and B), the count of trainable parameters, the
output in eval mode with dropout, and the merged weights. A mistake no catalog lists is
localised to the first step, layer or weight that differs, and read as a factor where it is one."""
from __future__ import annotations

import copy
import math
import torch
import torch.nn.functional as F

from graders.integrity.library_kernels import CROSS_ENTROPY_RUNS
from graders.exercises.nb13 import reference as ref
from graders.exercises.nb13.gpt import GPTConfig, jittered_gpt
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.judging.rendering import fix_line
from graders.judging.tolerance import close

NOTEBOOK = "13_post_training"
CONFIG = GPTConfig(d_vocab=64, n_ctx=16, d_model=32, n_layers=2, n_heads=4)
TARGETS = ("c_attn", "c_proj")
STEPS, LR, DROPOUT = 3, 1e-2, 0.5
# AdamW's epsilon in the check's steps. A gradient component that should be zero comes out at
# rounding level, on the learner's side and on peft's (they multiply in other orders), and AdamW's
# first step divides it by its own size: with torch's 1e-8 it became a step of either sign, and
# about one random A in a hundred failed a correct LoRA. At 1e-4 such components move by a ten-
# thousandth of a step, and the real ones (about 1e-2) as before.
ADAM_EPS = 1e-4
FORBIDDEN = Forbidden("LoRA", source_words=["peft", "LoraConfig", "get_peft_model", "merge_and_unload"],
                      instead="from two matrices of your own around the frozen layer",
                      library_code=("peft",), notebook_wide=False)


def settings(case: Case) -> tuple[int, float]:
    """(r, alpha): the visible check's, and a hidden one's where alpha / r < 1."""
    return (4, 8.0) if case.seed == 0 else (8, 4.0)


def tokens_of(case: Case) -> torch.Tensor:
    return torch.randint(0, CONFIG.d_vocab, (case.batch, case.seq), generator=torch.Generator().manual_seed(case.seed))


def _optimizer(trainable: list) -> torch.optim.Optimizer:
    """The check's steps, the same for the learner's model, peft's and the course's slips."""
    return torch.optim.AdamW(trainable, lr=LR, eps=ADAM_EPS, weight_decay=0.0)


def _step_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def _layers(model, what: str):
    """(name, layer) of every wrapped projection: blocks' attn.c_attn and attn.c_proj."""
    try:
        return [(f"h.{i}.attn.{name}", getattr(block.attn, name)) for i, block in enumerate(model.transformer.h)
                for name in TARGETS]
    except AttributeError as err:
        raise CheckFailed(f"{what}: the model has lost its blocks' attention ({err}): wrap each projection where it "
                          "is, so that the model keeps its layout and only the two layers change."
                          + fix_line("block.attn.c_attn = LoRALinear(block.attn.c_attn, r, alpha, dropout)")) from None


def _factors(layer, name: str, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    A, B = getattr(layer, "A", None), getattr(layer, "B", None)
    if not (isinstance(A, torch.Tensor) and isinstance(B, torch.Tensor)):
        raise CheckFailed(f"add_lora: {name} is a {type(layer).__name__} without tensors `A` and `B`; wrap it in "
                          "your LoRALinear, whose factors are named A [d_in, r] and B [r, d_out].")
    d_in, d_out = CONFIG.d_model, (3 if name.endswith("c_attn") else 1) * CONFIG.d_model
    if tuple(A.shape) != (d_in, r) or tuple(B.shape) != (r, d_out):
        raise CheckFailed(f"add_lora: {name}'s factors have shapes A {list(A.shape)}, B {list(B.shape)}; with "
                          f"r={r} they are A [d_in, r] = [{d_in}, {r}] and B [r, d_out] = [{r}, {d_out}].")
    return A, B


def _wrapped(add_lora, base, r, alpha, dropout=0.0, seed=0):
    """The learner's A is drawn here, from a random state the check sets (and gives back after):
    the same factors, and so the same grade, whatever cells ran before in the kernel."""
    model = copy.deepcopy(base)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        returned = run_learner("add_lora", add_lora, model, r, alpha, dropout, forbidden=FORBIDDEN)
    return model if returned is None else returned


def produce(learner, case: Case, inputs: dict) -> dict:
    LoRALinear, add_lora, merge_lora = learner
    r, alpha = settings(case)
    base, tokens = jittered_gpt(CONFIG, case.seed), tokens_of(case)
    model = _wrapped(add_lora, base, r, alpha, seed=case.seed)
    layers = _layers(model, "add_lora")
    outputs = {}
    for name, layer in layers:
        A, B = _factors(layer, name, r)
        outputs[f"{name}.A"], outputs[f"{name}.B"] = A.detach().clone(), B.detach().clone()
    trainable = [p for p in model.parameters() if p.requires_grad]
    outputs["trainable"] = torch.tensor(sum(p.numel() for p in trainable))
    factors = {id(getattr(layer, f)) for _, layer in layers for f in ("A", "B")}
    outputs["trainable_outside_factors"] = torch.tensor(sum(p.numel() for p in trainable if id(p) not in factors))
    model.eval()
    outputs["logits_init"] = run_learner("your LoRA model", model, tokens, forbidden=FORBIDDEN)
    if trainable:
        optimizer = _optimizer(trainable)
        for step in range(STEPS):
            model.train()
            with torch.enable_grad():
                logits = run_learner("your LoRA model", _with_grad, model, tokens, forbidden=FORBIDDEN)
                loss = _step_loss(logits, tokens)
                optimizer.zero_grad()
                loss.backward()
            optimizer.step()
            model.eval()
            outputs[f"logits_{step + 1}"] = run_learner("your LoRA model", model, tokens, forbidden=FORBIDDEN)
    if f"logits_{STEPS}" in outputs:
        outputs.update(_eval_with_dropout(add_lora, base, model, tokens, r, alpha))
        for name, layer in _layers(model, "add_lora"):
            outputs[f"{name}.A_trained"] = layer.A.detach().clone()
            outputs[f"{name}.B_trained"] = layer.B.detach().clone()
        merged = run_learner("merge_lora", merge_lora, model, forbidden=FORBIDDEN)
        merged = model if merged is None else merged
        outputs["logits_merged"] = run_learner("the merged model", merged.eval(), tokens, forbidden=FORBIDDEN)
        keys = set(merged.state_dict())
        outputs["merged_keys_match"] = torch.tensor(keys == set(base.state_dict()))
        for name, layer in _layers(merged, "merge_lora"):
            weight = getattr(layer, "weight", None)
            if isinstance(weight, torch.Tensor):
                outputs[f"{name}.merged"] = weight.detach().clone()
    return outputs


def _with_grad(model, tokens):
    with torch.enable_grad():
        return model(tokens)


def _eval_with_dropout(add_lora, base, trained, tokens, r, alpha) -> dict:
    """The trained factors in a model built with dropout, in eval mode: twice, so that a dropout
    still on shows as two different outputs as well as a wrong one."""
    dropped = _wrapped(add_lora, base, r, alpha, DROPOUT)
    with torch.no_grad():
        for (_, mine), (name, theirs) in zip(_layers(trained, "add_lora"), _layers(dropped, "add_lora")):
            _factors(theirs, name, r)[0].copy_(mine.A)
            theirs.B.copy_(mine.B)
    dropped.eval()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return {"logits_dropout": run_learner("your LoRA model with dropout, in eval mode", dropped, tokens,
                                              forbidden=FORBIDDEN),
                "logits_dropout_again": run_learner("your LoRA model with dropout, in eval mode", dropped, tokens,
                                                    forbidden=FORBIDDEN)}


# --- The judge: peft on transformers' GPT-2 ---------------------------------------------------

def hf_gpt2(base):
    """transformers' GPT2LMHeadModel holding `base`'s weights (their names are the same)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=CONFIG.d_vocab, n_positions=CONFIG.n_ctx, n_embd=CONFIG.d_model,
                        n_layer=CONFIG.n_layers, n_head=CONFIG.n_heads, layer_norm_epsilon=CONFIG.layer_norm_eps,
                        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    weights = base.state_dict()
    model.load_state_dict({**weights, "lm_head.weight": weights["transformer.wte.weight"]}, strict=True)
    return model.eval()


def peft_run(case: Case, outputs: dict) -> dict:
    """peft's LoRA from the learner's initial factors, trained as produce trains the learner's:
    what the learner's should produce."""
    tokens = tokens_of(case)
    model = _peft_model(case, outputs, "")
    found = {"trainable": model.get_nb_trainable_parameters()[0]}
    model.eval()
    with torch.no_grad():
        found["logits_init"] = model(tokens).logits
    optimizer = _optimizer([p for p in model.parameters() if p.requires_grad])
    for step in range(STEPS):
        model.train()
        loss = _step_loss(model(tokens).logits, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            found[f"logits_{step + 1}"] = model(tokens).logits
    if all(f"{name}.A_trained" in outputs for name, _ in _layers(model.base_model.model, "peft")):
        found.update(peft_merged(case, outputs))
    return found


def _peft_model(case: Case, outputs: dict, suffix: str):
    """peft's LoRA on the case's GPT-2, its factors the learner's (`A{suffix}`, `B{suffix}`)."""
    from peft import LoraConfig, get_peft_model

    r, alpha = settings(case)
    model = get_peft_model(hf_gpt2(jittered_gpt(CONFIG, case.seed)),
                           LoraConfig(r=r, lora_alpha=alpha, target_modules=["c_attn", "attn.c_proj"],
                                      fan_in_fan_out=True, lora_dropout=0.0))
    modules = dict(model.named_modules())
    with torch.no_grad():
        for i in range(CONFIG.n_layers):
            for name in TARGETS:
                layer = modules[f"base_model.model.transformer.h.{i}.attn.{name}"]
                layer.lora_A["default"].weight.copy_(outputs[f"h.{i}.attn.{name}.A{suffix}"].T)
                layer.lora_B["default"].weight.copy_(outputs[f"h.{i}.attn.{name}.B{suffix}"].T)
    return model


def peft_merged(case: Case, outputs: dict) -> dict:
    """peft's merge_and_unload of the learner's trained factors: the merged weights the learner's
    merge_lora should give (from the same factors, so that training's rounding plays no part)."""
    merged = _peft_model(case, outputs, "_trained").merge_and_unload()
    return {f"h.{i}.attn.{name}.merged": getattr(merged.transformer.h[i].attn, name).weight.detach().clone()
            for i in range(CONFIG.n_layers) for name in TARGETS}


def course_run(case: Case, outputs: dict, slip: str) -> dict:
    """The course's LoRA making mistake `slip`, from the learner's initial factors, trained the
    same way: its logits after each step."""
    r, alpha = settings(case)
    model = ref.add_lora(jittered_gpt(CONFIG, case.seed), r, alpha, slip=slip)
    with torch.no_grad():
        for name, layer in _layers(model, "the course"):
            layer.A.copy_(outputs[f"{name}.A"])
            layer.B.copy_(outputs[f"{name}.B"])
    tokens = tokens_of(case)
    optimizer = _optimizer([p for p in model.parameters() if p.requires_grad])
    found = {}
    for step in range(STEPS):
        loss = _step_loss(model(tokens), tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            found[f"logits_{step + 1}"] = model(tokens)
    return found


def _base_logits(case: Case) -> torch.Tensor:
    with torch.no_grad():
        return jittered_gpt(CONFIG, case.seed)(tokens_of(case))


def judge(case: Case, outputs: dict) -> None:
    r, alpha = settings(case)
    where = f"(r={r}, alpha={alpha:g}, on {CONFIG.n_layers} blocks' attn.c_attn and attn.c_proj)"
    expected = peft_run(case, outputs)
    got_count, want_count = int(outputs["trainable"]), int(expected["trainable"])
    outside = int(outputs.get("trainable_outside_factors", 0))
    if got_count != want_count:
        head = f"add_lora {where}: {got_count} trainable numbers, peft's get_peft_model has {want_count}"
        if got_count == 0:
            raise CheckFailed(f"{head}. Likely mistake: A and B are frozen too: the model was frozen after they were "
                              "created (requires_grad_(False) reaches every parameter below the module it is called "
                              "on, the new factors included). Freeze the model first, then wrap its layers: "
                              "parameters created afterwards stay trainable.", mistake="factors_frozen")
        if outside:
            base_numbers = sum(p.numel() for p in jittered_gpt(CONFIG, case.seed).parameters())
            which = ("every weight of the base model requires" if outside == base_numbers else
                     f"{outside} of the base model's {base_numbers} numbers require")
            raise CheckFailed(f"{head}. Likely mistake: the base weight is still trainable ({which} grad, besides A "
                              "and B): LoRA trains A and B only; freeze the whole model before adding them.",
                              mistake="base_trainable")
        raise CheckFailed(f"{head} (A and B of every wrapped layer: r x (d_in + d_out) each).\n  Hint: freeze the "
                          "whole model, then wrap each block's attn.c_attn and attn.c_proj; only A and B require "
                          "grad.")
    _judge_initial_a(outputs, r, where)
    base = _base_logits(case)
    if not close(outputs["logits_init"], base):
        moved = any(outputs[f"{name}.B"].abs().max() > 0 for name, _ in _layers(jittered_gpt(CONFIG, case.seed), "x"))
        likely = ("Likely mistake: both factors are random: B starts at zero so that A B = 0 and the wrapped "
                  "model starts as the base model" if moved else
                  "B is zero, so the LoRA term is 0: what changes the output is elsewhere (the base layer called "
                  "differently, a scale applied to the whole output?)")
        raise CheckFailed(f"Your LoRA model {where}, before any training, does not give the base model's logits "
                          f"(largest difference {float((outputs['logits_init'] - base).abs().max()):.3g}). {likely}.",
                          mistake="b_random" if moved else None)
    if all(outputs[f"{name}.A"].abs().max() == 0 for name, _ in _layers(jittered_gpt(CONFIG, case.seed), "x")):
        raise CheckFailed(f"add_lora {where}: A and B both start at zero, so neither gets a gradient (each one's is "
                          "a product with the other) and nothing ever learns. Draw A at random (uniform in "
                          "+-1/sqrt(d_in), as a Linear layer's weight), B zero.", mistake="both_factors_zero")
    _judge_steps(case, outputs, expected, where)
    first, again = outputs["logits_dropout"], outputs["logits_dropout_again"]
    trained = outputs[f"logits_{STEPS}"]
    if not (close(first, trained) and close(again, trained)):
        random = " (and two calls give two different outputs: it is random)" if not torch.equal(first, again) else ""
        raise CheckFailed(f"LoRALinear with dropout={DROPOUT}, in eval mode, does not give the trained logits"
                          f"{random}. Likely mistake: dropout left on at eval: use an nn.Dropout module (it follows "
                          "model.eval()), or pass training=self.training to F.dropout.", mistake="dropout_at_eval")
    _judge_merge(case, outputs, expected, where)


def _judge_initial_a(outputs: dict, r: int, where: str) -> None:
    """A's scale, as the notebook states it: a Linear layer's draw of fan-in d_in, uniform in
    +-1/sqrt(d_in) (peft's). Read from the std of all the factors' initial values: a few hundred
    numbers, whose std a right draw brings within a few percent of the uniform's; a draw of another
    shape with that spread passes too."""
    values = torch.cat([v.flatten() for k, v in outputs.items() if k.endswith(".A")]).double()
    if values.abs().max() == 0:
        return                                     # both factors zero: the judge names it below
    bound, std = 1 / math.sqrt(CONFIG.d_model), float(values.std())
    uniform_std = bound / math.sqrt(3)
    if abs(std / uniform_std - 1) < 0.25:
        return
    head = (f"add_lora {where}: the initial A's values have a std of {std:.3g}; the notebook's draw, uniform in "
            f"+-1/sqrt(d_in) = +-{bound:.3g} (d_in = {CONFIG.d_model}), has a std of {uniform_std:.3g}.")
    if abs(std / (1 / math.sqrt(3 * r)) - 1) < 0.25:
        raise CheckFailed(f"{head} Likely mistake: the bound uses r, not d_in: 1/sqrt(r) = {1 / math.sqrt(r):.3g}. "
                          "nn.init's kaiming_uniform_ reads a weight's fan-in from its second dimension, which is r "
                          "for A [d_in, r] (peft stores A transposed, [r, d_in]).", mistake="bound_uses_r")
    raise CheckFailed(f"{head} Draw A as a Linear layer's weight of fan-in d_in is drawn.")


def _judge_steps(case: Case, outputs: dict, expected: dict, where: str) -> None:
    for step in range(1, STEPS + 1):
        if close(outputs[f"logits_{step}"], expected[f"logits_{step}"]):
            continue
        head = (f"Your LoRA model {where} after {step} AdamW step{'s' if step > 1 else ''} (lr {LR}) on the same "
                f"tokens gives other logits than peft's from the same A and B (largest difference "
                f"{float((outputs[f'logits_{step}'] - expected[f'logits_{step}']).abs().max()):.3g}).")
        r, alpha = settings(case)
        if close(outputs[f"logits_{step}"], course_run(case, outputs, "alpha")[f"logits_{step}"]):
            raise CheckFailed(f"{head} Likely mistake: the scale is alpha ({alpha:g}), not alpha / r "
                              f"({alpha / r:g}): LoRA's term is (alpha / r) x A B.", mistake="scale_is_alpha")
        if close(outputs[f"logits_{step}"], course_run(case, outputs, "floor_scale")[f"logits_{step}"]):
            raise CheckFailed(f"{head} Likely mistake: the scale is rounded down, alpha // r = {alpha // r:g}, where "
                              f"alpha / r = {alpha / r:g}: `//` is floor division, also on floats.",
                              mistake="floor_scale")
        raise CheckFailed(f"{head} The logits at initialisation agree, so the LoRA term's value or its gradient "
                          "differs.\n  Hint: y = x W + b + (alpha / r) x A B; A and B are the only parameters trained.")


def _judge_merge(case: Case, outputs: dict, expected: dict, where: str) -> None:
    r, alpha = settings(case)
    base = jittered_gpt(CONFIG, case.seed)
    for name, layer in _layers(base, "the course"):
        got = outputs.get(f"{name}.merged")
        want = expected[f"{name}.merged"]
        if got is None or got.shape != want.shape:
            shape = "no weight" if got is None else f"a weight of shape {list(got.shape)}"
            raise CheckFailed(f"merge_lora {where}: {name} has {shape} after merging; it should be a plain Linear "
                              f"again, weight [d_in, d_out] = {list(want.shape)}, the LoRA term folded in.")
        if close(got, want):
            continue
        delta, want_delta = (got - layer.weight.detach()).double(), (want - layer.weight.detach()).double()
        factor = float((delta * want_delta).sum() / want_delta.pow(2).sum())  # the least-squares factor
        if close(delta, factor * want_delta):
            unscaled = abs(factor * alpha / r - 1) < 1e-3
            why = (f"the merged update is {factor:.4g} times peft's, 1 / (alpha / r): Likely mistake: merge without "
                   "the scale: W + A B, where it is W + (alpha / r) A B" if unscaled
                   else f"the merged update W' - W is {factor:.4g} times peft's: the right direction, another scale")
            raise CheckFailed(f"merge_lora {where}: {name}'s merged weight differs from peft's "
                              f"merge_and_unload; {why}.", mistake="merge_unscaled" if unscaled else None)
        raise CheckFailed(f"merge_lora {where}: {name} is the first merged weight that differs from peft's "
                          f"merge_and_unload (largest difference {float((got - want).abs().max()):.3g}).\n  Hint: the "
                          "merged weight is W + (alpha / r) A B, [d_in, d_out].")
    if not bool(outputs["merged_keys_match"]):
        raise CheckFailed(f"merge_lora {where}: the merged model's state_dict has other names than the base model's: "
                          "replace each LoRALinear by a Linear (the base model's class), so that nothing of LoRA is "
                          "left and the weights load where the base model's do.")
    if not close(outputs["logits_merged"], outputs[f"logits_{STEPS}"]):
        raise CheckFailed(f"merge_lora {where}: the merged weights are right, but the merged model's logits "
                          "differ from the LoRA model's: check that the bias is kept and the merged layer computes "
                          "x W + b.")


exercise = Exercise(NOTEBOOK, "LoRA", produce, judge, forbidden=(FORBIDDEN,),
                    defaults={"text": None, "batch": 2, "seq": 12},
                    describe=lambda case: f"GPT-2 with LoRA r={settings(case)[0]}, alpha={settings(case)[1]:g}",
                    guard=Guard(may_run=CROSS_ENTROPY_RUNS))
check_lora = exercise.checker(
    "Grade `LoRALinear`, `add_lora` and `merge_lora` against peft's LoRA on transformers' GPT-2 with the same "
    "weights: at initialisation, after AdamW steps, trainable count, dropout at eval, merged weights.",
    learner=lambda lora_linear, add_lora, merge_lora: (lora_linear, add_lora, merge_lora))
