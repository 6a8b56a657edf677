"""Attention grader: catalogued mistakes fail with their diagnosis; correct variants pass."""
import math

import einops
import pytest
import torch
import torch.nn.functional as F
from fancy_einsum import einsum as fancy_einsum
from torch import nn

from fix_last import fix_only_last
from graders.exercises import nb03
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.reference.config import Config

cfg = Config()   # as in the notebook: a global beside the module's own self.cfg


class Base(nn.Module):
    def __init__(self, cfg, ignore=float("-inf"), persistent=False):
        super().__init__()
        self.cfg = cfg
        shape_in, shape_out = (cfg.n_heads, cfg.d_model, cfg.d_head), (cfg.n_heads, cfg.d_head, cfg.d_model)
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.empty(shape_in)) for _ in range(3))
        self.W_O = nn.Parameter(torch.empty(shape_out))
        self.b_Q, self.b_K, self.b_V = (nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head)) for _ in range(3))
        self.b_O = nn.Parameter(torch.zeros(cfg.d_model))
        self.register_buffer("IGNORE", torch.tensor(ignore), persistent=persistent)


def mask_future(self, attn_scores):
    n = attn_scores.shape[-1]
    future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=attn_scores.device), diagonal=1)
    return attn_scores.masked_fill(future, self.IGNORE)


def forward_einops(self, x):
    q = einops.einsum(x, self.W_Q, "b p d, n d h -> b p n h") + self.b_Q
    k = einops.einsum(x, self.W_K, "b p d, n d h -> b p n h") + self.b_K
    v = einops.einsum(x, self.W_V, "b p d, n d h -> b p n h") + self.b_V
    scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)
    pattern = self.apply_causal_mask(scores).softmax(-1)
    z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")
    return einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O


def variant(forward=forward_einops, mask=mask_future, ignore=float("-inf"), persistent=False, name=None):
    def __init__(self, cfg):
        Base.__init__(self, cfg, ignore, persistent)
    return type(name or f"{forward.__name__}_{mask.__name__}", (Base,),
                {"__init__": __init__, "forward": forward, "apply_causal_mask": mask})


# --- apply_causal_mask: correct variants ---------------------------------------------------------

def mask_where_big_negative(self, attn_scores):
    q, k = attn_scores.shape[-2:]
    keys, queries = torch.arange(k), torch.arange(q)
    return torch.where(keys[None, :] > queries[:, None], torch.tensor(-1e5), attn_scores)


def mask_added(self, attn_scores):
    n = attn_scores.shape[-1]
    additive = torch.full((n, n), float("-inf")).triu(1)      # -inf above the diagonal, 0 elsewhere
    return attn_scores + additive


def mask_in_place(self, attn_scores):                           # the classic masked_fill_
    mask = torch.triu(torch.ones(attn_scores.size(-2), attn_scores.size(-1)), diagonal=1).bool()
    attn_scores.masked_fill_(mask, self.IGNORE)
    return attn_scores


def mask_added_constant(self, attn_scores):
    n = attn_scores.shape[-1]
    return attn_scores - 1e5 * torch.ones(n, n).triu(1)


def mask_loop(self, attn_scores):
    out = attn_scores.clone()
    n = attn_scores.shape[-1]
    for query in range(n):
        for key in range(query + 1, n):
            out[..., query, key] = self.IGNORE
    return out


def mask_tril_ones(self, attn_scores):
    q, k = attn_scores.shape[-2:]
    allowed = torch.tril(torch.ones(q, k, device=attn_scores.device)) == 1
    return attn_scores.masked_fill(~allowed, float("-inf"))


MASK_CORRECT = [mask_future, mask_where_big_negative, mask_added, mask_in_place, mask_added_constant,
                mask_loop, mask_tril_ones]


