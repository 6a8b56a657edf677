"""Library answers reached below the names the word scan and the tripwires watch (library
answers refused at the level they run): torch's own kernel for the exercise,
taken under a computed name before the check starts (so no tripwire replaces it), called as a
builtin, through torch.ops.aten, or as torch's Python reference (torch._refs). Each computes the
right answer; each check fails and names the kernel or routine. The same forms, written by hand,
pass (the catalogs' correct variants)."""
import importlib
import queue
import threading

import pytest
import torch
from torch import nn

from graders.course import example_class
from graders.exercises import nb01, nb02, nb03, nb04, nb06, nb09, nb10, nb13
from graders.exercises.nb10 import reference as ref
from graders.judging.compare import CheckFailed
from graders.reference.components import MLP, Attention, LayerNorm
from test_catalog_03 import Base, mask_future
from test_integrity import CONFINED, grade, with_forward

TORCH = importlib.import_module("tor" + "ch")
NN = importlib.import_module("torch._C." + "_nn")
ATEN = TORCH.ops.aten
NORM = "layer" + "_norm"


def taken(owner, *parts):
    """`owner.<the joined parts>`, taken now: what a learner's cell would hold before the check."""
    return getattr(owner, "".join(parts))


# --- 01: LayerNorm ---------------------------------------------------------------------------------

def _layernorm(normalise):
    class LayerNormBy(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.w, self.b = nn.Parameter(torch.ones(cfg.d_model)), nn.Parameter(torch.zeros(cfg.d_model))

        def forward(self, x):
            return normalise(x, self.cfg.layer_norm_eps) * self.w + self.b
    return LayerNormBy


NATIVE = taken(TORCH, "native_", NORM)
GROUPED = taken(TORCH, "group", "_norm")
BATCHED = taken(TORCH, "batch", "_norm")
REFERENCE = taken(importlib.import_module("torch._refs"), "native_", NORM)
LAYER_NORMS = {
    "native builtin": lambda x, eps: NATIVE(x, (x.shape[-1],), None, None, eps)[0],
    "torch.ops.aten": lambda x, eps: taken(ATEN, "native_", NORM).default(x, [x.shape[-1]], None, None, eps)[0],
    "group builtin": lambda x, eps: GROUPED(x.reshape(-1, 1, x.shape[-1]), 1, None, None, eps).reshape(x.shape),
    "batch builtin": lambda x, eps: BATCHED(x.reshape(-1, x.shape[-1]).T, None, None, None, None, True, 0.0,
                                            eps, False).T.reshape(x.shape),
    "torch._refs": lambda x, eps: REFERENCE(x, [x.shape[-1]], None, None, eps)[0],
}


@pytest.mark.parametrize("form", LAYER_NORMS)
def test_layernorm_by_torchs_kernels_fails(form):
    with pytest.raises(CheckFailed, match="torch's own|library version"):
        nb01.check_layernorm(_layernorm(LAYER_NORMS[form]))


def test_layernorm_by_hand_in_the_same_shape_passes():
    def by_hand(x, eps):
        centred = x - x.mean(-1, keepdim=True)
        return centred / (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    nb01.check_layernorm(_layernorm(by_hand))


def test_layernorm_run_on_a_thread_started_before_the_check_fails():
    """A worker thread, started before the check and waiting on a queue, runs torch's kernel for
    the learner's forward: the watch sees every thread."""
    requests, replies = queue.Queue(), queue.Queue()

    def worker():
        while (x := requests.get()) is not None:
            replies.put(LAYER_NORMS["native builtin"](*x))
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    def elsewhere(x, eps):
        requests.put((x, eps))
        return replies.get()
    try:
        with pytest.raises(CheckFailed, match="runs aten::native_layer_norm, torch's own kernel"):
            nb01.check_layernorm(_layernorm(elsewhere))
    finally:
        requests.put(None)
        thread.join()


def test_a_layernorm_that_stops_the_watch_fails():
    stop = taken(TORCH.autograd, "_disable", "_profiler")

    def unwatched(x, eps):
        stop()
        return LAYER_NORMS["native builtin"](x, eps)
    with pytest.raises(CheckFailed, match="switched off the check's watch of torch's operators"):
        nb01.check_layernorm(_layernorm(unwatched))


def test_the_watch_works_under_the_learners_own_profiler():
    def by_hand(x, eps):
        centred = x - x.mean(-1, keepdim=True)
        return centred / (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    with torch.profiler.profile():
        nb01.check_layernorm(_layernorm(by_hand))
    with torch.profiler.profile(), pytest.raises(CheckFailed, match="runs aten::native_layer_norm"):
        nb01.check_layernorm(_layernorm(LAYER_NORMS["native builtin"]))


# --- 02 and 06: the embeddings and the unembedding ------------------------------------------------

EMBEDDING = taken(TORCH, "embed", "ding")
LINEAR = taken(NN, "lin", "ear")


class EmbedByKernel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens):
        return EMBEDDING(self.W_E, tokens)


class UnembedByKernel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab), requires_grad=False)

    def forward(self, normalized_resid_final):
        return LINEAR(normalized_resid_final, self.W_U.T, self.b_U)


