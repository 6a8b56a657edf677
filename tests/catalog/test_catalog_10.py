"""Notebook 10's graders: correct variants (in other styles) pass, each catalogued mistake fails with
its name, and the course's decoder agrees with transformers' LlamaForCausalLM."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb10
from graders.exercises.nb10 import reference as ref
from graders.judging.compare import CheckFailed
from graders.judging.tolerance import close
from course_code import course_code_allowed
from catalog_helpers import fails_with

# The variants are built on the course's reference decoder (a subclass with one method changed).
reference_code_allowed = course_code_allowed(ref)


def test_the_course_decoder_matches_llama_whole_and_cached():
    from graders.exercises.nb10.norm_mlp import hf_model, weights

    for n_kv in (2, 1, 8):
        cfg = nb10.ModernConfig(n_kv_heads=n_kv)
        model = ref.ModernDecoder(cfg)
        model.load_state_dict(weights(3, n_kv))
        tokens = torch.randint(0, cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = hf_model(3, n_kv)(tokens).logits
            first, past = model(tokens[:, :4])
            second, _ = model(tokens[:, 4:], past)
        assert close(torch.cat([first, second], 1), expected, depth=cfg.n_layers + 1)


# --- RMSNorm -----------------------------------------------------------------------------------

def _norm(center=False, eps_outside=False, weight=True, norm=False, einsum=False, eps=None,
          in_input_dtype=False, weight_first=False, cast_back=True, dim=-1, one_plus=False, std=False):
    class RMSNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg, self.w = cfg, nn.Parameter(torch.ones(cfg.d_model))

        def forward(self, x):
            x32 = x if in_input_dtype else x.float()
            if center:
                x32 = x32 - x32.mean(-1, keepdim=True)
            ms = (torch.einsum("bpd,bpd->bp", x32, x32)[..., None] / x.shape[-1] if einsum
                  else x32.pow(2).mean(dim, keepdim=True))
            if norm:
                ms = ms * x.shape[-1]
            if std:
                ms = x32.var(-1, unbiased=False, keepdim=True)
            epsilon = self.cfg.rms_norm_eps if eps is None else eps
            scaled = (x32 / (ms.sqrt() + epsilon) if eps_outside else x32 * torch.rsqrt(ms + epsilon))
            if weight_first:
                return (scaled * self.w.float()).to(x.dtype)
            w = (1 + self.w) if one_plus else self.w if weight else 1
            return (scaled.to(x.dtype) if cast_back else scaled) * w
    return RMSNorm


@pytest.mark.parametrize("cls", [ref.RMSNorm, _norm(), _norm(einsum=True), _norm(weight_first=True)])
def test_rms_norm_correct_variants_pass(cls):
    nb10.check_rms_norm(cls)
    nb10.check_rms_norm(cls, seed=3, batch=1, seq=30, rms_norm_eps=1e-5)


@pytest.mark.parametrize("cls, expected", [
    (_norm(center=True), "Likely mistake: the mean is subtracted (that is LayerNorm)"),
    (_norm(eps_outside=True), "Likely mistake: eps is added outside the square root"),
    (_norm(weight=False), "Likely mistake: the learned weight w is not applied"),
    (_norm(norm=True), "Likely mistake: dividing by the norm"),
    (_norm(in_input_dtype=True), "Likely mistake: the mean square is computed in float16"),
    (_norm(cast_back=False), "Likely mistake: the normalised x is not cast back"),
    (_norm(dim=1), "Likely mistake: the mean square is taken over positions (dim 1)"),
    (_norm(one_plus=True), "Likely mistake: the weight is applied as (1 + w)"),
    (_norm(center=True, einsum=True), "Likely mistake: the mean is subtracted"),
    (_norm(std=True), "Likely mistake: x is divided by its standard deviation (the centred variance)"),
])
def test_rms_norm_mistakes_are_named(cls, expected):
    fails_with(nb10.check_rms_norm, cls, expected=expected)


def test_an_untouched_rms_norm_is_answered_before_the_weights_are_made(monkeypatch):
    """The check of an unwritten exercise answers at once; making the seeded weights (a
    second or more on a kernel's first check) waits until the stub has run."""
    from graders.exercises.nb10 import norm_mlp

    class RMSNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg, self.w = cfg, nn.Parameter(torch.ones(cfg.d_model))

        def forward(self, x):
            raise NotImplementedError()

    def no_weights(*args):
        raise AssertionError("the seeded weights were made for an unwritten RMSNorm")

    monkeypatch.setattr(norm_mlp, "weights", no_weights)
    fails_with(nb10.check_rms_norm, RMSNorm, expected="RMSNorm: not written yet")


def test_rms_norm_with_eps_written_in_fails_a_config_with_another():
    nb10.check_rms_norm(_norm(eps=1e-6))
    fails_with(nb10.check_rms_norm, _norm(eps=1e-6), rms_norm_eps=1e-5,
               expected="Likely mistake: eps is not read from the config: 1e-06 is used where this config's "
                        "rms_norm_eps is 1e-05")


class NormBy(nn.Module):
    """An RMSNorm whose forward is `normalise(x, w, eps)`: the mistakes no catalog lists."""
    normalise = None

    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.w = cfg, nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x):
        return type(self).normalise(x.float(), self.w, self.cfg.rms_norm_eps).to(x.dtype)


def _norm_by(normalise):
    return type("RMSNorm", (NormBy,), {"normalise": staticmethod(normalise)})


def _rms(x, eps):
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