@pytest.mark.parametrize("mask", MASK_CORRECT, ids=lambda f: f.__name__)
def test_correct_masks_pass(mask):
    cls = variant(mask=mask)
    nb03.check_apply_causal_mask(cls)
    nb03.check_apply_causal_mask(cls, block=5, text=None, seed=3, batch=2)


def test_finite_ignore_buffer_passes():
    nb03.check_apply_causal_mask(variant(ignore=-1e5))


# --- apply_causal_mask: mistakes -------------------------------------------------------------------

def mask_hides_diagonal(self, attn_scores):
    n = attn_scores.shape[-1]
    return attn_scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool)), self.IGNORE)


def mask_hides_past(self, attn_scores):
    n = attn_scores.shape[-1]
    return attn_scores.masked_fill(torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1), self.IGNORE)


def mask_to_zero(self, attn_scores):
    n = attn_scores.shape[-1]
    return attn_scores * (1 - torch.ones(n, n).triu(1))


def mask_result_dropped(self, attn_scores):
    n = attn_scores.shape[-1]
    attn_scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), self.IGNORE)
    return attn_scores


def mask_not_negative_enough(self, attn_scores):
    n = attn_scores.shape[-1]
    return attn_scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -100.0)


def mask_misses_next_token(self, attn_scores):
    n = attn_scores.shape[-1]
    return attn_scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(2), self.IGNORE)


def mask_then_softmax(self, attn_scores):
    return mask_future(self, attn_scores).softmax(-1)


def mask_scales_again(self, attn_scores):
    return mask_future(self, attn_scores) / math.sqrt(self.cfg.d_head)


def mask_fixed_size(self, attn_scores):
    mask = torch.triu(torch.ones(35, 35, dtype=torch.bool), diagonal=1)
    return attn_scores.masked_fill(mask, self.IGNORE)


def mask_library(self, attn_scores):
    return nn.MultiheadAttention(4, 1)(attn_scores, attn_scores, attn_scores)[0]


def mask_from_values_triu_bool(self, attn_scores):         # found in published code
    mask = torch.triu(attn_scores, 1).bool()
    return attn_scores.masked_fill(mask, self.IGNORE)


def mask_from_values_nonzero(self, attn_scores):
    return torch.where(attn_scores.triu(diagonal=1) != 0, torch.full_like(attn_scores, -1e5), attn_scores)


def mask_fixed_size_loop(self, attn_scores):
    out = attn_scores.clone()
    for query in range(35):
        for key in range(query + 1, 35):
            out[..., query, key] = self.IGNORE
    return out


MASK_BUGS = [
    (mask_hides_diagonal, "hides the diagonal too"),
    (mask_hides_past, "hides the past instead of the future"),
    (mask_to_zero, "set to 0, not to -inf"),
    (mask_result_dropped, "nothing was masked"),
    (mask_not_negative_enough, "not made negative enough"),
    (mask_misses_next_token, "the mask starts one diagonal too high"),
    (mask_then_softmax, "returned probabilities"),
    (mask_scales_again, "scaled again inside apply_causal_mask"),
    (mask_fixed_size, "the mask has a fixed size, 35"),
    (mask_library, "your code uses `nn.MultiheadAttention`"),
    (mask_from_values_triu_bool, "the mask is built from the scores' values"),
    (mask_from_values_nonzero, "the mask is built from the scores' values"),
]


@pytest.mark.parametrize("mask, message", MASK_BUGS, ids=lambda v: getattr(v, "__name__", ""))
def test_mask_mistakes_are_named(mask, message):
    case = {"text": None, "seed": 5, "seq": 12} if mask is mask_fixed_size else {}
    with pytest.raises(CheckFailed) as failure:
        nb03.check_apply_causal_mask(variant(mask=mask), **case)
    assert message in fix_only_last(str(failure.value)).splitlines()[0], str(failure.value)


