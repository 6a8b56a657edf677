"""Notebook 10's grouped-query attention grader (graders/exercises/nb10/attention.py): correct variants
(in other styles) pass, each catalogued mistake fails with its name."""
import math

import pytest
import torch
from torch import nn

from graders.exercises import nb10
from graders.exercises.nb10 import reference as ref
from course_code import course_code_allowed
from catalog_helpers import fails_with


# The variants are built on the course's reference decoder (a subclass with one method changed).
reference_code_allowed = course_code_allowed(ref)


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
    (AsManyKVHeads, "cannot take the reference weights. Likely mistake: the keys and values are used as if there "
                    "were n_heads of them"),
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