@pytest.mark.parametrize("normalise, expected", [
    # held-out mistakes
    (lambda x, w, eps: x / (x.abs().mean(-1, keepdim=True) + eps) * w,
     "Likely mistake: each row's direction is right but its length is not: x is divided by the mean absolute "
     "value, mean(|x|)"),
    (lambda x, w, eps: x * w / _rms(x * w, eps),
     "Likely mistake: your output does not change when the weight w is doubled: w is applied before normalising"),
    # invented here, in no catalog
    (lambda x, w, eps: x / x.abs().amax(-1, keepdim=True) * w,
     "Likely mistake: each row's direction is right but its length is not: x is divided by the largest absolute "
     "value, max(|x|)"),
    (lambda x, w, eps: x / _rms(x, eps) * w * w, "Likely mistake: doubling the weight w multiplies your output by 4, "
                                                 "where it doubles x / rms(x) * w: w is applied twice"),
    (lambda x, w, eps: x / _rms(x, eps) * w * math.sqrt(x.shape[-1]),
     "Likely mistake: every row points the right way but is 16 = sqrt(d_model) times as long, the same factor "
     "everywhere"),
    (lambda x, w, eps: x / (_rms(x, eps) + x.abs().mean(-1, keepdim=True)) * w,
     "Likely mistake: each row's direction is right but its length is not (off by a factor from"),
    (lambda x, w, eps: x / x.pow(4).mean(-1, keepdim=True).pow(0.25) * w,
     "x is divided by the fourth root of mean(x**4)"),
])
def test_rms_norm_mistakes_nobody_listed_are_named_by_properties(normalise, expected):
    """Named from how the output scales with the weight, and from each row's direction and length
    (the length says what x was divided by)."""
    fails_with(nb10.check_rms_norm, _norm_by(normalise), expected=expected)


# --- RoPE --------------------------------------------------------------------------------------

def _table(exponent=2, base=None, interleaved=False, float64=False, swapped=False, degrees=False, first=0):
    def rope_cos_sin(positions, d_head, theta):
        dtype = torch.float64 if float64 else torch.float32
        i = torch.arange(d_head // 2, dtype=dtype)
        angles = (positions.to(dtype)[:, None] + first) * (base or theta) ** (-exponent * i / d_head)
        angles = torch.rad2deg(angles) if degrees else angles
        angles = angles.repeat_interleave(2, -1) if interleaved else angles.repeat(1, 2)
        cos, sin = angles.cos().float(), angles.sin().float()
        return (sin, cos) if swapped else (cos, sin)
    return rope_cos_sin


def _apply(kind="halves"):
    def apply_rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        if kind == "interleaved":
            return ref.apply_rope_interleaved(x, cos, sin)
        neighbours = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)     # the paper's pairs
        if kind == "neighbours":
            return x * cos + neighbours * sin
        if kind == "neighbours_every_other":
            c, s = cos[..., ::2], sin[..., ::2]
            return torch.stack([x[..., ::2] * c - x[..., 1::2] * s, x[..., ::2] * s + x[..., 1::2] * c], -1).flatten(-2)
        if kind == "wrong_way":
            return x * cos + torch.cat([x2, -x1], -1) * sin
        if kind == "cos_only":
            return x * cos
        if kind == "swapped":
            return x * sin + torch.cat([-x2, x1], -1) * cos
        return x * cos + torch.cat([-x2, x1], -1) * sin
    return apply_rope


@pytest.mark.parametrize("table", [_table(), _table(float64=True), ref.rope_cos_sin])
def test_rope_correct_variants_pass(table):
    nb10.check_rope(table, _apply())
    nb10.check_rope(table, _apply(), seed=2, batch=1, seq=30)


@pytest.mark.parametrize("table, apply, expected", [
    (_table(exponent=1), _apply(), "Likely mistake: the frequency exponent is off by a factor of 2"),
    (_table(base=10000.0), _apply(), "Likely mistake: a wrong base"),
    (_table(interleaved=True), _apply(), "Likely mistake: the frequencies are interleaved"),
    (_table(), _apply("interleaved"), "Likely mistake: apply_rope pairs neighbours (0, 1), (2, 3), ...: the paper's "
     "convention"),
    (_table(), _apply("neighbours"), "Likely mistake: apply_rope pairs neighbours (0, 1), (2, 3), ...: the paper's "
     "convention, a rotation with a table of its own"),
    (_table(), _apply("neighbours_every_other"), "your code reads each neighbour pair's angle from every other column"),
    (_table(), _apply("wrong_way"), "Likely mistake: the rotation turns the wrong way"),
    (_table(), _apply("cos_only"), "Likely mistake: the sin term is missing"),
    (_table(), _apply("swapped"), "Likely mistake: cos and sin are swapped in the rotation"),
    (_table(swapped=True), _apply(), "Likely mistake: cos and sin are swapped"),
    (_table(degrees=True), _apply(), "Likely mistake: the angles are in degrees"),
    (_table(first=1), _apply(), "Likely mistake: the positions start at 1"),
    (_table(exponent=-2), _apply(), "Likely mistake: the exponent's sign is flipped"),
    (_table(exponent=-2, float64=True), _apply(), "Likely mistake: the exponent's sign is flipped"),
    (_table(degrees=True, interleaved=True), _apply(), "Likely mistake: the frequencies are interleaved (f0, f0, "
     "f1, f1, ...) as in the paper's pairs: transformers' Llama rotates halves, so the table holds them twice in a "
     "row; and the angles are in degrees"),
    (_table(exponent=1, swapped=True), _apply(), "Likely mistake: the frequency exponent is off by a factor of 2: "
     "theta ** (-2i / d_head) for i = 0 .. d_head/2 - 1; and cos and sin are swapped"),
])
def test_rope_mistakes_are_named(table, apply, expected):
    fails_with(nb10.check_rope, table, apply, expected=expected)