def test_a_fixed_size_mask_written_as_a_loop_is_caught():
    """A loop up to 35 passes on 35 tokens but not on shorter ones (which crash, or keep -inf
    in place of real scores): the hidden cases use other lengths."""
    with pytest.raises(CheckFailed) as failure:
        nb03.check_apply_causal_mask(variant(mask=mask_fixed_size_loop))
    assert "assumes a fixed number of positions" in str(failure.value).splitlines()[0], str(failure.value)


def _misspelled(method_name, forward_calls):
    """An Attention whose mask method is named `method_name`, its forward calling `forward_calls`."""
    def forward(self, x):
        q = einops.einsum(x, self.W_Q, "b p d, n d h -> b p n h") + self.b_Q
        k = einops.einsum(x, self.W_K, "b p d, n d h -> b p n h") + self.b_K
        v = einops.einsum(x, self.W_V, "b p d, n d h -> b p n h") + self.b_V
        scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)
        pattern = getattr(self, forward_calls)(scores).softmax(-1)
        z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")
        return einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O

    def __init__(self, cfg):
        Base.__init__(self, cfg)
    return type("Attention", (Base,), {"__init__": __init__, "forward": forward, method_name: mask_future})


@pytest.mark.parametrize("name", ["apply_causal_nask", "apply_casual_mask"])
def test_a_misspelled_mask_method_is_named(name):
    with pytest.raises(CheckFailed) as failure:
        nb03.check_apply_causal_mask(_misspelled(name, name))
    first = str(failure.value).splitlines()[0]
    assert "has no method `apply_causal_mask`" in first and f"misspelled `{name}`" in first, first
    # The forward calls its own (misspelled) method consistently: it is right, and passes.
    nb03.check_attention(_misspelled(name, name))
    # Defined misspelled, called by the right name: the forward's crash names the misspelling.
    with pytest.raises(CheckFailed) as failure:
        nb03.check_attention(_misspelled(name, "apply_causal_mask"))
    assert f"misspelled `{name}`" in str(failure.value).splitlines()[0], str(failure.value)


@pytest.mark.parametrize("ignore", [-1e5, float("-inf")])
def test_a_persistent_ignore_buffer_passes_as_the_widely_copied_solutions_write_it(ignore):
    """`self.register_buffer("IGNORE", torch.tensor(-1e5))` (persistent) is how the most copied
    notebooks write it: the buffer keeps the learner's value; parameters stay strict."""
    cls = variant(ignore=ignore, persistent=True)
    nb03.check_apply_causal_mask(cls)
    nb03.check_attention(cls)
    nb03.check_attention(cls, block=4, text=None, seed=21, batch=2, seq=23)


def test_a_misnamed_parameter_beside_a_persistent_buffer_is_still_refused():
    class Renamed(variant(ignore=-1e5, persistent=True)):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.W_query = self.W_Q
            del self.W_Q

    with pytest.raises(CheckFailed, match="missing: W_Q"):
        nb03.check_attention(Renamed)


# --- Attention forward: correct variants ------------------------------------------------------------

def forward_matmul(self, x):
    batch, posn, _ = x.shape
    q = (x[:, None] @ self.W_Q + self.b_Q[:, None]).transpose(1, 2)     # [b, p, n, h]
    k = (x[:, None] @ self.W_K + self.b_K[:, None]).transpose(1, 2)
    v = (x[:, None] @ self.W_V + self.b_V[:, None]).transpose(1, 2)
    scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / self.cfg.d_head ** 0.5  # [b, n, q, k]
    pattern = torch.softmax(self.apply_causal_mask(scores), dim=-1)
    z = (pattern @ v.transpose(1, 2)).transpose(1, 2)                     # [b, p, n, h]
    return z.reshape(batch, posn, -1) @ self.W_O.reshape(-1, self.cfg.d_model) + self.b_O