def test_embedding_and_unembedding_by_torchs_kernels_fail():
    with pytest.raises(CheckFailed, match="runs aten::embedding"):
        nb02.check_embed(EmbedByKernel)
    with pytest.raises(CheckFailed, match="runs aten::linear"):
        nb06.check_unembed(UnembedByKernel)


# --- 03: attention -------------------------------------------------------------------------------

SDPA = taken(NN, "scaled_dot_product", "_attention")


class AttentionByKernel(Base):
    """The catalog's attention parameters, torch's kernel for the rest."""
    apply_causal_mask = mask_future

    def forward(self, x):
        q, k, v = (torch.einsum("bpd,ndh->bnph", x, w) + b[:, None]
                   for w, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V)))
        z = SDPA(q, k, v, is_causal=True)
        return torch.einsum("bnph,nhd->bpd", z, self.W_O) + self.b_O


def test_attention_by_torchs_kernel_fails():
    with pytest.raises(CheckFailed, match="aten::scaled_dot_product_attention"):
        nb03.check_attention(AttentionByKernel)


# --- 04: gelu_new --------------------------------------------------------------------------------

GELUS = {
    "builtin": lambda x: taken(NN, "ge", "lu")(x, approximate="tanh"),
    "torch.ops.aten": lambda x: taken(ATEN, "ge", "lu").default(x, approximate="tanh"),
    "torch._refs": lambda x: taken(importlib.import_module("torch._refs.nn.functional"), "ge", "lu")(
        x, approximate="tanh"),
}


@pytest.mark.parametrize("form", GELUS)
def test_gelu_new_by_torchs_kernel_fails(form):
    with pytest.raises(CheckFailed, match="torch's own|library version"):
        nb04.check_gelu_new(GELUS[form])


GELU_KERNEL = taken(torch._C._nn, "ge", "lu")


class MLPWithTorchsGelu(nn.Module):
    """A right MLP, with torch's GELU kernel (its tanh form: gelu_new) for gelu_new."""

    def __init__(self, cfg):
        super().__init__()
        self.W_in, self.b_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp)), nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, normalized_resid_mid):
        pre = normalized_resid_mid @ self.W_in + self.b_in
        return GELU_KERNEL(pre, approximate="tanh") @ self.W_out + self.b_out


def test_an_mlp_running_torchs_gelu_fails_naming_gelu_new():
    """04's text says the MLP calls gelu_new and that torch's GELU is refused there too (a grading
    kernel of 04 has that kernel taken out: graders.integrity.kernel_bans)."""
    with pytest.raises(CheckFailed, match="MLP: your MLP runs aten::gelu, torch's own kernel for gelu_new"):
        nb04.check_mlp(MLPWithTorchsGelu)


# --- 09: the post-norm block -----------------------------------------------------------------------

ENCODER_LAYER = taken(nn, "Transformer", "EncoderLayer")
ENCODER_LAYER_FORWARD = ENCODER_LAYER.forward


class PostNormByLibrary(nn.Module):
    """The parts the check loads its weights into, and torch's encoder layer's own forward (taken
    before the check, so the tripwire on it does not fire) to run."""

    def __init__(self, cfg):
        super().__init__()
        self.attn, self.ln1, self.mlp, self.ln2 = Attention(cfg), LayerNorm(cfg), MLP(cfg), LayerNorm(cfg)
        object.__setattr__(self, "library", ENCODER_LAYER(cfg.d_model, cfg.n_heads, cfg.d_mlp, dropout=0.0,
                                                          batch_first=True))

    def forward(self, x):
        return ENCODER_LAYER_FORWARD(self.library, x)


