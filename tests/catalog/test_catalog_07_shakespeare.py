"""Training grader (07), the Shakespeare runs (graders/exercises/nb07/shakespeare.py): catalogued
mistakes fail with their diagnosis; correct variants pass. Like every 07 catalog, it runs in xdist group
nb07, on one worker: the grader's data and models are built once per worker."""
from pathlib import Path

import pytest
import torch

from graders.exercises import nb07
from graders.exercises.nb07.practice import role
from graders.judging.compare import CheckFailed
from graders.reference import components
from catalog_helpers import fails_with
from test_catalog_07_train import make_train

pytestmark = pytest.mark.xdist_group("nb07")

SHARED_SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"


# --- Shakespeare ----------------------------------------------------------------------------------

@pytest.fixture
def shakespeare(monkeypatch):
    if not SHARED_SHAKESPEARE.is_file():
        pytest.skip(f"tiny Shakespeare is not at {SHARED_SHAKESPEARE}")
    monkeypatch.setenv("GPT2_COURSE_SHAKESPEARE", str(SHARED_SHAKESPEARE))


def test_shakespeare_budget_is_enforced(shakespeare):
    """A loop that skips the budget fails fast (the full graded run is in the notebook's tests)."""
    def lazy(model, make_batch, n_steps, max_lr, eval_tokens, **settings):
        return [], []
    fails_with(nb07.check_shakespeare_training, lazy, expected="drew 0 batches", first_line=True)


def test_shakespeare_short_run_passes(shakespeare):
    nb07.check_shakespeare_smoke(make_train())


SHAKESPEARE_SHORT_RUN_BUGS = {
    "no_optimizer_step": (make_train(step=False), "Likely mistake: optimizer.step() is never called"),
    "lr_ignored": (make_train(use_lr=False), "the max_lr argument and the schedule are not used"),
    "clip_before_backward": (make_train(clip="before_backward"), "clip_grad_norm_ is called before"),
    "eval_on_training_data": (make_train(eval_on_train=True), "Likely mistake: evaluation uses training batches"),
    "optimizer_every_step": (make_train(optimizer_each_step=True),
                             "Likely mistake: the optimizer is re-created every step"),
    "zero_grad_missing": (make_train(zero_grad=False), "Likely mistake: optimizer.zero_grad() is missing"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHAKESPEARE_SHORT_RUN_BUGS))
def test_shakespeare_short_run_mistakes(shakespeare, name):
    train, expected = SHAKESPEARE_SHORT_RUN_BUGS[name]
    fails_with(nb07.check_shakespeare_smoke, train, expected=expected, first_line=True)


def test_unigram_baseline(shakespeare):
    assert abs(nb07.unigram_entropy() - 6.3151) < 1e-3
    train, val = nb07.shakespeare_tokens()
    assert len(train) + len(val) == 338025 and len(train) == int(0.9 * 338025)
    vocab = nb07.shakespeare_vocab()
    assert vocab.d_vocab == len(torch.unique(train)) + 1 == 11266 == nb07.shakespeare_config().d_vocab
    compact_train, compact_val = nb07.compact_shakespeare_tokens()
    assert int(compact_train.max()) < vocab.unknown            # every training token has its row
    assert torch.equal(vocab.decode_ids(compact_train), train)
    unseen = ~torch.isin(val, train)
    assert torch.equal(compact_val == vocab.unknown, unseen) and 0 < unseen.float().mean() < 0.05


def _probed_correct_loop(recipe) -> dict:
    """What the loop probe records for a correct `train` of `recipe` on the Shakespeare model:
    one optimizer, every step with a fresh, clipped gradient and the scheduled rate, in training
    mode, the course's groups."""
    n = recipe.n_steps
    rates = torch.tensor([recipe.lr(step) for step in range(n)], dtype=torch.float64)
    decay = [recipe.weight_decay if role(name) == "matrix" else 0.0
             for name, _ in components.DemoTransformer(nb07.shakespeare_config()).named_parameters()]
    return {"optimizer_steps": torch.tensor([n]),
            "optimizer_on_model": torch.tensor(True), "steps_without_grad": torch.tensor(0),
            "steps_accumulated": torch.tensor(0), "steps_checked": torch.tensor(n),
            "step_lr_low": rates, "step_lr_high": rates.clone(),
            "step_training": torch.ones(n, dtype=torch.float64),
            "step_grad_norm": torch.full((n,), recipe.max_grad_norm, dtype=torch.float64),
            "step_raw_norm": torch.full((n,), 3 * recipe.max_grad_norm, dtype=torch.float64),
            "param_decay": torch.tensor(decay, dtype=torch.float64), "batches_drawn": torch.tensor(n)}


def _judged_outputs(val: float, shuffled: float, recipe=nb07.SHAKESPEARE, n_windows=nb07.N_VAL_WINDOWS) -> dict:
    """What a run's `produce` returns for a correct loop whose model has these two mean losses."""
    shape = (n_windows, nb07.SHAKESPEARE_WINDOW - 1)
    return {"val_token_losses": torch.full(shape, val, dtype=torch.float64),
            "shuffled_token_losses": torch.full(shape, shuffled, dtype=torch.float64),
            **_probed_correct_loop(recipe)}


def test_shakespeare_bar_is_below_the_unigram_entropy(shakespeare):
    """Passing needs a loss below H - BELOW_UNIGRAM; a loss at H fails, with a message that says
    whether the model ignores its context (shuffled windows score the same) or is just slow."""
    bar = nb07.unigram_entropy() - nb07.BELOW_UNIGRAM
    nb07.judge_shakespeare(None, _judged_outputs(bar - 0.01, bar + 1.0))
    at_frequencies = nb07.unigram_entropy() + 0.2
    with pytest.raises(CheckFailed, match="learned token frequencies only; it does not use the context"):
        nb07.judge_shakespeare(None, _judged_outputs(at_frequencies, at_frequencies + 0.01))
    with pytest.raises(CheckFailed, match="it learned, but too slowly"):
        nb07.judge_shakespeare(None, _judged_outputs(bar + 0.01, bar + 1.0))
    with pytest.raises(CheckFailed, match="learned token frequencies only"):    # below the bar,
        nb07.judge_shakespeare(None, _judged_outputs(bar - 0.01, bar + 0.05))  # context unused
    nb07.judge_shakespeare_smoke(None, _judged_outputs(7.0, 7.0, nb07.SMOKE, nb07.N_SMOKE_VAL_WINDOWS))


class ContextBlindTransformer(components.DemoTransformer):
    """The course's model run on one fixed token at one position, its logits repeated for every
    position of every window: it can learn only token frequencies, as if the causal mask hid
    every token, the current one included (one position instead of all of them: a 64th of the
    cost of the model's own forward)."""
    def forward(self, tokens):
        batch, seq = tokens.shape
        return super().forward(tokens.new_zeros(1, 1)).expand(batch, seq, -1)


@pytest.mark.slow
def test_shakespeare_model_that_ignores_context_fails(shakespeare):
    """The graded run with the correct `train` on a model that cannot see its context: frequencies
    alone do not reach the bar, and the message says the context is not used. The 80 steps of
    the graded run, on a model that costs little (its logits' loss is most of its cost)."""
    fails_with(nb07.check_shakespeare_training, make_train(), expected="it does not use the context", first_line=True,
               model_class=ContextBlindTransformer)