def test_the_paper_s_rope_reports_both_functions_in_one_run_each_fix_last():
    """One test cell checks rope_cos_sin and apply_rope: every one that differs is reported at once,
    each in words, their corrected code on the message's last lines."""
    with pytest.raises(CheckFailed) as failure:
        nb10.check_rope(_table(interleaved=True), _apply("neighbours"))
    message = str(failure.value)
    assert message.startswith("rope_cos_sin(") and "\napply_rope(q " in message, message
    assert "Likely mistake: the frequencies are interleaved" in message.splitlines()[0]
    assert "That is not a rotation" not in message and "a rotation with a table of its own" in message
    assert message.splitlines()[-2:] == [
        "  Show the fix: torch.cat([freqs, freqs], dim=-1)",
        "  Show the fix: x * cos + torch.cat([-x2, x1], dim=-1) * sin   # x1, x2 = x.chunk(2, dim=-1)"], message


def _frequencies_counted_from_1(positions, d_head, theta):
    i = torch.arange(1, d_head // 2 + 1, dtype=torch.float32)
    angles = positions.float()[:, None] * theta ** (-2 * i / d_head)
    return torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()


def _sin_doubled(positions, d_head, theta):
    cos, sin = _table()(positions, d_head, theta)
    return cos, 2 * sin


def _frequencies_counted_down(positions, d_head, theta):     # invented here, in no catalog
    i = torch.arange(d_head // 2 - 1, -1, -1, dtype=torch.float32)
    angles = positions.float()[:, None] * theta ** (-2 * i / d_head)
    return torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()


def _positions_reversed(positions, d_head, theta):     # invented here, in no catalog
    return _table()(positions.flip(0), d_head, theta)


@pytest.mark.parametrize("table, expected", [
    (_frequencies_counted_down, "Likely mistake: your cos table is the right one, its d_head axis with each "
                                "half reversed: the frequencies run from the slowest to the fastest"),
    (_positions_reversed, "Likely mistake: your cos table is the right one, its position axis reversed"),
])
def test_a_table_with_an_axis_reordered_is_named(table, expected):
    fails_with(nb10.check_rope, table, _apply(), expected=expected)


@pytest.mark.parametrize("table, expected", [
    (_frequencies_counted_from_1, "The angle per position differs in 22 of 32 columns, first in column 0: 0.5623 "
                                  "rad where f = theta ** (-2i / d_head) with i = j mod 16 is 1."),
    (_table(first=3), "Position 0's angles are not 0"),
    (_sin_doubled, "cos² + sin² is not 1 at [position 1, d_head 0]"),
])
def test_a_table_no_listed_mistake_explains_is_read_as_angles(table, expected):
    """A table outside the catalog: the check says where it departs, read as angles (position
    0's, each column's per position) or as no angle at all."""
    fails_with(nb10.check_rope, table, _apply(), expected=expected)


def _rotate_by(rotate_half):
    def apply_rope(x, cos, sin):
        return x * cos + rotate_half(x) * sin
    return apply_rope


def _halves(x):
    return x.chunk(2, dim=-1)


def _result_halves_exchanged(x, cos, sin):
    y = _apply()(x, cos, sin)
    return torch.cat(_halves(y)[::-1], -1)


@pytest.mark.parametrize("apply, expected", [
    # held-out mistake: rotate_half's halves in the wrong order
    (_rotate_by(lambda x: torch.cat([_halves(x)[0], -_halves(x)[1]], -1)),
     "Likely mistake: your rotate_half(x) is cat([x1, -x2]) (its two halves in the wrong order), where it is "
     "cat([-x2, x1]) (x1, x2: the halves of x). It mixes no two dimensions"),
    # invented here, in no catalog
    (_rotate_by(lambda x: torch.cat(_halves(x)[::-1], -1)),
     "Likely mistake: your rotate_half(x) is cat([x2, x1]), where it is cat([-x2, x1]) (x1, x2: the halves of x). "
     "That is not a rotation: it changes the vectors' lengths."),
    (_rotate_by(lambda x: torch.roll(x, x.shape[-1] // 4, -1)),
     "Likely mistake: your rotate_half(x) is the vector with x[(i + 24) mod 32] at each dimension i"),
    (_result_halves_exchanged, "Likely mistake: your apply_rope computes cat([x2, x1]) * cos + cat([x1, -x2]) * sin"),
    (_rotate_by(lambda x: torch.cat([-_halves(x)[1], _halves(x)[0]], -1).flip(-1)),
     "Likely mistake: your rotate_half(x) is the vector x[15], x[14], x[13], x[12], x[11], x[10], ..., where it is "
     "cat([-x2, x1])"),
])
def test_apply_rope_mistakes_nobody_listed_are_read_from_its_matrix(apply, expected):
    """apply_rope is linear in x: its matrix at each position, fitted as x' * cos + r(x) * sin,
    says what it does."""
    fails_with(nb10.check_rope, _table(), apply, expected=expected)


# --- SwiGLU ------------------------------------------------------------------------------------

def _mlp(kind="right"):
    class SwiGLU(ref.SwiGLU):
        def forward(self, x):
            gate, up = x @ self.W_gate, x @ self.W_up
            hidden = {"right": F.silu(gate) * up, "sigmoid": gate * torch.sigmoid(gate) * up,
                      "swapped": F.silu(up) * gate, "gelu": F.gelu(gate) * up,
                      "both": F.silu(gate) * F.silu(up), "self": F.silu(gate) * gate,
                      "relu": torch.relu(gate) * up, "after": F.silu(gate * up), "no_up": F.silu(gate),
                      "sum_tanh": torch.tanh(gate) + up}[kind]
            return hidden @ self.W_down
    return SwiGLU


@pytest.mark.parametrize("cls", [ref.SwiGLU, _mlp(), _mlp("sigmoid")])
def test_swiglu_correct_variants_pass(cls):
    nb10.check_swiglu(cls)
    nb10.check_swiglu(cls, seed=4, batch=3, seq=7, block=2)


@pytest.mark.parametrize("kind, expected", [
    ("swapped", "Likely mistake: gate and up are swapped"), ("gelu", "Likely mistake: GELU instead of SiLU"),
    ("both", "Likely mistake: the activation is applied to both branches"),
    ("self", "Likely mistake: silu(gate) * gate"),
    ("relu", "Likely mistake: ReLU instead of SiLU on the gate"),
    ("after", "Likely mistake: the activation is applied after the product"),
    ("no_up", "Likely mistake: the up projection is missing from the product"),
    ("sum_tanh", "Likely mistake: the branches are added: SwiGLU multiplies them, silu(gate) * up (and tanh where "
                 "SiLU belongs)"),
])
def test_swiglu_mistakes_are_named(kind, expected):
    fails_with(nb10.check_swiglu, _mlp(kind), expected=expected)


class SwiGLUBy(nn.Module):
    """A SwiGLU whose forward is `mlp(x, W_gate, W_up, W_down)`, declared with its own shapes."""
    mlp, down_shape = None, "d_mlp d_model"

    def __init__(self, cfg):
        super().__init__()
        self.W_gate = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp))
        self.W_up = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp))
        self.W_down = nn.Parameter(torch.zeros(*(getattr(cfg, size) for size in self.down_shape.split())))

    def forward(self, x):
        return type(self).mlp(x, self.W_gate, self.W_up, self.W_down)


