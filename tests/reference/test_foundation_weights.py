"""Course-named reference weights, and strict loading of them into a learner's modules."""
import math

import pytest
import torch
from torch import nn

from graders.reference.config import Config
from graders.reference.weights import WeightLoadError, component, course_weights, load_strict

# --- An independent minimal GPT-2, named like the course's modules ------------------------------

class LayerNorm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.w, self.b = nn.Parameter(torch.ones(cfg.d_model)), nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt() * self.w + self.b


class Embed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens):
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(self, tokens):
        return self.W_pos[: tokens.shape[1]].expand(tokens.shape[0], -1, -1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, d, e = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.empty(h, d, e)) for _ in range(3))
        self.W_O = nn.Parameter(torch.empty(h, e, d))
        self.b_Q, self.b_K, self.b_V = (nn.Parameter(torch.zeros(h, e)) for _ in range(3))
        self.b_O = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        q, k, v = (torch.einsum("bpd,hde->bphe", x, W) + b for W, b in
                   ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V)))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])
        n = scores.shape[-1]
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        pattern = scores.masked_fill(future, float("-inf")).softmax(-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        return torch.einsum("bqhe,hed->bqd", z, self.W_O) + self.b_O


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x):
        pre = x @ self.W_in + self.b_in
        post = 0.5 * pre * (1 + torch.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre**3)))
        return post @ self.W_out + self.b_out


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = LayerNorm(cfg), Attention(cfg), LayerNorm(cfg), MLP(cfg)

    def forward(self, resid):
        resid = resid + self.attn(self.ln1(resid))
        return resid + self.mlp(self.ln2(resid))


class Unembed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_U, self.b_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab)), nn.Parameter(torch.zeros(cfg.d_vocab))

    def forward(self, x):
        return x @ self.W_U + self.b_U


class DemoTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed, self.pos_embed = Embed(cfg), PosEmbed(cfg)
        self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_final, self.unembed = LayerNorm(cfg), Unembed(cfg)

    def forward(self, tokens):
        resid = self.embed(tokens) + self.pos_embed(tokens)
        for block in self.blocks:
            resid = block(resid)
        return self.unembed(self.ln_final(resid))


# --- course_weights ----------------------------------------------------------------------------

def expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Names and shapes exactly as the course's exercises specify them."""
    d, h, e, m = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
    shapes = {"embed.W_E": (cfg.d_vocab, d), "pos_embed.W_pos": (cfg.n_ctx, d),
              "ln_final.w": (d,), "ln_final.b": (d,),
              "unembed.W_U": (d, cfg.d_vocab), "unembed.b_U": (cfg.d_vocab,)}
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        shapes.update({b + "ln1.w": (d,), b + "ln1.b": (d,), b + "ln2.w": (d,), b + "ln2.b": (d,),
                       b + "attn.W_Q": (h, d, e), b + "attn.W_K": (h, d, e), b + "attn.W_V": (h, d, e),
                       b + "attn.W_O": (h, e, d), b + "attn.b_Q": (h, e), b + "attn.b_K": (h, e),
                       b + "attn.b_V": (h, e), b + "attn.b_O": (d,),
                       b + "mlp.W_in": (d, m), b + "mlp.b_in": (m,),
                       b + "mlp.W_out": (m, d), b + "mlp.b_out": (d,)})
    return shapes


@pytest.fixture(scope="module")
def weights(reference):
    return course_weights(reference)


def test_names_and_shapes_are_the_courses(weights):
    shapes = expected_shapes(Config())
    assert sorted(weights) == sorted(shapes)  # nothing missing, nothing extra
    assert {k: tuple(v.shape) for k, v in weights.items()} == shapes
    assert all(v.dtype == torch.float32 and v.is_contiguous() for v in weights.values())


def test_values_follow_gpt2_layout(reference, weights):
    """Each course tensor is the right slice of the Hugging Face tensors (Conv1D is [in, out])."""
    sd, d, e = reference.state_dict, 768, 64
    assert torch.equal(weights["embed.W_E"], sd["transformer.wte.weight"])
    assert torch.equal(weights["unembed.W_U"], sd["transformer.wte.weight"].T)
    assert torch.equal(weights["unembed.b_U"], torch.zeros(50257))
    assert torch.equal(weights["pos_embed.W_pos"], sd["transformer.wpe.weight"])
    assert torch.equal(weights["ln_final.w"], sd["transformer.ln_f.weight"])
    for i in (0, 7, 11):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        c_attn, c_attn_b = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
        for head in (0, 5, 11):
            cols = slice(head * e, (head + 1) * e)
            for j, name in enumerate("QKV"):
                shifted = slice(j * d + cols.start, j * d + cols.stop)
                assert torch.equal(weights[b + f"attn.W_{name}"][head], c_attn[:, shifted])
                assert torch.equal(weights[b + f"attn.b_{name}"][head], c_attn_b[shifted])
            assert torch.equal(weights[b + "attn.W_O"][head], sd[h + "attn.c_proj.weight"][cols])
        assert torch.equal(weights[b + "attn.b_O"], sd[h + "attn.c_proj.bias"])
        assert torch.equal(weights[b + "ln2.b"], sd[h + "ln_2.bias"])
        assert torch.equal(weights[b + "mlp.W_in"], sd[h + "mlp.c_fc.weight"])
        assert torch.equal(weights[b + "mlp.W_out"], sd[h + "mlp.c_proj.weight"])


