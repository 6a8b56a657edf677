"""Notebook 09, exercise 3: weight tying, W_U = W_E.T as one parameter (not a copy).

The learner's `TiedUnembed(embed)` replaces the unembedding of a small course GPT-2 with seeded
weights. Judged, in this order: every tensor of the state dict under `unembed.` that holds the
[d_vocab, d_model] matrix shares storage with `embed.W_E`; the parameter count is the untied
model's minus d_vocab * d_model; the logits; the gradient that reaches W_E (from both its uses);
and after one SGD step, W_E and the logits computed with it (the step moves both uses).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises.nb09.tasks import block_config, spread_weights
from graders.exercises.nb07.runs import with_grad
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, compare, with_fix
from graders.judging.exercise import Exercise
from graders.judging.learner import build_module, run_learner
from graders.reference import components
from graders.reference.bert import TiedUnembed

LOGIT_DIMS = ("batch", "position", "d_vocab")
LR = 1.0


class _Detached(TiedUnembed):
    """The reference's mistake: the unembedding uses W_E's values but no gradient reaches it."""

    def forward(self, x):
        return x @ self.W_E.detach().T + self.b_U


def _untied_count(cfg) -> int:
    with torch.random.fork_rng():   # (not the meta device: its first use costs seconds)
        return sum(p.numel() for p in components.DemoTransformer(cfg).parameters())


def _data(case: Case, cfg):
    generator = torch.Generator().manual_seed(700 + case.seed)
    tokens = torch.randint(0, cfg.d_vocab, (case.batch, case.seq), generator=generator)
    targets = torch.randint(0, cfg.d_vocab, (case.batch, case.seq), generator=generator)
    return tokens, targets


@lru_cache(maxsize=2)
def _weights(seed: int) -> dict:
    cfg = block_config()
    reference = components.DemoTransformer(cfg)
    reference.unembed = TiedUnembed(reference.embed)
    return spread_weights(reference, 800 + seed)


def inputs(case: Case) -> dict[str, torch.Tensor]:
    """The seeded weights, made here: making them in the kernel would need the course's TiedUnembed."""
    return {name: value.contiguous() for name, value in _weights(case.seed).items()}


SHARE = "self.W_E = embed.W_E"
BIAS = "self.b_U = nn.Parameter(torch.zeros(embed.W_E.shape[0]))"
LOGITS = "return x @ self.W_E.T + self.b_U"


