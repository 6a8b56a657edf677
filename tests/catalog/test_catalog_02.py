"""nb02's catalog: each common Embed / PosEmbed mistake is caught and named; correct variants pass."""
import einops
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fix_last import fix_only_last
from graders.exercises import nb02
from graders.judging.compare import CheckFailed
from graders.reference.config import Config

HIDDEN = dict(text=None, seed=7, batch=3)


def embed_class(forward):
    class Embed(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

        def forward(self, tokens):
            return forward(self, tokens)
    return Embed


def pos_class(forward):
    class PosEmbed(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

        def forward(self, tokens):
            return forward(self, tokens)
    return PosEmbed


# --- Embed ---------------------------------------------------------------------------------

EMBED_CORRECT = {
    "index": lambda self, t: self.W_E[t],
    "one_hot_matmul": lambda self, t: F.one_hot(t, self.W_E.shape[0]).float() @ self.W_E,
    "index_select": lambda self, t: torch.index_select(self.W_E, 0, t.flatten()).reshape(*t.shape, -1),
}


@pytest.mark.parametrize("name", EMBED_CORRECT)
def test_correct_embed_passes(name):
    cls = embed_class(EMBED_CORRECT[name])
    nb02.check_embed(cls)
    nb02.check_embed(cls, **HIDDEN)


class EmbedUsesLibrary(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens):
        return F.embedding(tokens, self.W_E)


class EmbedUsesCourse(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens):
        from graders.reference import components
        inner = components.Embed(Config())
        inner.W_E = self.W_E
        return inner(tokens)


EMBED_BUGGY = {
    "by_position": (lambda self, t: self.W_E[torch.arange(t.shape[1])].expand(t.shape[0], -1, -1),
                    "indexed by position"),
    "returns_table": (lambda self, t: self.W_E, "shape of W_E itself"),
    "transposed": (lambda self, t: self.W_E.T[t], "transposed"),
    "scaled": (lambda self, t: self.W_E[t] * Config().d_model ** 0.5, "sqrt(d_model)"),
    "first_sequence": (lambda self, t: self.W_E[t[0]].expand(t.shape[0], -1, -1), "first sequence"),
    "drops_batch": (lambda self, t: self.W_E[t[0]], "batch dimension is missing"),
    "off_by_one": (lambda self, t: self.W_E[t - 1], "off by one (W_E[tokens - 1])"),
    "off_by_one_up": (lambda self, t: self.W_E[t + 1], "off by one (W_E[tokens + 1]"),
    "shifted_rows": (lambda self, t: self.W_E[1:][t], "off by one (W_E[tokens + 1]"),
    "numpy": (lambda self, t: self.W_E[t].detach().numpy(), "expected a torch.Tensor"),
}


@pytest.mark.parametrize("name", EMBED_BUGGY)
def test_buggy_embed_is_named(name):
    forward, expected = EMBED_BUGGY[name]
    cls = embed_class(forward)
    with pytest.raises(CheckFailed) as info:
        nb02.check_embed(cls)
        nb02.check_embed(cls, **HIDDEN)
    assert expected in fix_only_last(str(info.value)).splitlines()[0], str(info.value)


def test_a_named_embed_mistake_ends_with_its_fix_and_no_recipe():
    with pytest.raises(CheckFailed) as info:
        nb02.check_embed(embed_class(EMBED_BUGGY["off_by_one"][0]))
    message = fix_only_last(str(info.value))
    assert message.endswith("\n  Show the fix: return self.W_E[tokens]"), message
    assert "Hint:" not in message, message   # the mistake is named: no general recipe under it


@pytest.mark.parametrize("cls, expected", [(EmbedUsesLibrary, "F.embedding"),
                                           (EmbedUsesCourse, "runs code from graders/reference/components.py")])
def test_embed_library_shortcuts_are_refused(cls, expected):
    with pytest.raises(CheckFailed) as info:
        nb02.check_embed(cls)
    assert expected in str(info.value), str(info.value)


def test_embed_nn_embedding_is_refused():
    class Embed(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

        def forward(self, tokens):
            table = nn.Embedding(self.W_E.shape[0], self.W_E.shape[1], _weight=self.W_E)
            return table(tokens)
    with pytest.raises(CheckFailed) as info:
        nb02.check_embed(Embed)
    assert "your code uses `nn.Embedding`" in str(info.value)


# --- PosEmbed ------------------------------------------------------------------------------

POS_CORRECT = {
    "einops_repeat": lambda self, t: einops.repeat(self.W_pos[: t.shape[1]], "p d -> b p d", b=t.shape[0]),
    "expand": lambda self, t: self.W_pos[: t.shape[1]].expand(t.shape[0], -1, -1),
    "arange_index": lambda self, t: self.W_pos[torch.arange(t.shape[1]).repeat(t.shape[0], 1)],
    "one_hot": lambda self, t: F.one_hot(torch.arange(t.shape[1]), self.W_pos.shape[0]).float()
    @ self.W_pos + torch.zeros(t.shape[0], 1, 1),
}


@pytest.mark.parametrize("name", POS_CORRECT)
def test_correct_pos_embed_passes(name):
    cls = pos_class(POS_CORRECT[name])
    nb02.check_pos_embed(cls)
    nb02.check_pos_embed(cls, **HIDDEN)


class PosUsesCourse(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(self, tokens):
        from graders.reference import components
        inner = components.PosEmbed(Config())
        inner.W_pos = self.W_pos
        return inner(tokens)


POS_BUGGY = {
    "by_token_id": (lambda self, t: self.W_pos[t], "indexed by the token ids"),
    "offset": (lambda self, t: self.W_pos[1: t.shape[1] + 1].expand(t.shape[0], -1, -1), "offset by one"),
    "batch_one": (lambda self, t: self.W_pos[: t.shape[1]].unsqueeze(0), "batch dimension is 1"),
    "no_batch": (lambda self, t: self.W_pos[: t.shape[1]], "batch dimension is missing"),
    "full_table": (lambda self, t: self.W_pos.expand(t.shape[0], -1, -1), "all n_ctx=1024 rows"),
    "last_rows": (lambda self, t: self.W_pos[-t.shape[1]:].expand(t.shape[0], -1, -1), "last seq_len rows"),
    "reversed": (lambda self, t: self.W_pos[: t.shape[1]].flip(0).expand(t.shape[0], -1, -1), "reverse"),
    "library": (lambda self, t: F.embedding(torch.arange(t.shape[1]), self.W_pos).expand(t.shape[0], -1, -1),
                "functional.embedding"),
}


@pytest.mark.parametrize("name", POS_BUGGY)
def test_buggy_pos_embed_is_named(name):
    forward, expected = POS_BUGGY[name]
    cls = pos_class(forward)
    with pytest.raises(CheckFailed) as info:
        nb02.check_pos_embed(cls)
        nb02.check_pos_embed(cls, **HIDDEN)
    assert expected in fix_only_last(str(info.value)).splitlines()[0], str(info.value)


def test_a_pos_embed_shape_mistake_ends_with_its_fix():
    with pytest.raises(CheckFailed) as info:
        nb02.check_pos_embed(pos_class(POS_BUGGY["full_table"][0]))
    assert fix_only_last(str(info.value)).endswith(f"\n  Show the fix: {nb02.POS_FIX}"), str(info.value)


def test_pos_embed_course_version_is_refused():
    with pytest.raises(CheckFailed) as info:
        nb02.check_pos_embed(PosUsesCourse)
    assert "runs code from graders/reference/components.py" in str(info.value), str(info.value)