def forward_fancy(self, x):
    q = fancy_einsum("b p d, n d h -> b p n h", x, self.W_Q) + self.b_Q
    k = fancy_einsum("b p d, n d h -> b p n h", x, self.W_K) + self.b_K
    v = fancy_einsum("b p d, n d h -> b p n h", x, self.W_V) + self.b_V
    scores = fancy_einsum("b q n h, b k n h -> b n q k", q, k) / math.sqrt(self.cfg.d_head)
    pattern = self.apply_causal_mask(scores).softmax(dim=-1)
    z = fancy_einsum("b n q k, b k n h -> b q n h", pattern, v)
    return fancy_einsum("b q n h, n h d -> b q d", z, self.W_O) + self.b_O


def forward_torch_einsum_per_head(self, x):
    out = self.b_O.expand(*x.shape[:2], -1)
    for h in range(self.cfg.n_heads):
        q = torch.einsum("bpd,dh->bph", x, self.W_Q[h]) + self.b_Q[h]
        k = torch.einsum("bpd,dh->bph", x, self.W_K[h]) + self.b_K[h]
        v = torch.einsum("bpd,dh->bph", x, self.W_V[h]) + self.b_V[h]
        scores = torch.einsum("bqh,bkh->bqk", q, k)[:, None] / math.sqrt(self.cfg.d_head)
        pattern = self.apply_causal_mask(scores)[:, 0].softmax(-1)
        out = out + torch.einsum("bqk,bkh,hd->bqd", pattern, v, self.W_O[h])
    return out


def forward_scale_after_mask(self, x):
    q = einops.einsum(x, self.W_Q, "b p d, n d h -> b n p h") + self.b_Q[:, None]
    k = einops.einsum(x, self.W_K, "b p d, n d h -> b n p h") + self.b_K[:, None]
    v = einops.einsum(x, self.W_V, "b p d, n d h -> b n p h") + self.b_V[:, None]
    pattern = (self.apply_causal_mask(q @ k.transpose(-1, -2)) / self.cfg.d_head ** 0.5).softmax(-1)
    z = einops.rearrange(pattern @ v, "b n p h -> b p (n h)")
    return z @ einops.rearrange(self.W_O, "n h d -> (n h) d") + self.b_O


def forward_relies_on_in_place_mask(self, x):
    q = einops.einsum(x, self.W_Q, "b p d, n d h -> b p n h") + self.b_Q
    k = einops.einsum(x, self.W_K, "b p d, n d h -> b p n h") + self.b_K
    v = einops.einsum(x, self.W_V, "b p d, n d h -> b p n h") + self.b_V
    scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)
    self.apply_causal_mask(scores)          # the result ignored: right only for an in-place mask
    z = einops.einsum(scores.softmax(-1), v, "b n q k, b k n h -> b q n h")
    return einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O


ATTN_CORRECT = [
    variant(forward_relies_on_in_place_mask, mask_in_place),
    variant(forward_einops), variant(forward_matmul), variant(forward_fancy),
    variant(forward_torch_einsum_per_head, mask_where_big_negative),
    variant(forward_scale_after_mask, mask_added_constant, ignore=-1e5),
]


@pytest.mark.parametrize("cls", ATTN_CORRECT, ids=lambda c: c.__name__)
def test_correct_attention_passes(cls):
    nb03.check_attention(cls)
    nb03.check_attention(cls, block=9, text=None, seed=7, batch=3)


# --- Attention forward: mistakes -----------------------------------------------------------------

INLINE_MASKS = {
    "inline, diagonal hidden": lambda n: torch.ones(n, n, dtype=torch.bool).triu(),
    "inline, past hidden": lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1),
}


