"""Notebook 06's model read hook by hook: the graded activations of a DemoTransformer (the
learner's or the course's), and what each known wiring mistake makes of the course's model."""
from __future__ import annotations

import weakref
from dataclasses import replace

import torch
from torch import nn

from graders.exercises.common.submodules import TAKES_RESIDUAL, TAKES_TOKENS, submodule_crash, watch
from graders.judging.compare import Mistake
from graders.reference.config import Config


def model_hooks(n_layers: int) -> list[str]:
    hooks = ["hook_embed", "hook_pos_embed"]
    for i in range(n_layers):
        hooks += [f"blocks.{i}.hook_resid_pre", f"blocks.{i}.hook_resid_post"]
    return hooks + ["ln_final.hook_out", "logits"]


def _submodules(model: nn.Module) -> dict[str, nn.Module]:
    named = {"embed": getattr(model, "embed", None), "pos_embed": getattr(model, "pos_embed", None)}
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential, list, tuple)):
        for i, block in enumerate(blocks):
            named[f"blocks.{i}"] = block
    named["ln_final"] = getattr(model, "ln_final", None)
    named["unembed"] = getattr(model, "unembed", None)
    return named


def model_trace(model: nn.Module, tokens: torch.Tensor, forward=None, runner=None) -> dict:
    """The model's graded activations, read with hooks on its submodules, plus call counts."""
    named = _submodules(model)
    takes = {"embed": TAKES_TOKENS, "pos_embed": TAKES_TOKENS, "blocks": TAKES_RESIDUAL,
             "ln_final": TAKES_RESIDUAL, "unembed": TAKES_RESIDUAL}
    n_blocks = sum(1 for name in named if name.startswith("blocks."))
    taps = [("hook_embed", "embed", 1), ("hook_pos_embed", "pos_embed", 1)] + [
        (f"blocks.{i}.{hook}", f"blocks.{i}", which) for i in range(n_blocks)
        for hook, which in (("hook_resid_pre", 0), ("hook_resid_post", 1))] + [
        ("ln_final.hook_out", "ln_final", 1)]

    def crashed(failure, rec):
        return submodule_crash("DemoTransformer", failure, rec, takes, Config().d_model)

    logits, trace, rec = watch(named, forward or model, tokens, taps, runner, crashed)
    trace["logits"] = logits.detach().clone() if isinstance(logits, torch.Tensor) else logits
    trace["calls"] = torch.tensor([rec.count(n) for n in named])
    blocks = [m for n, m in named.items() if n.startswith("blocks.") and isinstance(m, nn.Module)]
    trace["distinct_blocks"] = torch.tensor(len({id(b) for b in blocks}))
    return trace


def _blocks(m, resid, order):
    for i in order:
        resid = m.blocks[i](resid)
    return resid


def _model_mistakes(n: int):
    every = list(range(n))
    return {
        Mistake("no_pos_embed", "no positional embedding: the residual stream starts as embed(tokens) + "
                "pos_embed(tokens)"):
            lambda m, t: m.unembed(m.ln_final(_blocks(m, m.embed(t), every))),
        Mistake("no_ln_final", "ln_final is missing: the last residual stream goes through ln_final before "
                "unembed"):
            lambda m, t: m.unembed(_blocks(m, m.embed(t) + m.pos_embed(t), every)),
        Mistake("blocks_reversed", "the blocks run in reverse order: blocks[0] first, blocks[n_layers - 1] last"):
            lambda m, t: m.unembed(m.ln_final(_blocks(m, m.embed(t) + m.pos_embed(t), every[::-1]))),
        Mistake("only_first_block", "only the first block runs: loop over all of self.blocks, feeding each "
                "block's output to the next"):
            lambda m, t: m.unembed(m.ln_final(_blocks(m, m.embed(t) + m.pos_embed(t), [0]))),
        Mistake("only_last_block", "only the last block runs: loop over all of self.blocks, feeding each "
                "block's output to the next"):
            lambda m, t: m.unembed(m.ln_final(_blocks(m, m.embed(t) + m.pos_embed(t), [n - 1]))),
        Mistake("first_block_repeated", "blocks[0] is applied n_layers times: use each block of self.blocks "
                "once, in order"):
            lambda m, t: m.unembed(m.ln_final(_blocks(m, m.embed(t) + m.pos_embed(t), [0] * n))),
        Mistake("blocks_read_embeddings", "every block reads the embeddings (the loop does not feed each block's "
                "output to the next)"):
            lambda m, t: m.unembed(m.ln_final([m.blocks[i](m.embed(t) + m.pos_embed(t)) for i in every][-1])),
        Mistake("residual_added_twice", "the residual is added twice (resid = resid + block(resid)): a block "
                "already returns resid + its sublayers' outputs"):
            lambda m, t: m.unembed(m.ln_final(_double_residual(m, m.embed(t) + m.pos_embed(t)))),
    }


def _double_residual(m, resid):
    for block in m.blocks:
        resid = resid + block(resid)
    return resid


_LAST_TRACES: list = []   # the last computed: [(a weak reference to the model, tokens, how_read, traces)]


def mistake_traces(model: nn.Module, tokens: torch.Tensor, how_read: str = "") -> dict[str, dict]:
    """What each known mistake makes of the course's `model` on `tokens`, hook by hook; kept
    for the next failure on the same model and tokens (nine passes of GPT-2 small each)."""
    for last_model, last_tokens, last_how, traces in _LAST_TRACES:
        if last_model() is model and last_how == how_read and torch.equal(last_tokens, tokens):
            return traces
    _LAST_TRACES[:] = [(weakref.ref(model), tokens.clone(), how_read, _mistake_traces(model, tokens, how_read))]
    return _LAST_TRACES[0][3]


def _mistake_traces(model: nn.Module, tokens: torch.Tensor, how_read: str) -> dict[str, dict]:
    mistakes = _model_mistakes(model.cfg.n_layers)
    wanted, default = model.cfg.layer_norm_eps, Config().layer_norm_eps
    if wanted != default:
        mistakes[Mistake("eps_not_from_config",
                         f"eps is not read from cfg.layer_norm_eps: ln_final used {default:g} (GPT-2's); this "
                         f"check's config has {wanted:g}. Build ln_final with the cfg given to "
                         f"DemoTransformer(cfg)" + how_read)] = lambda m, t: _with_ln_final_eps(m, t, default)
    with torch.no_grad():
        return {d: model_trace(model, tokens, lambda t, f=f: f(model, t)) for d, f in mistakes.items()}


def _with_ln_final_eps(model: nn.Module, tokens: torch.Tensor, eps: float) -> torch.Tensor:
    """The model's logits with its ln_final reading another layer_norm_eps (put back after)."""
    own = model.ln_final.cfg
    model.ln_final.cfg = replace(own, layer_norm_eps=eps)
    try:
        return model(tokens)
    finally:
        model.ln_final.cfg = own