def _swiglu_by(mlp, down_shape="d_mlp d_model"):
    return type("SwiGLU", (SwiGLUBy,), {"mlp": staticmethod(mlp), "down_shape": down_shape})


def _hidden(x, gate, up):
    return F.silu(x @ gate) * (x @ up)


@pytest.mark.parametrize("cls, expected", [
    # held-out mistake: W_down used transposed, or declared as nn.Linear stores it
    (_swiglu_by(lambda x, gate, up, down: _hidden(x, gate, up) @ down.T),
     "Likely mistake: W_down is used transposed: it is [688, 256]"),
    (_swiglu_by(lambda x, gate, up, down: _hidden(x, gate, up) @ down.T, "d_model d_mlp"),
     "Likely mistake: W_down is declared transposed, [256, 688] as nn.Linear stores a weight ([out, in])"),
    # invented here, in no catalog
    (_swiglu_by(lambda x, gate, up, down: x + _hidden(x, gate, up) @ down),
     "Likely mistake: your output is the MLP plus its input x (the difference from the reference is x itself): "
     "the residual is added inside"),
    (_swiglu_by(lambda x, gate, up, down: _hidden(x, gate, up) @ down / math.sqrt(down.shape[0])),
     "Likely mistake: your output is the reference's times 1/26.23 = 1/sqrt(d_mlp), the same factor everywhere"),
    (_swiglu_by(lambda x, gate, up, down: -(_hidden(x, gate, up) @ down)),
     "Likely mistake: your output is the reference's with its sign flipped"),
])
def test_swiglu_mistakes_nobody_listed_are_named_by_properties(cls, expected):
    fails_with(nb10.check_swiglu, cls, expected=expected)


def _noisy(y):
    """y plus seeded noise of 1% of its spread: wrong, with none of the properties the readers name."""
    return y + 0.01 * y.std() * torch.randn(y.shape, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("check, learner", [
    (nb10.check_rms_norm, _norm_by(lambda x, w, eps: _noisy(x / _rms(x, eps) * w))),
    (nb10.check_swiglu, _swiglu_by(lambda x, gate, up, down: _noisy(_hidden(x, gate, up) @ down))),
])
def test_an_output_without_those_properties_is_not_given_a_name(check, learner):
    """The readers name only what the output shows: a wrong output with none of their properties
    fails with where it differs and the hint, and no likely mistake."""
    with pytest.raises(CheckFailed) as failure:
        check(learner)
    assert "Likely mistake" not in str(failure.value) and "Hint:" in str(failure.value), str(failure.value)


# --- Grouped-query attention -------------------------------------------------------------------

def _attention(**flags):
    class GQAttention(ref.GQAttention):
        def forward(self, x, cos, sin, past=None):
            return ref.attention(x, dict(self.named_parameters()), cos, sin, past, **flags)
    return GQAttention


class ExpandAttention(ref.GQAttention):
    """Another correct style: keys expanded per group with einops-like views, -1e9 mask."""

    def qkv(self, x, cos, sin, past):
        """Queries, and the keys and values after the cache: [batch, heads, posn, d_head]."""
        q = ref.apply_rope(torch.einsum("bpd,ndh->bnph", x, self.W_Q), cos, sin)
        k = ref.apply_rope(torch.einsum("bpd,ndh->bnph", x, self.W_K), cos, sin)
        v = torch.einsum("bpd,ndh->bnph", x, self.W_V)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        return q, k, v

    def forward(self, x, cos, sin, past=None):
        q, k, v = self.qkv(x, cos, sin, past)
        b, n_kv, n_k, h = k.shape
        group = self.cfg.n_heads // n_kv
        k_all = k[:, :, None].expand(b, n_kv, group, n_k, h).reshape(b, n_kv * group, n_k, h)
        v_all = v[:, :, None].expand(b, n_kv, group, n_k, h).reshape(b, n_kv * group, n_k, h)
        scores = q @ k_all.transpose(-1, -2) / math.sqrt(h)
        n_q = q.shape[2]
        allowed = torch.arange(n_k)[None, :] <= torch.arange(n_k - n_q, n_k)[:, None]
        z = scores.masked_fill(~allowed, -1e9).softmax(-1) @ v_all
        return self.project(z), (k, v)

    def project(self, z):
        return torch.einsum("bnph,nhd->bpd", z, self.W_O)


class DiagonalHidden(ExpandAttention):
    def forward(self, x, cos, sin, past=None):
        q, k, v = self.qkv(x, cos, sin, past)
        k_all, v_all = (t.repeat_interleave(self.cfg.n_heads // k.shape[1], 1) for t in (k, v))
        n_q, n_k = q.shape[2], k.shape[2]
        hidden = torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q)   # the diagonal too
        scores = (q @ k_all.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(hidden, float("-inf"))
        return self.project(scores.softmax(-1) @ v_all), (k, v)


class DHeadFirstFlatten(ExpandAttention):
    def project(self, z):   # [batch, posn, d_head * n_heads], d_head first
        return z.transpose(1, 3).transpose(1, 2).reshape(z.shape[0], z.shape[2], -1) @ self.W_O.reshape(
            -1, self.cfg.d_model)


class GroupedEinsumAttention(ExpandAttention):
    """Another correct style: queries grouped by KV head in one einsum, the mask from torch.tril."""

    def forward(self, x, cos, sin, past=None):
        q, k, v = self.qkv(x, cos, sin, past)
        b, n_kv, n_k, h = k.shape
        n_q = q.shape[2]
        q = q.reshape(b, n_kv, self.cfg.n_heads // n_kv, n_q, h)            # [batch, kv, group, q, d_head]
        scores = torch.einsum("bkgqh,bkph->bkgqp", q, k) / math.sqrt(h)
        visible = torch.tril(torch.ones(n_k, n_k, dtype=torch.bool))[n_k - n_q:]
        z = torch.einsum("bkgqp,bkph->bkgqh", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)
        return torch.einsum("bnph,nhd->bpd", z.reshape(b, -1, n_q, h), self.W_O), (k, v)


class AsManyKVHeads(ref.GQAttention):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.W_K = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_model, cfg.d_head))
        self.W_V = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_model, cfg.d_head))