def _forward(scale=None, mask=True, softmax_dim=-1, drop=(), z_reshape="ok", heads=None, in_place=False,
             library=False, softmax_first=False, scale_power=0.5):
    def forward(self, x):
        if library:
            return F.scaled_dot_product_attention(x, x, x)
        if in_place:
            x -= 0.1
        b = {n: (torch.zeros_like(getattr(self, n)) if n in drop else getattr(self, n))
             for n in ("b_Q", "b_K", "b_V", "b_O")}
        q = einops.einsum(x, self.W_Q, "b p d, n d h -> b p n h") + b["b_Q"]
        k = einops.einsum(x, self.W_K, "b p d, n d h -> b p n h") + b["b_K"]
        v = einops.einsum(x, self.W_V, "b p d, n d h -> b p n h") + b["b_V"]
        scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / (scale or self.cfg.d_head) ** scale_power
        if softmax_first:
            pattern = self.apply_causal_mask(scores.softmax(dim=softmax_dim))
        else:
            if mask in INLINE_MASKS:      # masked in forward itself, without the mask method
                scores = scores.masked_fill(INLINE_MASKS[mask](scores.shape[-1]), self.IGNORE)
            elif mask:
                scores = self.apply_causal_mask(scores)
            pattern = scores.softmax(dim=softmax_dim)
        if z_reshape == "no-transpose":
            z = einops.einsum(pattern, v, "b n q k, b k n h -> b n q h")
            z = z.reshape(x.shape[0], x.shape[1], -1)
            return z @ self.W_O.reshape(-1, self.cfg.d_model) + b["b_O"]
        z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")
        if heads is not None:
            z = z[:, :, :heads]
            return einops.einsum(z, self.W_O[:heads], "b q n h, n h d -> b q d") + b["b_O"]
        return einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + b["b_O"]
    return forward


def forward_matmul_d_head(self, x):
    """Scores divided by d_head, not its square root (matmul style)."""
    q = (x[:, None] @ self.W_Q + self.b_Q[:, None])                          # [b, n, p, h]
    k = (x[:, None] @ self.W_K + self.b_K[:, None])
    v = (x[:, None] @ self.W_V + self.b_V[:, None])
    scores = q @ k.transpose(-1, -2) / self.cfg.d_head
    z = self.apply_causal_mask(scores).softmax(-1) @ v                      # [b, n, p, h]
    return einops.einsum(z, self.W_O, "b n p h, n h d -> b p d") + self.b_O


def forward_matmul_softmax_first(self, x):
    """The mask applied to the probabilities (matmul style)."""
    q = (x[:, None] @ self.W_Q + self.b_Q[:, None])
    k = (x[:, None] @ self.W_K + self.b_K[:, None])
    v = (x[:, None] @ self.W_V + self.b_V[:, None])
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.cfg.d_head), dim=-1)
    z = self.apply_causal_mask(probs) @ v
    return einops.einsum(z, self.W_O, "b n p h, n h d -> b p d") + self.b_O


def forward_zero_after_softmax(self, x):
    """The future zeroed after the softmax with a lower-triangular product (no renormalisation)."""
    q = torch.einsum("bpd,ndh->bnph", x, self.W_Q) + self.b_Q[:, None]
    k = torch.einsum("bpd,ndh->bnph", x, self.W_K) + self.b_K[:, None]
    v = torch.einsum("bpd,ndh->bnph", x, self.W_V) + self.b_V[:, None]
    probs = (torch.einsum("bnqh,bnkh->bnqk", q, k) / math.sqrt(self.cfg.d_head)).softmax(-1)
    probs = probs * torch.tril(torch.ones(x.shape[1], x.shape[1]))
    return torch.einsum("bnqk,bnkh,nhd->bqd", probs, v, self.W_O) + self.b_O


def forward_d_head_per_head_loop(self, x):
    out = self.b_O.expand(*x.shape[:2], -1)
    for h in range(self.cfg.n_heads):
        q = x @ self.W_Q[h] + self.b_Q[h]
        k = x @ self.W_K[h] + self.b_K[h]
        v = x @ self.W_V[h] + self.b_V[h]
        scores = (q @ k.transpose(-1, -2))[:, None] / self.cfg.d_head
        out = out + self.apply_causal_mask(scores)[:, 0].softmax(-1) @ v @ self.W_O[h]
    return out


