"""Reference activations for a token batch, computed once and kept on disk.

The key is (weights fingerprint, tokens, library versions), so grading a second time runs no
reference forward pass, and a library upgrade or other weights never serve stale arrays.
"""
import hashlib
import json
from pathlib import Path

import torch

from graders.reference.paths import atomic_write, building, cache_dir

FORMAT = 1
PER_BLOCK_HOOKS = (
    "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", "ln1.hook_out",
    "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern",
    "attn.hook_z", "hook_attn_out", "hook_resid_mid", "ln2.hook_scale", "ln2.hook_normalized",
    "ln2.hook_out", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
)
FINAL_HOOKS = ("ln_final.hook_scale", "ln_final.hook_normalized", "ln_final.hook_out")


def graded_hooks(n_layers: int) -> list[str]:
    """The hook names the course grades, in forward order (logits last, under "logits")."""
    names = ["hook_embed", "hook_pos_embed"]
    names += [f"blocks.{i}.{h}" for i in range(n_layers) for h in PER_BLOCK_HOOKS]
    return names + list(FINAL_HOOKS) + ["logits"]


def _key(fingerprint: str, tokens: torch.Tensor) -> str:
    from importlib.metadata import version

    parts = {
        "format": FORMAT, "weights": fingerprint, "tokens": tokens.tolist(),
        "versions": [version(p) for p in ("torch", "transformers", "transformer-lens", "numpy")],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _batched(tokens) -> torch.Tensor:
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    return tokens[None] if tokens.ndim == 1 else tokens


def activation_path(reference, tokens) -> Path:
    """Where the activations of `reference` (a Reference or ReferenceId) on `tokens` are cached."""
    return cache_dir("activations") / f"{_key(reference.fingerprint, _batched(tokens))}.safetensors"


def reference_activations(reference, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every graded activation of `reference` on `tokens`.

    `reference` is a loaded graders.reference.model.Reference, or just its ReferenceId: then the
    model is loaded only when the activations are not cached yet.
    """
    from safetensors.torch import load_file, save_file

    tokens = _batched(tokens)
    path = activation_path(reference, tokens)
    if path.is_file():
        try:
            return load_file(path)
        except Exception:  # a truncated or corrupt file: recompute it
            path.unlink(missing_ok=True)
    if hasattr(reference, "bridge"):
        bridge = reference.bridge
    else:
        from graders.reference.model import load_reference

        bridge = load_reference(reference.source, quiet=True).bridge
    names = graded_hooks(bridge.cfg.n_layers)
    with torch.no_grad(), building("running the reference on this text, once"):
        logits, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n in names)
    acts = {n: cache[n].detach().to(torch.float32).clone() for n in names if n != "logits"}
    acts["logits"] = logits.detach().to(torch.float32).contiguous()
    atomic_write(path, lambda temporary: save_file(acts, temporary))
    return acts
