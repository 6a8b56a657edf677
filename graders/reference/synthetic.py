"""A deterministic, demanding stand-in for GPT-2 small, for machines without the real weights.

Weights come from numpy's PCG64 with a fixed seed (bit-identical on every platform), one
independent stream per tensor, so the model is the same everywhere. The scales are chosen so
that activations look like a trained GPT-2's: LayerNorm gains and biases far from 1 and 0,
attention patterns far from uniform, MLP pre-activations spread over about ±4, and a residual
stream whose norm grows with depth. That makes the usual mistakes (sample variance, erf GELU,
scaling by sqrt(d_model), ...) move outputs far beyond the grading tolerance.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SEED = 20261122
VERSION = 1  # bump when the recipe changes: it names the cache folder
D_MODEL, N_LAYERS, N_HEADS, D_MLP, N_CTX, D_VOCAB = 768, 12, 12, 3072, 1024, 50257

# Standard deviations (with the reasons they are what they are).
EMBED_STD = 0.12          # GPT-2's token embeddings have a std of about 0.14
POS_STD = 0.05            # positional embeddings are smaller than token embeddings
QK_STD = 0.07             # scores q.k/8 with a std of ~3: sharp, far-from-uniform patterns
V_STD = 0.036             # values of unit-ish size
O_STD = 0.015             # attention writes ~0.5 per feature per layer into the residual
MLP_IN_STD = 0.055        # pre-activations with a std of ~2, i.e. spread over about ±4
MLP_OUT_STD = 0.008       # MLP writes grow the residual stream layer by layer
BIAS_STD = 0.3            # biases matter: leaving one out is a visible mistake
OUT_BIAS_STD = 0.1        # biases added straight into the residual stream


def hf_config():
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=D_VOCAB, n_positions=N_CTX, n_embd=D_MODEL, n_layer=N_LAYERS,
        n_head=N_HEADS, n_inner=D_MLP, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, tie_word_embeddings=True,
    )


def _tensor_specs():
    """(Hugging Face name, shape, sampler) for every parameter of GPT2LMHeadModel."""
    import numpy as np   # here: `make check` identifies the reference (this module) without numpy

    normal = lambda std: (lambda rng, shape: rng.standard_normal(shape) * std)  # noqa: E731
    gain = lambda rng, shape: rng.uniform(0.3, 2.2, shape) * rng.choice([1.0, 1.0, 1.0, -1.0], shape)  # noqa: E731,E501
    yield "transformer.wte.weight", (D_VOCAB, D_MODEL), normal(EMBED_STD)
    yield "transformer.wpe.weight", (N_CTX, D_MODEL), normal(POS_STD)
    for i in range(N_LAYERS):
        h = f"transformer.h.{i}."
        yield h + "ln_1.weight", (D_MODEL,), gain
        yield h + "ln_1.bias", (D_MODEL,), normal(BIAS_STD)
        qkv_std = np.repeat([QK_STD, QK_STD, V_STD], D_MODEL)
        yield h + "attn.c_attn.weight", (D_MODEL, 3 * D_MODEL), lambda rng, s, q=qkv_std: rng.standard_normal(s) * q  # noqa: E501
        yield h + "attn.c_attn.bias", (3 * D_MODEL,), normal(BIAS_STD)
        yield h + "attn.c_proj.weight", (D_MODEL, D_MODEL), normal(O_STD)
        yield h + "attn.c_proj.bias", (D_MODEL,), normal(OUT_BIAS_STD)
        yield h + "ln_2.weight", (D_MODEL,), gain
        yield h + "ln_2.bias", (D_MODEL,), normal(BIAS_STD)
        yield h + "mlp.c_fc.weight", (D_MODEL, D_MLP), normal(MLP_IN_STD)
        yield h + "mlp.c_fc.bias", (D_MLP,), normal(BIAS_STD)
        yield h + "mlp.c_proj.weight", (D_MLP, D_MODEL), normal(MLP_OUT_STD)
        yield h + "mlp.c_proj.bias", (D_MODEL,), normal(OUT_BIAS_STD)
    yield "transformer.ln_f.weight", (D_MODEL,), gain
    yield "transformer.ln_f.bias", (D_MODEL,), normal(BIAS_STD)


def synthetic_state_dict() -> dict[str, torch.Tensor]:
    """The synthetic weights, by Hugging Face name (the unembedding is tied to `wte`)."""
    import numpy as np
    import torch

    state = {}
    for index, (name, shape, sample) in enumerate(_tensor_specs()):
        rng = np.random.Generator(np.random.PCG64([SEED, index]))
        state[name] = torch.from_numpy(sample(rng, shape).astype(np.float32))
    return state


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """sha256 over names, shapes and fp32 bytes of the GPT-2 tensors, in name order.

    Only `transformer.*` counts: `lm_head.weight` is the same tensor as `transformer.wte.weight`.
    """
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name in sorted(n for n in state if n.startswith("transformer.")):
        tensor = state[name].detach().to(torch.float32).contiguous()
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def expected_fingerprint() -> str:
    """The fingerprint committed in `data/` — the same on every platform, or the recipe drifted."""
    manifest = Path(__file__).resolve().parents[2] / "data" / "synthetic_gpt2.json"
    return json.loads(manifest.read_text())["sha256"]


def write_synthetic(directory: Path) -> str:
    """Generate the weights into `directory` in Hugging Face format; return the fingerprint."""
    from transformers import GPT2LMHeadModel

    state = synthetic_state_dict()
    model = GPT2LMHeadModel(hf_config())
    model.load_state_dict(state, strict=False)  # lm_head.weight is tied to wte, not stored
    model.save_pretrained(directory)
    return fingerprint(state)