def test_post_norm_block_by_torchs_encoder_layer_fails():
    with pytest.raises(CheckFailed, match="library version of the post-norm block"):
        nb09.check_post_norm_block(PostNormByLibrary)


# --- 10: RMSNorm and grouped-query attention -------------------------------------------------------

RMS = taken(TORCH, "rms", "_norm")


class RMSNormByKernel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.w = cfg, nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x):
        return RMS(x.float(), (x.shape[-1],), None, self.cfg.rms_norm_eps).to(x.dtype) * self.w


def test_rms_norm_by_torchs_kernel_fails():
    with pytest.raises(CheckFailed, match="aten::rms_norm"):
        nb10.check_rms_norm(RMSNormByKernel)


def _rotated(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class GroupedByKernel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d_head = cfg.d_model // cfg.n_heads
        self.W_Q = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(cfg.n_kv_heads, cfg.d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(cfg.n_kv_heads, cfg.d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(cfg.n_heads, d_head, cfg.d_model))

    def forward(self, x, cos, sin, past=None):
        q = _rotated(torch.einsum("bpd,ndh->bnph", x, self.W_Q), cos, sin)
        k = _rotated(torch.einsum("bpd,ndh->bnph", x, self.W_K), cos, sin)
        v = torch.einsum("bpd,ndh->bnph", x, self.W_V)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        n_q, n_k = q.shape[2], k.shape[2]
        allowed = torch.arange(n_k)[None, :] <= torch.arange(n_k - n_q, n_k)[:, None]
        z = SDPA(q, k, v, attn_mask=allowed, enable_gqa=True)
        return torch.einsum("bnph,nhd->bpd", z, self.W_O), (k, v)


class SwiGLUByKernel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_up = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_down = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))

    def forward(self, x):
        gate, up = LINEAR(x, self.W_gate.T), LINEAR(x, self.W_up.T)
        return LINEAR(gate * torch.sigmoid(gate) * up, self.W_down.T)


def test_swiglu_by_torchs_linear_kernel_fails():
    with pytest.raises(CheckFailed, match="runs aten::linear"):
        nb10.check_swiglu(SwiGLUByKernel)


def test_grouped_query_attention_by_torchs_kernel_fails():
    assert set(dict(GroupedByKernel(nb10.ModernConfig()).named_parameters())) == \
        set(dict(ref.GQAttention(nb10.ModernConfig()).named_parameters()))
    with pytest.raises(CheckFailed, match="aten::"):
        nb10.check_gq_attention(GroupedByKernel)


# --- 13: the SFT loss ----------------------------------------------------------------------------

def sft_loss_by_kernel(logits, labels):
    logits, labels = logits[:, :-1], labels[:, 1:]
    return taken(NN, "cross_entropy", "_loss")(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                               None, 1, -100, 0.0)


def test_sft_loss_by_torchs_kernel_fails():
    with pytest.raises(CheckFailed, match="torch's own"):
        nb13.check_sft_loss(sft_loss_by_kernel)


# --- in a grading kernel --------------------------------------------------------------------------

KERNEL_FORWARD = ('    def forward(self, residual):\n'
                  '        kernel = getattr(__import__("torch"), "native_" + "layer" + "_norm")\n'
                  '        eps = self.cfg.layer_norm_eps\n'
                  '        return kernel(residual, (residual.shape[-1],), self.w, self.b, eps)[0]\n')


@CONFINED
@pytest.mark.slow
def test_a_kernel_taken_under_a_computed_name_scores_nothing_in_the_grade(tmp_path):
    """The grade says what the check cell says; torch's profiler, which the watch turns on and
    off, leaves nothing on the kernel's stderr (nbgrader would zero a test cell that wrote there)."""
    cells, _, executed = grade(tmp_path, "01_layernorm", with_forward("01_layernorm", "layernorm_answer",
                                                                      KERNEL_FORWARD))
    assert cells["layernorm_test"].points == 0
    assert "runs aten::native_layer_norm, torch's own kernel for LayerNorm" in cells["layernorm_test"].message
    solved, _, executed = grade(tmp_path / "solved", "01_layernorm", example_class.submission("01_layernorm", True))
    assert all(c.points == c.max_points for c in solved.values())
    assert not [o for c in executed.cells for o in c.get("outputs", []) if o.get("name") == "stderr"]
