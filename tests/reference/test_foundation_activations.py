"""Reference activations: every graded hook, faithful to plain GPT-2, cached on disk by key."""
import dataclasses

import pytest
import torch

import graders.reference.activations as act
from graders.reference.activations import graded_hooks, reference_activations
from graders.reference.paths import CACHE_ENV


def expected_shapes(batch=1, pos=35, d=768, heads=12, d_head=64, mlp=3072, vocab=50257, layers=12):
    by_suffix = {
        "hook_scale": (batch, pos, 1), "hook_q": (batch, pos, heads, d_head),
        "hook_k": (batch, pos, heads, d_head), "hook_v": (batch, pos, heads, d_head),
        "hook_z": (batch, pos, heads, d_head), "hook_attn_scores": (batch, heads, pos, pos),
        "hook_pattern": (batch, heads, pos, pos), "hook_pre": (batch, pos, mlp),
        "hook_post": (batch, pos, mlp), "logits": (batch, pos, vocab),
    }
    return {name: by_suffix.get(name.rsplit(".", 1)[-1], (batch, pos, d)) for name in graded_hooks(layers)}


def test_graded_hooks_are_in_forward_order():
    names = graded_hooks(12)
    assert len(names) == len(set(names)) == 2 + 12 * 19 + 3 + 1
    assert names[:3] == ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre"]
    assert names[-4:] == ["ln_final.hook_scale", "ln_final.hook_normalized", "ln_final.hook_out", "logits"]
    assert names.index("blocks.3.attn.hook_pattern") < names.index("blocks.3.attn.hook_z") \
        < names.index("blocks.3.hook_mlp_out") < names.index("blocks.4.hook_resid_pre")


def test_every_graded_hook_with_its_shape(reference_acts):
    shapes = expected_shapes()
    assert sorted(reference_acts) == sorted(shapes)
    assert {k: tuple(v.shape) for k, v in reference_acts.items()} == shapes
    assert all(v.dtype == torch.float32 for v in reference_acts.values())


def test_hooks_see_the_plain_gpt2_forward(reference, reference_tokens, reference_acts):
    """Same weights in a plain transformers GPT2LMHeadModel: same residual stream, same logits."""
    from transformers import GPT2LMHeadModel

    from graders.reference import synthetic
    from graders.reference.paths import cache_dir

    plain = GPT2LMHeadModel.from_pretrained(
        cache_dir(f"synthetic-gpt2-v{synthetic.VERSION}"), attn_implementation="eager",
        dtype=torch.float32).eval()
    assert synthetic.fingerprint(plain.state_dict()) == reference.fingerprint
    assert plain.config._attn_implementation == "eager"
    with torch.no_grad():
        out = plain(reference_tokens, output_hidden_states=True)
    acts = reference_acts
    assert torch.equal(acts["hook_embed"] + acts["hook_pos_embed"], out.hidden_states[0])
    pairs = [(acts[f"blocks.{i}.hook_resid_post"], out.hidden_states[i + 1]) for i in range(11)]
    pairs += [(acts["ln_final.hook_out"], out.hidden_states[12]), (acts["logits"], out.logits)]
    for mine, theirs in pairs:
        # Only fp32 rounding separates the two (logits reach ~22; ~6e-5 apart, as far as either
        # is from an fp64 forward): 1e-5 relative to the largest value.
        assert (mine - theirs).abs().max() <= 1e-5 * theirs.abs().max()


class NoBridge:
    """A bridge that must not be run: the activations have to come from the cache."""

    cfg = type("cfg", (), {"n_layers": 12})

    def run_with_cache(self, *args, **kwargs):
        raise AssertionError("the reference forward pass ran although the activations were cached")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path / "activations"


def test_second_call_reads_the_cache(reference, reference_tokens, fresh_cache):
    cold = dataclasses.replace(reference, bridge=NoBridge())
    with pytest.raises(AssertionError, match="forward pass ran"):
        reference_activations(cold, reference_tokens)  # nothing cached yet: the bridge is needed
    first = reference_activations(reference, reference_tokens)
    assert len(list(fresh_cache.glob("*.safetensors"))) == 1
    again = reference_activations(cold, reference_tokens[0])  # 1-D tokens mean the same batch
    assert sorted(again) == sorted(first)
    assert all(torch.equal(again[k], first[k]) for k in first)


def test_cache_key_depends_on_tokens_and_weights(reference, reference_tokens, fresh_cache):
    key = act._key(reference.fingerprint, reference_tokens)
    other_tokens = reference_tokens.clone()
    other_tokens[0, -1] = 30
    assert act._key(reference.fingerprint, other_tokens) != key
    assert act._key("0" * 64, reference_tokens) != key
    assert act._key(reference.fingerprint, reference_tokens.repeat(2, 1)) != key
    first = reference_activations(reference, reference_tokens)
    other = reference_activations(reference, other_tokens)
    assert len(list(fresh_cache.glob("*.safetensors"))) == 2
    assert torch.equal(other["blocks.11.hook_resid_post"][:, :-1], first["blocks.11.hook_resid_post"][:, :-1])
    assert not torch.equal(other["logits"][:, -1], first["logits"][:, -1])
    # Other weights never get these arrays.
    with pytest.raises(AssertionError, match="forward pass ran"):
        reference_activations(dataclasses.replace(reference, bridge=NoBridge(), fingerprint="0" * 64),
                              reference_tokens)


def test_corrupt_cache_file_is_recomputed(reference, reference_tokens, fresh_cache):
    first = reference_activations(reference, reference_tokens)
    (path,) = fresh_cache.glob("*.safetensors")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 3)
    with pytest.raises(AssertionError, match="forward pass ran"):  # no half-read arrays served
        reference_activations(dataclasses.replace(reference, bridge=NoBridge()), reference_tokens)
    again = reference_activations(reference, reference_tokens)
    assert path.stat().st_size == size
    assert all(torch.equal(again[k], first[k]) for k in first)


def test_concurrent_computations_of_one_key_both_succeed(reference, reference_tokens, fresh_cache, monkeypatch):
    """Interleaving: A writes its file, B computes and publishes the same key, then A publishes."""
    import safetensors.torch

    real_save = safetensors.torch.save_file
    other_process_ran = []

    def save_then_let_the_other_process_finish(tensors, filename, *args, **kwargs):
        real_save(tensors, filename, *args, **kwargs)
        if not other_process_ran:
            other_process_ran.append(True)
            reference_activations(reference, reference_tokens)  # process B, start to end

    monkeypatch.setattr(safetensors.torch, "save_file", save_then_let_the_other_process_finish)
    acts = reference_activations(reference, reference_tokens)  # process A
    assert other_process_ran and len(list(fresh_cache.glob("*.safetensors"))) == 1
    assert sorted(acts) == sorted(graded_hooks(12))