ATTN_BUGS = [
    ("sqrt_d_model", variant(_forward(scale=768)), {}, "scaling the scores by 1/sqrt(d_model)"),
    ("no_scale", variant(_forward(scale=1)), {}, "the scores are not scaled"),
    ("d_head_not_sqrt_einops", variant(_forward(scale_power=1.0)), {}, "divided by d_head instead of its square root"),
    ("d_head_not_sqrt_matmul", variant(forward_matmul_d_head), {}, "divided by d_head instead of its square root"),
    ("d_head_not_sqrt_loop", variant(forward_d_head_per_head_loop), {}, "divided by d_head instead of its square root"),
    ("mask_after_softmax", variant(_forward(softmax_first=True)), {}, "the causal mask is applied after the softmax"),
    ("mask_after_softmax_finite", variant(_forward(softmax_first=True), ignore=-1e5), {},
     "the causal mask is applied after the softmax"),
    ("mask_after_softmax_matmul", variant(forward_matmul_softmax_first), {},
     "the causal mask is applied after the softmax"),
    ("zero_after_softmax", variant(forward_zero_after_softmax), {}, "the future is zeroed after the softmax"),
    ("diagonal_hidden", variant(_forward(mask="inline, diagonal hidden")), {}, "the mask hides the diagonal too"),
    ("diagonal_hidden_finite", variant(_forward(mask="inline, diagonal hidden"), ignore=-1e5), {},
     "the mask hides the diagonal too"),
    ("past_hidden", variant(_forward(mask="inline, past hidden")), {},
     "the mask hides the past instead of the future"),
    ("softmax_over_queries", variant(_forward(softmax_dim=-2)), {}, "softmax over the query axis"),
    ("mask_not_applied", variant(_forward(mask=False)), {}, "the causal mask is not applied"),
    ("no_b_Q", variant(_forward(drop=("b_Q",))), {}, "b_Q is not added"),
    ("no_b_V", variant(_forward(drop=("b_V",))), {}, "b_V is not added"),
    ("no_b_O", variant(_forward(drop=("b_O",))), {}, "b_O is not added"),
    ("heads_mixed", variant(_forward(z_reshape="no-transpose")), {}, "heads mixed up"),
    ("last_head_dropped", variant(_forward(heads=11)), {},
     "heads whose own contribution (z[:, :, h] @ W_O[h]) is wrong: 11"),
    ("in_place", variant(_forward(in_place=True)), {}, "changed its input tensor in place"),
    ("library", variant(_forward(library=True)), {}, "scaled_dot_product_attention"),
    ("batch_1_other_seed_no_scale", variant(_forward(scale=1)), {"text": None, "seed": 4, "batch": 2},
     "the scores are not scaled"),
]


@pytest.mark.parametrize("name, cls, case, message", ATTN_BUGS, ids=[b[0] for b in ATTN_BUGS])
def test_attention_mistakes_are_named(name, cls, case, message):
    with pytest.raises(CheckFailed) as failure:
        nb03.check_attention(cls, **case)
    assert message in fix_only_last(str(failure.value)).splitlines()[0], str(failure.value)


# --- Attention forward: head settings read from the config -------------------------------------

@pytest.mark.parametrize("cls", ATTN_CORRECT, ids=lambda c: c.__name__)
def test_correct_attention_reads_its_heads_from_its_config(cls):
    nb03.check_attention(cls, block=5, n_heads=6, d_head=128)


def forward_scale_of_global_cfg(self, x):
    q = einops.einsum(x, self.W_Q, "b p d, n d h -> b p n h") + self.b_Q
    k = einops.einsum(x, self.W_K, "b p d, n d h -> b p n h") + self.b_K
    v = einops.einsum(x, self.W_V, "b p d, n d h -> b p n h") + self.b_V
    scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(cfg.d_head)
    z = einops.einsum(self.apply_causal_mask(scores).softmax(-1), v, "b n q k, b k n h -> b q n h")
    return einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O