class RepeatedKeysCached(ExpandAttention):
    def forward(self, x, cos, sin, past=None):
        out, (k, v) = super().forward(x, cos, sin, None if past is None else tuple(
            t[:, ::self.cfg.n_heads // self.cfg.n_kv_heads] for t in past))
        group = self.cfg.n_heads // k.shape[1]
        return out, (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))


@pytest.mark.parametrize("cls", [ref.GQAttention, ExpandAttention, GroupedEinsumAttention])
def test_attention_correct_variants_pass(cls):
    nb10.check_gq_attention(cls)
    nb10.check_gq_attention(cls, seed=5, batch=1, seq=9, block=3)


@pytest.mark.parametrize("cls, expected", [
    (_attention(groups="repeat"), "Likely mistake: `repeat` where `repeat_interleave` is needed"),
    (_attention(scale=16.0), "Likely mistake: the scores are scaled by sqrt(d_model)"),
    (_attention(rope_values=True), "Likely mistake: RoPE is applied to the values too"),
    (_attention(rope_keys=False), "Likely mistake: RoPE is applied to the queries only"),
    (_attention(offset_mask=False), "Likely mistake: the causal mask ignores the cache"),
    (AsManyKVHeads, "Likely mistake: the keys and values are used as if there were n_heads of them"),
    (_attention(mask=False), "Likely mistake: the causal mask is missing"),
    (_attention(scale=32.0), "Likely mistake: the scores are divided by d_head"),
    (_attention(masked_value=0.0), "Likely mistake: the masked scores are set to 0, not -inf"),
    (_attention(cache_unrotated=True), "Likely mistake: the keys are cached before RoPE"),
    (_attention(softmax_dim=-2), "Likely mistake: the softmax is over the queries (dim -2)"),
    (_attention(cache_new_only=True), "the difference comes with the cache) does not match the reference. "
                                      "Likely mistake: the cache returned holds this call's keys and values only"),
    (RepeatedKeysCached, "Likely mistake: the keys and values are cached after they were repeated"),
    (DHeadFirstFlatten, "Likely mistake: z is flattened d_head first where W_O is read heads first"),
    (DiagonalHidden, "NaN or infinite values at position 0 only. Likely mistake: the mask hides the diagonal too"),
])
def test_attention_mistakes_are_named(cls, expected):
    fails_with(nb10.check_gq_attention, cls, expected=expected)


class HeadsAveraged(ExpandAttention):
    def project(self, z):     # invented here: the heads' outputs averaged, not summed
        return torch.einsum("bnph,nhd->bpd", z, self.W_O) / z.shape[1]


class ResidualInside(ExpandAttention):
    def forward(self, x, cos, sin, past=None):     # invented here: the residual added inside attention
        out, cache = super().forward(x, cos, sin, past)
        return x + out, cache


class PositionsShifted(ExpandAttention):
    def project(self, z):     # invented here: each position gets the output of the one before it
        return torch.einsum("bnph,nhd->bpd", z, self.W_O).roll(1, dims=1)


class HalfAndInput(ExpandAttention):
    def forward(self, x, cos, sin, past=None):     # invented here: half the output, a tenth of x added
        out, cache = super().forward(x, cos, sin, past)
        return 0.5 * out + 0.1 * x, cache


@pytest.mark.parametrize("cls, expected", [
    (PositionsShifted, "Likely mistake: your output is the reference's, its position axis rolled (entry i holds the "
                       "reference's entry i - 1, mod 12)"),
    (HalfAndInput, "Likely mistake: your output is 0.5·attention + 0.1·x: the difference from the reference grows "
                   "with the input x"),
    (HeadsAveraged, "Likely mistake: your output is the reference's times 1/8 = 1/n_heads, the same factor"),
    (ResidualInside, "Likely mistake: your output is attention plus its input x"),
])
def test_attention_mistakes_nobody_listed_are_named_by_properties(cls, expected):
    fails_with(nb10.check_gq_attention, cls, expected=expected)


# --- The decoder layer, the model, generation ----------------------------------------------------

def _layer(kind):
    class DecoderLayer(ref.DecoderLayer):
        def forward(self, x, cos, sin, past=None):
            if kind == "post":
                mid = self.ln1(x + self.attn(x, cos, sin, past)[0])
                return self.ln2(mid + self.mlp(mid)), None
            if kind == "parallel":
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return x + out + self.mlp(self.ln2(x)), cache
            if kind == "drops_past":
                out, cache = self.attn(self.ln1(x), cos, sin)
                x = x + out
                return x + self.mlp(self.ln2(x)), cache
            if kind == "old_past":
                x = x + self.attn(self.ln1(x), cos, sin, past)[0]
                return x + self.mlp(self.ln2(x)), past
            if kind == "queries_cached":
                x_in = self.ln1(x)
                out, (keys, values) = self.attn(x_in, cos, sin, past)
                x = x + out
                return x + self.mlp(self.ln2(x)), (keys * 2, values)
            if kind == "ln1_twice":
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return x + out + self.mlp(self.ln1(x + out)), cache
            if kind == "no_mlp_residual":
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return self.mlp(self.ln2(x + out)), cache
            if kind == "half_mlp":      # nobody's catalog: named by its place
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return x + out + 0.5 * self.mlp(self.ln2(x + out)), cache
            if kind == "attn_on_mlp_input":   # nobody's catalog: the MLP first, then attention
                m = x + self.mlp(self.ln2(x))
                out, cache = self.attn(self.ln1(m), cos, sin, past)
                return m + out, cache
            if kind in ("attn_twice", "mlp_twice"):   # held-out mistake; the MLP's invented here
                for _ in range(2 if kind == "attn_twice" else 1):
                    out, cache = self.attn(self.ln1(x), cos, sin, past)
                    x = x + out
                for _ in range(2 if kind == "mlp_twice" else 1):
                    x = x + self.mlp(self.ln2(x))
                return x, cache
            out, cache = self.attn(self.ln1(x), cos, sin, past)
            return out + self.mlp(self.ln2(out)), cache
    return DecoderLayer


def test_decoder_layer_passes_and_its_mistakes_are_named():
    nb10.check_decoder_layer(ref.DecoderLayer)
    nb10.check_decoder_layer(ref.DecoderLayer, seed=2, batch=1, seq=17, block=3)
    fails_with(nb10.check_decoder_layer, _layer("post"), expected="Likely mistake: post-norm")
    fails_with(nb10.check_decoder_layer, _layer("parallel"), expected="Likely mistake: attention and the MLP both read")
    fails_with(nb10.check_decoder_layer, _layer("no_residual"), expected="Likely mistake: the residual is not added")
    fails_with(nb10.check_decoder_layer, _layer("drops_past"),
               expected="Likely mistake: `past` is not passed on to the attention")
    fails_with(nb10.check_decoder_layer, _layer("ln1_twice"),
               expected="Likely mistake: ln1 is used before the MLP too, where ln2 belongs")
    fails_with(nb10.check_decoder_layer, _layer("no_mlp_residual"),
               expected="Likely mistake: the residual is not added around the MLP")
    fails_with(nb10.check_decoder_layer, _layer("half_mlp"),
               expected="Likely mistake: the layer's output is 1·(x + attn_out) + 0.5·mlp_out")
    fails_with(nb10.check_decoder_layer, _layer("attn_twice"),
               expected="Likely mistake: attention is applied twice (self.attn called 2x): the second time on "
                        "ln1(x + attn_out), the step x = x + attn(ln1(x)) written twice")
    fails_with(nb10.check_decoder_layer, _layer("mlp_twice"),
               expected="Likely mistake: the MLP is applied twice (self.mlp called 2x)")
    fails_with(nb10.check_decoder_layer, _layer("attn_on_mlp_input"),
               expected="ln1's output (Llama's input_layernorm), the first activation in forward order")
    # The cache it returns: the old `past`, or other tensors than the attention's cache.
    fails_with(nb10.check_decoder_layer, _layer("old_past"),
               expected="Likely mistake: the `past` passed in is returned instead of the cache your attention")
    fails_with(nb10.check_decoder_layer, _layer("queries_cached"), expected="cached keys")


class RestartingPositions(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        cos, sin = ref.rope_cos_sin(torch.arange(tokens.shape[1]), self.cfg.d_head, self.cfg.rope_theta)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return self.ln_final(x) @ self.W_U, cache


class NoFinalNorm(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        start = 0 if past is None else past[0][0].shape[2]
        cos, sin = ref.rope_cos_sin(torch.arange(start, start + tokens.shape[1]), self.cfg.d_head, self.cfg.rope_theta)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return x @ self.W_U, cache


def _model(kind):
    """A model with one mistake in what it hands its layers (unlisted classes)."""
    class ModernDecoder(ref.ModernDecoder):
        def forward(self, tokens, past=None):
            start = 0 if past is None else past[0][0].shape[2]
            cos, sin = ref.rope_cos_sin(torch.arange(start, start + tokens.shape[1]), self.cfg.d_head,
                                        self.cfg.rope_theta)
            if kind == "swapped":
                cos, sin = sin, cos
            x, cache = self.W_E[tokens] * (math.sqrt(self.cfg.d_model) if kind == "scaled" else 1), []
            for i, block in enumerate(self.blocks):
                layer_past = None if past is None else past[0 if kind == "layer0_cache" else i]
                y, layer_cache = block(x, cos, sin, layer_past)
                x = x if kind == "skip_last" and i == len(self.blocks) - 1 else y
                cache.append(layer_cache)
            return self.ln_final(x) @ (self.W_E.T if kind == "tied" else self.W_U), cache
    return ModernDecoder


@pytest.mark.parametrize("kind, expected", [
    ("scaled", "the first place in forward order that differs from LlamaForCausalLM's is the embedding (what "
               "blocks[0] reads). Likely mistake: the embedding is multiplied by 16"),
    ("swapped", "the first place in forward order that differs from LlamaForCausalLM's is the cos and sin given "
                "to blocks[0]. Likely mistake: cos and sin are swapped"),
    ("tied", "Likely mistake: the unembedding is tied to W_E"),
    ("layer0_cache", "the first place in forward order that differs from LlamaForCausalLM's from position 6 on (the "
                     "chunk that runs on the cache) is the cache given to blocks[1]. Likely mistake: blocks[1] is "
                     "given layer 0's cache: every layer gets layer 0's"),
    ("skip_last", "is the final norm's input. Likely mistake: it is blocks[2]'s output: the final norm reads the "
                  "last layer's output"),
])
def test_model_mistakes_nobody_listed_are_named_by_place(kind, expected):
    fails_with(nb10.check_modern_decoder, _model(kind), expected=expected)


def test_model_in_another_correct_style_passes():
    nb10.check_modern_decoder(_model("right"))


def test_a_part_with_a_check_of_its_own_costs_only_that_check():
    """One mistake, one exercise: a layer built on a wrong attention, norm or MLP passes the layer's
    check, and a model built on wrong layers or a wrong final norm passes the model's; the parts'
    own checks fail them."""
    Attention = _attention(groups="repeat")
    Norm = type("RMSNorm", (ref.RMSNorm,), {"forward": lambda self, x: x * self.w})

    class WrongParts(ref.DecoderLayer):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.attn, self.ln1, self.mlp = Attention(cfg), Norm(cfg), _mlp("gelu")(cfg)

    class WrongLayers(ref.ModernDecoder):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.blocks = nn.ModuleList([_layer("post")(cfg) for _ in range(cfg.n_layers)])
            self.ln_final = Norm(cfg)

    nb10.check_decoder_layer(WrongParts)
    nb10.check_modern_decoder(WrongLayers)
    fails_with(nb10.check_gq_attention, Attention, expected="`repeat` where `repeat_interleave` is needed")
    fails_with(nb10.check_decoder_layer, _layer("post"), expected="Likely mistake: post-norm")


class ThetaWrittenIn(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        start = 0 if past is None else past[0][0].shape[2]
        cos, sin = ref.rope_cos_sin(torch.arange(start, start + tokens.shape[1]), self.cfg.d_head, 10000.0)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return self.ln_final(x) @ self.W_U, cache


def test_model_passes_and_its_mistakes_are_named():
    nb10.check_modern_decoder(ref.ModernDecoder)
    nb10.check_modern_decoder(ref.ModernDecoder, seed=6, batch=1, seq=20, rope_theta=500000.0)
    nb10.check_modern_decoder(ThetaWrittenIn)
    fails_with(nb10.check_modern_decoder, ThetaWrittenIn, rope_theta=500000.0,
               expected="Likely mistake: rope_theta is not read from the config")
    fails_with(nb10.check_modern_decoder, RestartingPositions, expected="Likely mistake: positions restart at 0")
    fails_with(nb10.check_modern_decoder, NoFinalNorm, expected="Likely mistake: the final RMSNorm is missing")


def _generate(cache=True):
    def generate_greedy(model, tokens, n_new):
        logits, past = model(tokens)
        for step in range(n_new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, token], dim=1)
            if step < n_new - 1:
                logits, past = model(token, past) if cache else model(tokens)
        return tokens
    return generate_greedy


def _append_then_call(pick=lambda logits: logits[:, -1].argmax(-1, keepdim=True), keep_cache=True):
    """The usual loop: append the chosen token, then call the model, once more after the last."""
    def generate_greedy(model, tokens, n_new):
        logits, past = model(tokens)
        for _ in range(n_new):
            token = pick(logits)
            tokens = torch.cat([tokens, token], dim=1)
            logits, new_past = model(token, past)
            past = new_past if keep_cache else None
        return tokens
    return generate_greedy


def _whole_sequence_with_the_cache(model, tokens, n_new):
    logits, past = model(tokens)
    for _ in range(n_new):
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        logits, past = model(tokens, past)
    return tokens


def test_generate_greedy_with_a_call_after_the_last_token_passes():
    nb10.check_generate_greedy(_append_then_call())
    nb10.check_generate_greedy(_append_then_call(), seed=3, batch=3, seq=4)


@pytest.mark.parametrize("learner, expected", [
    (_append_then_call(lambda logits: logits[:, 0].argmax(-1, keepdim=True)),
     "Likely mistake: the next token is read from the first position's logits"),
    (_append_then_call(lambda logits: logits[:, -1].argmin(-1, keepdim=True)),
     "Likely mistake: the least likely token is taken"),
    (_append_then_call(keep_cache=False), "Likely mistake: the cache is fed wrongly"),
    (_whole_sequence_with_the_cache, "Likely mistake: call 2 fed 6 tokens with a cache of 5 positions"),
])
def test_a_wrong_token_is_named_before_the_calls_are_counted(learner, expected):
    fails_with(nb10.check_generate_greedy, learner, expected=expected)


def test_generate_greedy_is_accepted_with_and_without_no_grad_as_the_text_says():
    from graders.course.example_class import solution_answers

    from jaxtyping import Int

    namespace = {"torch": torch, "nn": nn, "Tensor": torch.Tensor, "Int": Int}
    exec(compile(solution_answers("10_modern_decoder")["generate_answer"], "generate_answer", "exec"), namespace)
    plain = namespace["generate_greedy"]
    assert "@torch.no_grad" not in solution_answers("10_modern_decoder")["generate_answer"]
    nb10.check_generate_greedy(plain)
    nb10.check_generate_greedy(torch.no_grad()(plain))
    prompt = torch.tensor([[3, 1, 4]])
    assert torch.equal(plain(ref.ModernDecoder(ref.ModernConfig()), prompt, 0), prompt)
    posed = _markdown_before("10_modern_decoder", "generate_answer")
    assert "`n_new = 0`" in posed and "torch.no_grad()" in posed


def _markdown_before(notebook, grade_id):
    import nbformat

    from graders.layout import SOLUTIONS

    text = []
    for cell in nbformat.read(SOLUTIONS / f"{notebook}.ipynb", as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return "\n".join(text)
        text = text + [cell.source] if cell.cell_type == "markdown" else []
    raise AssertionError(f"no cell {grade_id}")


def test_generate_greedy_passes_and_its_mistakes_are_named():
    nb10.check_generate_greedy(_generate())
    nb10.check_generate_greedy(_generate(), seed=3, batch=3, seq=4)
    fails_with(nb10.check_generate_greedy, _generate(cache=False),
               expected="Likely mistake: the cache is not used: the whole sequence is fed again")
    fails_with(nb10.check_generate_greedy, lambda model, tokens, n_new: _generate()(model, tokens, n_new)[:, -n_new:],
               expected="Likely mistake: only the new tokens are returned")


# --- kv_cache_bytes ------------------------------------------------------------------------------

def _bytes(heads="n_kv_heads", factor=2):
    def kv_cache_bytes(cfg, batch, seq_len, dtype):
        element = torch.finfo(dtype).bits // 8
        return factor * cfg.n_layers * batch * seq_len * getattr(cfg, heads) * cfg.d_head * element
    return kv_cache_bytes


def _bytes_per_number(size):
    def kv_cache_bytes(cfg, batch, seq_len, dtype):
        return 2 * cfg.n_layers * batch * seq_len * cfg.n_kv_heads * cfg.d_head * size
    return kv_cache_bytes


@pytest.mark.parametrize("learner, expected", [
    (_bytes_per_number(2), "Likely mistake: the dtype is ignored: every number is counted as 2 bytes"),
    (_bytes_per_number(4), "Likely mistake: the dtype is ignored: every number is counted as 4 bytes"),
    (lambda cfg, batch, seq_len, dtype: _bytes(heads="n_heads")(cfg, batch, seq_len, torch.float32),
     "Likely mistake: n_heads is used: the cache holds the keys and values of the n_kv_heads KV heads only "
     "(that is what grouped-query attention saves). And: the dtype is ignored: every number is counted as 4"),
    (lambda cfg, batch, seq_len, dtype: 8 * _bytes()(cfg, batch, seq_len, dtype), "Likely mistake: bits, not bytes"),
])
def test_kv_cache_bytes_tells_each_factor_apart_over_the_dtypes(learner, expected):
    """2 bytes a number and keys only are both half of float32's answer: bfloat16's and float64's
    answers tell them apart."""
    for seed, batch in ((0, 1), (1, 3)):
        fails_with(nb10.check_kv_cache_bytes, learner, expected=expected, seed=seed, batch=batch)


def test_kv_cache_bytes_passes_and_its_mistakes_are_named():
    for seed, batch in ((0, 1), (1, 3)):
        nb10.check_kv_cache_bytes(_bytes(), seed=seed, batch=batch)
    fails_with(nb10.check_kv_cache_bytes, _bytes(heads="n_heads"), expected="Likely mistake: n_heads is used")
    fails_with(nb10.check_kv_cache_bytes, _bytes(factor=1), expected="Likely mistake: only the keys are counted")


RUNS_ITS_OWN_ROPE = '''
import math
import torch
from graders.exercises.nb10 import reference as ref

def rope_cos_sin(positions, d_head, theta):
    cos, sin = ref.rope_cos_sin(positions, d_head, theta)
    return sin, cos                       # the mistake: swapped

def apply_rope(x, cos, sin):
    return x * cos                        # the mistake: no rotation

class GQAttention(ref.GQAttention):
    def forward(self, x, cos, sin, past=None):
        q = apply_rope(torch.einsum("bpd,ndh->bnph", x, self.W_Q), cos, sin)
        k = apply_rope(torch.einsum("bpd,ndh->bnph", x, self.W_K), cos, sin)
        v = torch.einsum("bpd,ndh->bnph", x, self.W_V)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        group = self.cfg.n_heads // k.shape[1]
        k_all, v_all = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        n_q, n_k = q.shape[2], k.shape[2]
        scores = (q @ k_all.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
            torch.ones(n_q, n_k, dtype=torch.bool).triu(1 + n_k - n_q), float("-inf"))
        return torch.einsum("bnph,nhd->bpd", scores.softmax(-1) @ v_all, self.W_O), (k, v)

class ModernDecoder(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        start = past[0][0].shape[-2] if past else 0
        positions = torch.arange(tokens.shape[1]) + start
        cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return self.ln_final(x) @ self.W_U, cache
'''


def test_a_mistake_in_rope_costs_only_the_rope_check():
    """The attention's and the model's checks run the course's RoPE under the notebook's names."""
    learner: dict = {}
    exec(RUNS_ITS_OWN_ROPE, learner)
    nb10.check_gq_attention(learner["GQAttention"])
    nb10.check_modern_decoder(learner["ModernDecoder"])
    with pytest.raises(CheckFailed):
        nb10.check_rope(learner["rope_cos_sin"], learner["apply_rope"])
    assert learner["apply_rope"](torch.ones(1), torch.ones(1), torch.zeros(1)).item() == 1.0   # names restored


def test_the_demonstrations_stated_time_is_a_benchmarks_line():
    """A time the notebook states comes from a benchmark that prints it, with the
    conditions it was measured under; the demonstration says what it does from its first line."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cells = json.loads((root / "solutions" / "10_modern_decoder.ipynb").read_text())["cells"]
    sources = ["".join(cell["source"]) for cell in cells]
    demo = next(i for i, source in enumerate(sources) if "def train_and_validate" in source)
    stated = re.search(r"`(benchmarks/[\w.]+)` runs\s+it as the notebook does: (\d+) s on one thread of (.+?)\s+"
                       r"\(load average ([\d.]+)\)", sources[demo - 1], re.S)
    assert stated, sources[demo - 1]
    benchmark = (root / stated.group(1)).read_text()
    assert "10's demonstration: {total:.0f} s" in benchmark and "load average {load:.1f}" in benchmark
    assert "seconds" not in sources[demo - 1].replace(stated.group(0), "")   # no other time stated
    first_code = sources[demo].split("if ready(ModernDecoder):", 1)[1].lstrip().splitlines()
    assert first_code[0].startswith("print("), first_code[0]   # before the text is encoded

