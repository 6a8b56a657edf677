"""Reference weights under the course's names and shapes, and strict loading into learner modules.

Names follow the learner's `DemoTransformer`: `embed.W_E`, `pos_embed.W_pos`,
`blocks.{i}.ln1.w`, `blocks.{i}.attn.W_Q`, ..., `ln_final.b`, `unembed.W_U`, `unembed.b_U`.
"""
import einops
import torch
from torch import nn

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


def course_weights(reference) -> dict[str, torch.Tensor]:
    """Every reference weight by course name, from a graders.reference.model.Reference."""
    cfg = reference.hf_model.config
    n_heads, d_model = cfg.n_head, cfg.n_embd
    sd = reference.state_dict
    weights = {
        "embed.W_E": sd["transformer.wte.weight"],                      # [d_vocab, d_model]
        "pos_embed.W_pos": sd["transformer.wpe.weight"],                # [n_ctx, d_model]
        "ln_final.w": sd["transformer.ln_f.weight"],
        "ln_final.b": sd["transformer.ln_f.bias"],
        "unembed.W_U": sd["transformer.wte.weight"].T.contiguous(),     # [d_model, d_vocab]
        "unembed.b_U": torch.zeros(cfg.vocab_size),                     # GPT-2 has no unembed bias
    }
    for i in range(cfg.n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        # Conv1D stores [in, out]; c_attn's out is q, k, v side by side, each head-major.
        w_q, w_k, w_v = sd[h + "attn.c_attn.weight"].split(d_model, dim=1)
        b_q, b_k, b_v = sd[h + "attn.c_attn.bias"].split(d_model)
        for name, w in (("W_Q", w_q), ("W_K", w_k), ("W_V", w_v)):
            weights[b + "attn." + name] = einops.rearrange(
                w, "d_model (n_heads d_head) -> n_heads d_model d_head", n_heads=n_heads)
        for name, bias in (("b_Q", b_q), ("b_K", b_k), ("b_V", b_v)):
            weights[b + "attn." + name] = einops.rearrange(
                bias, "(n_heads d_head) -> n_heads d_head", n_heads=n_heads)
        weights[b + "attn.W_O"] = einops.rearrange(
            sd[h + "attn.c_proj.weight"], "(n_heads d_head) d_model -> n_heads d_head d_model",
            n_heads=n_heads)
        weights[b + "attn.b_O"] = sd[h + "attn.c_proj.bias"]
        for ln, hf_ln in (("ln1", "ln_1"), ("ln2", "ln_2")):
            weights[b + ln + ".w"] = sd[h + hf_ln + ".weight"]
            weights[b + ln + ".b"] = sd[h + hf_ln + ".bias"]
        weights[b + "mlp.W_in"] = sd[h + "mlp.c_fc.weight"]             # [d_model, d_mlp]
        weights[b + "mlp.b_in"] = sd[h + "mlp.c_fc.bias"]
        weights[b + "mlp.W_out"] = sd[h + "mlp.c_proj.weight"]          # [d_mlp, d_model]
        weights[b + "mlp.b_out"] = sd[h + "mlp.c_proj.bias"]
    return {k: v.to(torch.float32).contiguous().clone() for k, v in weights.items()}


def component(weights, prefix: str) -> dict[str, torch.Tensor]:
    """The slice of `weights` under `prefix` (e.g. "blocks.3.attn"), with the prefix removed.
    `weights` is a dict of tensors or an open safetensors file (then only the slice is read)."""
    head = prefix.rstrip(".") + "."
    get = weights.get_tensor if hasattr(weights, "get_tensor") else weights.__getitem__
    part = {k[len(head):]: get(k) for k in weights.keys() if k.startswith(head)}
    if not part:
        raise KeyError(f"No reference weights under {prefix!r}.")
    return part


class WeightLoadError(ValueError):
    """The learner's module does not have the parameters the course expects."""


def _helper_buffers(module: nn.Module, weights) -> set[str]:
    """The learner's buffers the course's version does not have (a helper constant such as
    `IGNORE`): they keep the learner's value, and no weight is expected for them."""
    return {name for name, _ in module.named_buffers() if name not in weights}


def load_strict(module: nn.Module, weights: dict[str, torch.Tensor], what: str = "module") -> nn.Module:
    """Copy `weights` into `module`, naming every missing, unexpected or mis-shaped parameter.

    Strict on parameters. A buffer the course's version does not have (a helper constant such
    as the widely copied `register_buffer("IGNORE", torch.tensor(-1e5))`, persistent or not)
    keeps the learner's own value."""
    if not isinstance(module, nn.Module):
        raise WeightLoadError(
            f"Expected your {what} to be a torch.nn.Module, got {type(module).__name__}. "
            "Did you forget to subclass nn.Module or to call super().__init__()?")
    own = module.state_dict()
    problems = []
    for name, tensor in weights.items():
        if name not in own:
            problems.append(f"  missing: {name} with shape {list(tensor.shape)}")
        elif own[name].shape != tensor.shape:
            problems.append(f"  wrong shape: {name} is {list(own[name].shape)}, "
                            f"expected {list(tensor.shape)}")
    helpers = _helper_buffers(module, weights)
    for name in own:
        if name not in weights and name not in helpers:
            problems.append(f"  unexpected: {name} with shape {list(own[name].shape)} "
                            "(the course's version has no such parameter or buffer)")
    if problems:
        raise WeightLoadError(
            f"Your {what} cannot take the reference weights:\n" + "\n".join(problems) +
            "\nName parameters exactly as in the exercise (nn.Parameter attributes, "
            "submodules as attributes).")
    with torch.no_grad():
        kept = {k: v for k, v in own.items() if k in helpers}
        # load_state_dict copies into the module's own tensors, so `weights` (often the cached
        # reference) is never aliased: no clone needed (a full GPT-2 is 650 MB to clone).
        module.load_state_dict({**kept, **weights}, strict=True)
    return module


# --- Submodules named otherwise than the exercise's ---------------------------------------------

def submodule_renaming(expected: dict[str, tuple], own: dict[str, tuple]) -> dict[str, str] | None:
    """The one renaming of submodule attributes (exercise path -> learner path: "attn" ->
    "attention_heads", "blocks.0.attn" -> "blocks.0.self_attn") under which the learner's
    parameter names and shapes `own` are exactly `expected`; None when there is none, or more
    than one (`ln1`, `ln2` named `norm_a`, `norm_b`: either could be either).

    A missing name and an unexpected one pair up by their longest common suffix of dotted
    segments (renamed_submodule); a pair whose two submodules hold the same names and shapes
    matches. The matches must be one-to-one and cover every missing and every unexpected name;
    a parameter of the wrong shape rules out any renaming."""
    if any(tuple(own[name]) != tuple(shape) for name, shape in expected.items() if name in own):
        return None
    missing = {name for name in expected if name not in own}
    unexpected = {name for name in own if name not in expected}
    pairs = {renamed_submodule(ours, theirs) for ours in missing for theirs in unexpected} - {None}
    matches = {(ours, theirs) for ours, theirs in pairs if _under(expected, ours) == _under(own, theirs)}
    renaming = dict(matches)
    if len(set(renaming.values())) != len(matches):   # a submodule matching two: either could be it
        return None
    covered = ({f"{ours}.{rest}" for ours in renaming for rest in _under(expected, ours)},
               {f"{theirs}.{rest}" for theirs in renaming.values() for rest in _under(own, theirs)})
    return renaming if missing and covered == (missing, unexpected) else None


def renamed_submodule(ours: str, theirs: str) -> tuple[str, str] | None:
    """(exercise path, learner path) of the submodule renamed between two parameter names: what
    precedes their longest common suffix, when that suffix is not empty and the two paths differ
    in their last attribute only."""
    a, b = ours.split("."), theirs.split(".")
    common = 0
    while common < min(len(a), len(b)) and a[-1 - common] == b[-1 - common]:
        common += 1
    a, b = a[:len(a) - common], b[:len(b) - common]
    if common == 0 or not a or a[:-1] != b[:-1]:
        return None
    return ".".join(a), ".".join(b)


def _under(names: dict[str, tuple], path: str) -> dict[str, tuple]:
    """The names (relative) and shapes of what the submodule at `path` holds."""
    return {name[len(path) + 1:]: tuple(shape) for name, shape in names.items() if name.startswith(path + ".")}


def learner_renaming(module: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, str] | None:
    """submodule_renaming between `weights` and the learner's `module`, its helper buffers left
    out as load_strict leaves them out."""
    if not isinstance(module, nn.Module):
        return None
    helpers = _helper_buffers(module, weights)
    own = {name: tuple(t.shape) for name, t in module.state_dict().items() if name not in helpers}
    return submodule_renaming({name: tuple(t.shape) for name, t in weights.items()}, own)


def renamed(weights: dict[str, torch.Tensor], renaming: dict[str, str]) -> dict[str, torch.Tensor]:
    """`weights` under the learner's names (renaming: exercise submodule path -> learner's)."""
    def name_of(name: str) -> str:
        ours = next((p for p in renaming if name.startswith(p + ".")), None)
        return name if ours is None else renaming[ours] + name[len(ours):]
    return {name_of(name): tensor for name, tensor in weights.items()}
