"""Checks on a config other than GPT-2 small's (notebooks 05 and 06): a module whose contract is
to build its parts with the `cfg` it is given must still work when that config changes.

GPT-2's weights are fitted to the case's config (its first n_layers blocks, each attention's
heads regrouped into n_heads of d_head), the course's module built with that config is what the
learner's is judged against, and a learner's module whose parts were built with another config
(the notebook's global `cfg`, a new `Config()`, a literal 12) is told so by name.
"""
from __future__ import annotations

import re

import einops
from torch import nn

from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.learner import load_learner, reads_global, recorded_text, text_record
from graders.reference import components
from graders.reference.config import Config
from graders.reference.weights import load_strict

ATTENTION = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


def regrouped(w: dict, n_heads: int, d_head: int) -> dict:
    """Attention weights `w` split into `n_heads` heads of `d_head` (n_heads * d_head unchanged)."""
    def heads_in(W):   # [n, d_model, h] -> [n_heads, d_model, d_head]
        return einops.rearrange(einops.rearrange(W, "n d h -> d (n h)"), "d (n h) -> n d h", n=n_heads)

    return {**w, **{name: heads_in(w[name]) for name in ("W_Q", "W_K", "W_V")},
            **{name: w[name].reshape(n_heads, d_head) for name in ("b_Q", "b_K", "b_V")},
            "W_O": w["W_O"].reshape(n_heads, d_head, -1)}


def fitted_weights(weights: dict, cfg: Config) -> dict:
    """`weights` (course names: "attn.W_Q", "blocks.3.attn.W_Q", ...) for a module built with
    `cfg`: blocks past cfg.n_layers dropped, every attention's heads regrouped into cfg.n_heads
    heads of cfg.d_head (the same d_model, GPT-2's heads joined in order)."""
    kept = {k: v for k, v in weights.items()
            if not (m := re.match(r"blocks\.(\d+)\.", k)) or int(m.group(1)) < cfg.n_layers}
    for prefix in [k[:-len("attn.W_Q")] for k in kept if k.endswith("attn.W_Q")]:
        if tuple(kept[prefix + "attn.W_Q"].shape[::2]) != (cfg.n_heads, cfg.d_head):
            heads = regrouped({name: kept[f"{prefix}attn.{name}"] for name in ATTENTION}, cfg.n_heads, cfg.d_head)
            kept.update({f"{prefix}attn.{name}": value for name, value in heads.items()})
    return kept


def course_module(name: str, weights: dict, cfg: Config) -> nn.Module:
    """The course's `name` built with `cfg` and loaded with `fitted_weights(weights, cfg)`."""
    return load_strict(getattr(components, name)(cfg), fitted_weights(weights, cfg), name).eval()


def how_cfg_is_read(cls) -> str:
    """How the learner's class reaches for a config other than its own, for a message's end."""
    if reads_global(cls, "cfg"):
        return ": your code reads the notebook's global `cfg`, not the `cfg` the module is given"
    if reads_global(cls, "Config"):
        return ": your code builds a new Config() instead"
    return ""


HOW_CFG_IS_READ = "how_cfg_is_read"


def record_how_cfg_is_read(cls, case: Case) -> dict:
    """For `produce` on a case with other settings: `how_cfg_is_read(cls)` as a record, when it
    says anything (the judge never sees the learner's code)."""
    how = how_cfg_is_read(cls) if case.settings() else ""
    return {HOW_CFG_IS_READ: text_record(how)} if how else {}


def recorded_how_cfg_is_read(outputs: dict) -> str:
    """For the judge: what record_how_cfg_is_read recorded ("" when nothing)."""
    return recorded_text(outputs[HOW_CFG_IS_READ]) if HOW_CFG_IS_READ in outputs else ""


def built_with_another_config(what: str, module: nn.Module, case: Case) -> str:
    """What is wrong, as a "Likely mistake" sentence, when parts of the learner's `module` were
    built with a config whose settings differ from the case's (empty when none were). n_layers
    is the model's own: no part reads it."""
    settings = {field: value for field, value in case.settings().items() if field != "n_layers"}
    other = {name: sub.cfg for name, sub in module.named_modules()
             if name and isinstance(getattr(sub, "cfg", None), Config)
             and any(getattr(sub.cfg, field) != value for field, value in settings.items())}
    if not other:
        return ""
    names = list(other)
    shown = (", ".join(names[:4]) + f" and {len(names) - 4} more" if len(names) > 5
             else " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names))
    theirs = ", ".join(f"{field} {getattr(other[names[0]], field):g}" for field in settings)
    wanted = ", ".join(f"{field} {value:g}" for field, value in settings.items())
    return Mistake("built_with_another_config", f"the submodules are not built with the cfg passed to __init__: "
                   f"{shown} {'has' if len(names) == 1 else 'have'} {theirs}; this check's config has {wanted}. "
                   f"Build each part with the cfg given to {what}(cfg)" + how_cfg_is_read(type(module)))


def load_or_name(what: str, module: nn.Module, weights: dict, likely: str) -> nn.Module:
    """`weights` loaded into the learner's module; when they do not fit and `likely` names why
    (a part built with another config), the failure says that first, then the loader's words."""
    try:
        return load_learner(what, module, weights)
    except CheckFailed as failure:
        if not likely:
            raise
        raise CheckFailed(f"{what} cannot take this check's weights. Likely mistake: {likely}\n"
                          + "\n".join("  " + line for line in str(failure).splitlines()),
                          mistake=mistake_key(likely)) from None