def _merged_heads(scale):
    """Queries, keys and values of all heads at once, split as 12 heads of 64 written out."""
    def forward(self, x):
        batch, posn, _ = x.shape

        def heads(W, bias):
            flat = x @ einops.rearrange(W, "n d h -> d (n h)") + bias.flatten()
            return flat.view(batch, posn, 12, 64).transpose(1, 2)      # [b, n, p, h]

        q, k, v = heads(self.W_Q, self.b_Q), heads(self.W_K, self.b_K), heads(self.W_V, self.b_V)
        scores = q @ k.transpose(-1, -2) / (scale or math.sqrt(self.cfg.d_head))
        z = (self.apply_causal_mask(scores).softmax(-1) @ v).transpose(1, 2).reshape(batch, posn, -1)
        return z @ self.W_O.reshape(-1, self.cfg.d_model) + self.b_O
    return forward


def forward_loop_over_12_heads(self, x):
    out = self.b_O.expand(*x.shape[:2], -1)
    for h in range(12):
        q, k, v = (x @ W[h] + bias[h] for W, bias in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V)))
        scores = (q @ k.transpose(-1, -2))[:, None] / math.sqrt(self.cfg.d_head)
        out = out + self.apply_causal_mask(scores)[:, 0].softmax(-1) @ v @ self.W_O[h]
    return out


HEAD_SETTINGS_BUGS = [
    ("sqrt_64_literal", variant(_forward(scale=64)),
     "Likely mistake: d_head is not read from cfg: the scores are divided by sqrt(64)", "not a literal"),
    ("sqrt_d_head_of_global_cfg", variant(forward_scale_of_global_cfg),
     "Likely mistake: d_head is not read from cfg: the scores are divided by sqrt(64)", "global `cfg`"),
    ("12_heads_of_64_literal", variant(_merged_heads(8.0)),
     "Likely mistake: the heads are split as GPT-2's 12 heads of 64, not as this check's config's 6 "
     "heads of 128", "not literals"),
    ("12_heads_literal_scale_from_cfg", variant(_merged_heads(None)),
     "Likely mistake: the heads are split as GPT-2's 12 heads of 64", "not literals"),
    ("loop_over_12_heads", variant(forward_loop_over_12_heads),
     "Likely mistake: n_heads or d_head is hard-coded (GPT-2's 12 or 64)", "IndexError"),
]


@pytest.mark.parametrize("name, cls, message, how", HEAD_SETTINGS_BUGS, ids=[b[0] for b in HEAD_SETTINGS_BUGS])
def test_head_settings_not_read_from_the_config_are_named(name, cls, message, how):
    nb03.check_attention(cls)   # GPT-2's own heads: the default config cannot tell
    with pytest.raises(CheckFailed) as failure:
        nb03.check_attention(cls, block=5, n_heads=6, d_head=128)
    first_line = fix_only_last(str(failure.value)).splitlines()[0]
    assert message in first_line and how in str(failure.value), str(failure.value)


def test_localisation_points_before_the_mask():
    with pytest.raises(CheckFailed) as failure:
        nb03.check_attention(variant(_forward(drop=("b_Q",))))
    assert "The difference starts before the mask" in str(failure.value)
    assert "b_Q missing from the queries" in str(failure.value)


def test_missing_b_K_is_harmless():
    # q . b_K is the same for every key, and softmax ignores a constant added to a row.
    nb03.check_attention(variant(_forward(drop=("b_K",))))


def test_localisation_points_after_the_mask():
    with pytest.raises(CheckFailed) as failure:
        nb03.check_attention(variant(_forward(drop=("b_V",))))
    assert "scores your forward passed to apply_causal_mask are right" in str(failure.value)


@pytest.mark.parametrize("mask, message", [bug for bug in MASK_BUGS if bug[0] is not mask_library],
                         ids=lambda v: getattr(v, "__name__", ""))