def test_weights_are_copies(reference, reference_tokens):
    """A learner editing the weights in place must not change the reference."""
    weights = course_weights(reference)
    before = reference.state_dict["transformer.h.0.mlp.c_fc.bias"].clone()
    for tensor in weights.values():
        tensor.zero_()
    assert torch.equal(reference.state_dict["transformer.h.0.mlp.c_fc.bias"], before)
    assert course_weights(reference)["blocks.0.mlp.b_in"].abs().sum() > 0


def test_component_slices_one_module(weights):
    attn = component(weights, "blocks.3.attn")
    assert sorted(attn) == sorted(["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"])
    assert all(torch.equal(attn[k], weights[f"blocks.3.attn.{k}"]) for k in attn)
    assert sorted(component(weights, "blocks.3.attn.")) == sorted(attn)
    block1 = component(weights, "blocks.1")  # not blocks.10 / blocks.11
    assert len(block1) == 16 and all(not k.startswith(("0.", "1.")) for k in block1)
    assert sorted(component(weights, "unembed")) == ["W_U", "b_U"]
    with pytest.raises(KeyError, match="blocks.12"):
        component(weights, "blocks.12")


# --- load_strict into an independent DemoTransformer -------------------------------------------

def test_demo_transformer_reproduces_synthetic_logits(reference, reference_tokens, reference_acts):
    from graders.judging.tolerance import close

    model = load_strict(DemoTransformer(Config()), course_weights(reference))
    with torch.no_grad():
        logits = model(reference_tokens)
    expected = reference_acts["logits"]
    # fp32 rounding alone puts both this model and the bridge ~7e-5 away from an fp64 forward
    # (logits reach ~22 after twelve demanding blocks); 1e-4 would leave a margin under 2x.
    assert (logits - expected).abs().max() < 2e-4
    assert close(logits, expected)  # and a correct DemoTransformer passes the course's grading


def test_demo_transformer_reproduces_small_pretrained_logits(small_gpt2_dir, monkeypatch):
    from graders.reference.model import PRETRAINED_DIR_ENV, load_reference

    monkeypatch.setenv(PRETRAINED_DIR_ENV, str(small_gpt2_dir))
    small = load_reference.__wrapped__("pretrained", quiet=True)
    cfg = Config(d_model=64, n_heads=4, d_head=16, d_mlp=256, n_ctx=64, n_layers=2)
    model = load_strict(DemoTransformer(cfg), course_weights(small))
    tokens = torch.tensor([[50256, 40, 716, 281, 4998, 1960, 382, 19741, 11, 875], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        expected = small.bridge(tokens)
        logits = model(tokens)
    assert expected.abs().max() > 0.1  # a real signal, not an all-zero model
    assert (logits - expected).abs().max() < 1e-4


# --- load_strict errors ------------------------------------------------------------------------

class BrokenMLP(nn.Module):
    """W_out missing, an extra `scale`, and W_in transposed."""

    def __init__(self, cfg):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_in, self.b_out = nn.Parameter(torch.zeros(cfg.d_mlp)), nn.Parameter(torch.zeros(cfg.d_model))
        self.scale = nn.Parameter(torch.ones(()))


def test_load_strict_names_every_problem(weights):
    mlp = component(weights, "blocks.0.mlp")
    with pytest.raises(WeightLoadError) as err:
        load_strict(BrokenMLP(Config()), mlp, "MLP")
    message = str(err.value)
    assert "Your MLP cannot take the reference weights" in message
    assert "missing: W_out with shape [3072, 768]" in message
    assert "unexpected: scale with shape []" in message
    assert "wrong shape: W_in is [3072, 768], expected [768, 3072]" in message
    # A correct module loads, and gets copies of the values.
    good = load_strict(MLP(Config()), mlp, "MLP")
    assert all(torch.equal(getattr(good, k), v) for k, v in mlp.items())
    assert good.W_in.data_ptr() != mlp["W_in"].data_ptr()


def test_load_strict_keeps_the_learners_own_buffers_and_refuses_extra_parameters(weights):
    ln = component(weights, "blocks.0.ln1")
    module = LayerNorm(Config())
    module.register_buffer("eps_buffer", torch.tensor(1e-5), persistent=False)
    module.register_buffer("IGNORE", torch.tensor(-1e5))             # persistent, as often copied
    load_strict(module, ln)
    assert module.IGNORE.item() == -1e5 and torch.equal(module.w, ln["w"])
    module.extra = torch.nn.Parameter(torch.zeros(()))
    with pytest.raises(WeightLoadError, match="unexpected: extra"):
        load_strict(module, ln)


def test_load_strict_refuses_a_non_module(weights):
    class NotAModule:
        def __init__(self, cfg):
            self.w = torch.ones(cfg.d_model)

    with pytest.raises(WeightLoadError, match="Expected your LayerNorm to be a torch.nn.Module, got NotAModule"):
        load_strict(NotAModule(Config()), component(weights, "blocks.0.ln1"), "LayerNorm")