def tied_model(cfg, unembed_class, seed: int, weights: dict, what: str = "TiedUnembed") -> nn.Module:
    """A course DemoTransformer whose unembedding is `unembed_class(model.embed)`, with the seeded
    `weights` written in place (so that whatever shares W_E's memory sees them)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = components.DemoTransformer(cfg)
        model.unembed = build_module(what, unembed_class, model.embed)
    bias = getattr(model.unembed, "b_U", None)
    if not isinstance(bias, nn.Parameter) or tuple(bias.shape) != (cfg.d_vocab,):
        raise CheckFailed(with_fix(f"{what} needs its bias as a parameter `self.b_U` of shape [d_vocab] = "
                                   f"[{cfg.d_vocab}] (got {type(bias).__name__}"
                                   f"{'' if bias is None else ' of shape ' + str(list(bias.shape))}).", BIAS))
    with torch.no_grad():
        for name, value in weights.items():
            target = bias if name == "unembed.b_U" else model.get_parameter(name)
            target.copy_(value)
    return model


def _step(model, tokens, targets) -> torch.Tensor:
    """One SGD step on the cross-entropy of the model's logits; returns W_E's gradient. (Plain
    `p -= lr * p.grad` over model.parameters(), which lists a shared parameter once, as SGD does;
    torch.optim's first step would import torch._dynamo, seconds of grading time.)"""
    model.zero_grad()
    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    grad = model.embed.W_E.grad
    grad = torch.zeros_like(model.embed.W_E) if grad is None else grad.detach().clone()
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param -= LR * param.grad
    return grad


def produce(TiedUnembed, case: Case, inputs: dict) -> dict:
    cfg = block_config()
    model = tied_model(cfg, TiedUnembed, case.seed, inputs)
    tokens, targets = _data(case, cfg)
    W_E = model.embed.W_E
    entries = [t for n, t in model.state_dict().items()
               if n.startswith("unembed.") and t.numel() == W_E.numel()]
    shared = [t.untyped_storage().data_ptr() == W_E.untyped_storage().data_ptr() for t in entries]
    outputs = {"logits": run_learner("TiedUnembed", model, tokens),
               "n_entries": torch.tensor(len(entries)), "n_shared": torch.tensor(sum(shared)),
               "n_params": torch.tensor(sum(p.numel() for p in model.parameters()))}
    outputs["grad_W_E"] = run_learner("TiedUnembed (a gradient step)", with_grad, _step, model, tokens,
                                      targets)
    outputs["W_E_after"] = model.embed.W_E.detach().clone()
    outputs["logits_after"] = run_learner("TiedUnembed after a gradient step", model, tokens)
    return outputs


def judge(case: Case, outputs: dict) -> None:
    cfg = block_config()
    d_vocab, d_model = cfg.d_vocab, cfg.d_model
    tokens, targets = _data(case, cfg)
    if int(outputs["n_shared"]) < int(outputs["n_entries"]):
        raise CheckFailed(with_fix(
            f"TiedUnembed: the model's state dict holds a [{d_vocab}, {d_model}]-sized tensor under "
            "unembed. that does not share memory with embed.W_E.\n  Likely mistake: W_U is a copy of "
            "W_E (e.g. `nn.Parameter(embed.W_E.T.clone())`, `.contiguous()`, or a new parameter "
            "initialised from it): training would move the copy and the embedding apart. Keep the "
            "embedding's parameter object itself, and transpose it where the logits are computed.", SHARE),
            mistake="unembedding_copies_w_e")
    expected_count = _untied_count(cfg) - d_vocab * d_model
    count = int(outputs["n_params"])
    if count != expected_count:
        extra = count - expected_count
        second_view = extra == d_vocab * d_model
        raise CheckFailed(with_fix(
            f"TiedUnembed: the model has {count:,} parameters; tied, it should have {expected_count:,} "
            f"(the untied model's {_untied_count(cfg):,} minus d_vocab x d_model = {d_vocab * d_model:,})."
            + ("\n  Likely mistake: a second nn.Parameter views W_E's memory (e.g. "
               "`nn.Parameter(embed.W_E.T)`): the optimizer sees two parameters, so the count does not "
               "drop, each gets only part of the gradient, and Adam would keep two sets of statistics "
               "for one matrix. Reuse the embedding's parameter object itself." if second_view else ""),
            SHARE if second_view else ""), mistake="second_parameter_views_w_e" if second_view else None)
    reference = tied_model(cfg, TiedUnembed, case.seed, _weights(case.seed))
    detached = tied_model(cfg, _Detached, case.seed, _weights(case.seed))
    with torch.no_grad():
        logits = reference(tokens)
        x = reference.ln_final(_resid(reference, tokens))
    compare("TiedUnembed: the model's logits", outputs["logits"], logits, LOGIT_DIMS,
            mistakes={Mistake("no_bias", "the bias b_U is not added"): x @ reference.embed.W_E.T},
            hint="the logits score x against each token's row of the embedding's own W_E, plus the bias b_U.",
            fix=LOGITS)
    grad = with_grad(_step, reference, tokens, targets)
    grad_detached = with_grad(_step, detached, tokens, targets)
    compare("TiedUnembed: the gradient of the loss with respect to embed.W_E", outputs["grad_W_E"], grad,
            ("token", "d_model"),
            mistakes={Mistake("unembedding_detached", "no gradient flows from the unembedding into W_E (e.g. "
                              "`embed.W_E.detach()`, `.data`, or a tensor made from it): W_E's gradient must "
                              "add up both of its uses, looking tokens up and scoring them"): grad_detached},
            hint="the unembedding must hold the embedding's parameter object itself (not a detached tensor "
                 "or a copy), so that W_E's gradient adds up both of its uses.",
            fix=SHARE)
    compare("TiedUnembed: embed.W_E after one SGD step", outputs["W_E_after"], reference.embed.W_E.detach(),
            ("token", "d_model"))
    with torch.no_grad():
        after = reference(tokens)
    compare("TiedUnembed: the logits after one SGD step (the step must move the unembedding too)",
            outputs["logits_after"], after, LOGIT_DIMS)


def _resid(model, tokens):
    resid = model.embed(tokens) + model.pos_embed(tokens)
    for block in model.blocks:
        resid = block(resid)
    return resid


exercise = Exercise("09_transformer_family", "TiedUnembed", produce, judge, inputs=inputs,
                    defaults={"text": None, "batch": 2, "seq": 8})
check_tied_unembed = exercise.checker(
    "Grade `TiedUnembed(embed)`: one parameter shared with the embedding (state dict, parameter "
    "count, gradient, and one SGD step).")