def test_a_wrong_mask_costs_only_the_mask_check(mask, message):
    """The forward's check runs the course's mask in place of the learner's, which has its own
    check (one mistake, one exercise), whether forward uses the mask's result or, as
    with the classic in-place masked_fill_, relies on the scores being masked in place."""
    nb03.check_attention(variant(mask=mask))
    nb03.check_attention(variant(forward_relies_on_in_place_mask, mask=mask))


def test_mask_never_called_is_reported():
    with pytest.raises(CheckFailed) as failure:
        nb03.check_attention(variant(_forward(mask=False)))
    assert "never called self.apply_causal_mask" in str(failure.value)


# --- Property checks, on produced outputs (judge only) ------------------------------------------

@pytest.fixture(scope="module")
def correct_outputs():
    case = Case()
    return case, nb03.produce_attention(variant(), case, nb03.inputs_attention(case))


def test_non_causal_outputs_fail(correct_outputs):
    case, outputs = correct_outputs
    tampered = dict(outputs, changed_later_out=outputs["changed_later_out"].clone())
    tampered["changed_later_out"][:, 3] += 1.0
    with pytest.raises(CheckFailed, match="not causal.*earlier positions 3"):
        nb03.judge_attention(case, tampered)


def test_batch_mixing_fails(correct_outputs):
    case, outputs = correct_outputs
    tampered = dict(outputs, pair_out=outputs["pair_out"].flip(0))
    with pytest.raises(CheckFailed, match="mixes the batch"):
        nb03.judge_attention(case, tampered)


def test_correct_outputs_pass_judge(correct_outputs):
    nb03.judge_attention(*correct_outputs)


# --- qk_ov_circuits -------------------------------------------------------------------------------

def _circuits(qk, ov):
    return lambda attn: (qk(attn), ov(attn))


def _right_qk(attn):
    return attn.W_Q @ attn.W_K.transpose(-1, -2)


def _right_ov(attn):
    return attn.W_V @ attn.W_O


def test_the_circuits_pass_written_either_way():
    nb03.check_qk_ov_circuits(_circuits(_right_qk, _right_ov))
    einsummed = _circuits(lambda a: torch.einsum("ndh,neh->nde", a.W_Q, a.W_K),
                          lambda a: torch.einsum("ndh,nhe->nde", a.W_V, a.W_O))
    nb03.check_qk_ov_circuits(einsummed, block=7, seed=3)


@pytest.mark.parametrize("qk, ov, message", [
    (lambda a: a.W_K @ a.W_Q.transpose(-1, -2), _right_ov, "Likely mistake: W_QK is W_K W_Q^T"),
    (lambda a: _right_qk(a) / math.sqrt(a.cfg.d_head), _right_ov, "Likely mistake: W_QK is already divided"),
    (_right_qk, lambda a: a.W_V @ a.W_V.transpose(-1, -2), "x W_OV on 6 random residual vectors"),
    (lambda a: a.W_Q @ a.W_K, _right_ov, "qk_ov_circuits raised RuntimeError"),
], ids=["swapped", "scaled", "wrong_ov", "crash"])
def test_wrong_circuits_are_named(qk, ov, message):
    with pytest.raises(CheckFailed) as failure:
        nb03.check_qk_ov_circuits(_circuits(qk, ov))
    assert message in fix_only_last(str(failure.value)), str(failure.value)


def test_circuits_of_the_wrong_shape_say_which_dimension():
    with pytest.raises(CheckFailed, match="W_QK"):
        nb03.check_qk_ov_circuits(_circuits(lambda a: _right_qk(a)[0], _right_ov))


def test_a_wrong_circuit_gets_its_corrected_line_on_the_fix_line_only():
    with pytest.raises(CheckFailed) as failure:
        nb03.check_qk_ov_circuits(_circuits(_right_qk, lambda a: a.W_V @ a.W_V.transpose(-1, -2)))
    assert fix_only_last(str(failure.value)).endswith("\n  Show the fix: W_OV = attn.W_V @ attn.W_O"), \
        str(failure.value)
