"""Training grader (07): catalogued mistakes fail with their diagnosis; correct variants pass.

The training checks each train a small model for the grader's step budget (a few seconds on an
idle core), so this module keeps them in one xdist group and reruns nothing.
"""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from graders.exercises import nb07
from graders.exercises.nb07.practice import role
from graders.judging.compare import CheckFailed
from graders.reference import components
from catalog_helpers import fails_with

pytestmark = pytest.mark.xdist_group("nb07")

SHARED_SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"


# --- losses the evaluate and train tests use ------------------------------------------------

def loss_gather(logits, tokens):
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    return -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1).mean()


def loss_cross_entropy(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def loss_logsumexp(logits, tokens):
    picked = logits[:, :-1].gather(-1, tokens[:, 1:].unsqueeze(-1))[..., 0]
    return (logits[:, :-1].logsumexp(-1) - picked).mean()


def unshifted(logits, tokens):
    return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def per_position(logits, tokens):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")


# --- the reversal data ------------------------------------------------------------------------

def gen_flip(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=generator)
    return torch.cat([half, half.flip(-1)], dim=-1)


def gen_index(n, generator):
    seqs = torch.empty(n, 16, dtype=torch.long)
    seqs[:, :8] = torch.randint(100, (n, 8), generator=generator)
    seqs[:, 8:] = seqs[:, torch.arange(7, -1, -1)]
    return seqs


def gen_loop(n, generator):
    half = torch.randint(low=0, high=100, size=(n, 8), generator=generator, dtype=torch.int64)
    return torch.stack([half[:, i] if i < 8 else half[:, 15 - i] for i in range(16)], dim=1)


@pytest.mark.parametrize("fn", [gen_flip, gen_index, gen_loop], ids=lambda f: f.__name__)
def test_generator_correct_variants(fn):
    nb07.check_reversal_generator(fn)
    nb07.check_reversal_generator(fn, seed=3)


def gen_off_by_one(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=generator)
    return torch.cat([half, half.flip(-1).roll(1, dims=-1)], dim=-1)


def gen_copy(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=generator)
    return torch.cat([half, half], dim=-1)


def gen_global_rng(n, generator):
    half = torch.randint(0, 100, (n, 8))
    return torch.cat([half, half.flip(-1)], dim=-1)


def gen_reseeds(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=torch.Generator().manual_seed(0))
    return torch.cat([half, half.flip(-1)], dim=-1)


def gen_99(n, generator):
    half = torch.randint(0, 99, (n, 8), generator=generator)
    return torch.cat([half, half.flip(-1)], dim=-1)


def gen_101(n, generator):
    half = torch.randint(0, 101, (n, 8), generator=generator)
    return torch.cat([half, half.flip(-1)], dim=-1)


def gen_float(n, generator):
    return gen_flip(n, generator).float()


def gen_shape(n, generator):
    return gen_flip(n, generator)[:, :15]


def gen_flip_batch(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=generator)
    return torch.cat([half, half.flip(0)], dim=-1)


def gen_flip_both(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=generator)
    return torch.cat([half, torch.flip(half, dims=(0, 1))], dim=1)


def gen_cat_batch(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=generator)
    return torch.cat([half, half.flip(-1)], dim=0)


def gen_half_only(n, generator):
    return torch.randint(0, 100, (n, 8), generator=generator)


def gen_one_half_repeated(n, generator):
    half = torch.randint(0, 100, (1, 8), generator=generator).expand(n, -1)
    return torch.cat([half, half.flip(-1)], dim=-1)


def gen_loop_wrong_index(n, generator):
    half = torch.randint(0, 100, (n, 8), generator=generator)
    return torch.stack([half[:, i] if i < 8 else half[:, 16 - i] if i > 8 else half[:, 0]
                        for i in range(16)], dim=1)


def gen_global_seed(n, generator):
    torch.manual_seed(generator.initial_seed())
    half = torch.randint(0, 100, (n, 8))
    return torch.cat([half, half.flip(-1)], dim=-1)


GEN_BUGS = [
    (gen_off_by_one, "the mirror is off by one position"),
    (gen_copy, "copy of the first, not its mirror"),
    (gen_global_rng, "draws from torch's global random generator"),
    (gen_reseeds, "ignores the generator's seed"),
    (gen_99, "never appear"),
    (gen_101, "must lie in [0, 99]"),
    (gen_float, "must be torch.long"),
    (gen_shape, "dimension 1 (position) is 15, should be 16"),
    (gen_global_seed, "global random generator"),
    (gen_flip_batch, "Likely mistake: the halves are flipped along the wrong dimension"),
    (gen_flip_both, "Likely mistake: the halves are flipped along both dimensions"),
    (gen_cat_batch, "Likely mistake: the halves are joined along the batch dimension"),
    (gen_half_only, "Likely mistake: only the first half is returned"),
    (gen_one_half_repeated, "Likely mistake: one random half is drawn and repeated over the batch"),
    (gen_loop_wrong_index, "Likely mistake: the mirror is off by one position"),
]


@pytest.mark.parametrize("fn,expected", GEN_BUGS, ids=[f.__name__ for f, _ in GEN_BUGS])
def test_generator_mistakes(fn, expected):
    fails_with(nb07.check_reversal_generator, fn, expected=expected, first_line=True)


# --- evaluate -----------------------------------------------------------------------------------

@torch.no_grad()
def eval_batched(model, tokens, batch_size=256):
    was_training = model.training
    model.eval()
    total = 0.0
    for chunk in tokens.split(batch_size):
        total += loss_gather(model(chunk), chunk).item() * len(chunk)
    model.train(was_training)
    return total / len(tokens)


@torch.no_grad()
def eval_whole(model, tokens):
    model.eval()
    loss = loss_cross_entropy(model(tokens), tokens)
    model.train()
    return loss


def eval_inference_mode(model, tokens):
    was_training = model.training
    try:
        with torch.inference_mode():
            return float(loss_logsumexp(model.eval()(tokens), tokens))
    finally:
        model.train(was_training)


@torch.no_grad()
def eval_per_sequence_loop(model, tokens):
    mode = model.training
    model.train(False)
    losses = [loss_gather(model(seq[None]), seq[None]) for seq in tokens]
    model.train(mode)
    return float(torch.stack(losses).mean())


@pytest.mark.parametrize("fn", [eval_batched, eval_whole, eval_inference_mode, eval_per_sequence_loop],
                         ids=lambda f: f.__name__)
def test_evaluate_correct_variants(fn):
    nb07.check_evaluate(fn)
    nb07.check_evaluate(fn, seed=4)


TRAINING_BATCH = nb07.reference_reversal(64, torch.Generator().manual_seed(123))


def eval_on_training_batch(model, tokens):
    with torch.no_grad():
        return loss_gather(model(TRAINING_BATCH), TRAINING_BATCH).item()


def eval_first_chunk_only(model, tokens):
    with torch.no_grad():
        chunk = tokens[:256]
        return loss_gather(model(chunk), chunk).item()


def eval_trains(model, tokens):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.enable_grad():
        loss = loss_gather(model(tokens), tokens)
        loss.backward()
    optimizer.step()
    return loss.item()


def eval_unshifted(model, tokens):
    with torch.no_grad():
        return unshifted(model(tokens), tokens).item()


@torch.no_grad()
def eval_unweighted_chunks(model, tokens, batch_size=256):
    means = [loss_gather(model(chunk), chunk).item() for chunk in tokens.split(batch_size)]
    return sum(means) / len(means)


@torch.no_grad()
def eval_unweighted_chunks_of_64(model, tokens):
    return torch.stack([loss_cross_entropy(model(c), c) for c in torch.split(tokens, 64)]).mean()


@torch.no_grad()
def eval_summed(model, tokens):
    return F.cross_entropy(model(tokens)[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="sum")


def eval_returns_list(model, tokens):
    with torch.no_grad():
        return [per_position(model(tokens), tokens)]


def eval_per_position(model, tokens):
    with torch.no_grad():
        return per_position(model(tokens), tokens).mean(0)


@torch.no_grad()
def eval_in_training_mode(model, tokens):
    return loss_gather(model(tokens), tokens).item()


@torch.no_grad()
def eval_leaves_eval_mode(model, tokens):
    model.eval()
    return loss_gather(model(tokens), tokens).item()


EVAL_BUGS = [
    (eval_on_training_batch, "it ignores its `tokens` argument"),
    (eval_first_chunk_only, "only the first batch"),
    (eval_trains, "changed the model's weights"),
    (eval_unshifted, "Likely mistake: evaluate's loss: the loss is not shifted"),
    (eval_unweighted_chunks, "Likely mistake: the chunk means are averaged without weighting by chunk size"),
    (eval_unweighted_chunks_of_64, "Likely mistake: the chunk means are averaged without weighting by chunk size"),
    (eval_summed, "Likely mistake: evaluate's loss: the losses are summed instead of averaged"),
    (eval_returns_list, "return the mean loss as a float"),
    (eval_per_position, "return one number"),
    (eval_in_training_mode, "Likely mistake: the model stays in training mode; call model.eval()"),
    (eval_leaves_eval_mode, "evaluate left the model in eval mode"),
]


@pytest.mark.parametrize("fn,expected", EVAL_BUGS, ids=[f.__name__ for f, _ in EVAL_BUGS])
def test_evaluate_mistakes(fn, expected):
    fails_with(nb07.check_evaluate, fn, expected=expected, first_line=True)


# --- train (the reversal task) --------------------------------------------------------------------

def course_groups(model, weight_decay):
    """A learner's optimizer_groups: weight matrices decayed; biases, LayerNorm, embeddings not."""
    decay, keep = [], []
    for name, param in model.named_parameters():
        leaf = name.split(".")[-1]
        matrix = leaf.startswith("W_") and leaf not in ("W_E", "W_pos")
        (decay if matrix else keep).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def course_lr(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def make_train(loss_fn=loss_gather, zero_grad=True, step=True, backward=True, eval_on_train=False,
               optimizer_each_step=False, use_lr=True, zero_grad_first=False, clip="between",
               optimizer_every_eval=False, other_parameters=False, zero_between=False,
               model_zero_grad=False, groups=True, schedule="every_step", evaluate=eval_batched):
    """A training loop with the mistakes (or harmless variations) switched on by the arguments.
    clip: "between" (backward and step), "before_backward", "after_step", "normalize" (scale
    every gradient to max_grad_norm, not only larger ones) or "none"; schedule:
    "every_step", "none", "after_step", "first_group" or "every_eval"."""
    def train(model, make_batch, n_steps, max_lr, eval_tokens, eval_every=50, weight_decay=0.1,
              warmup_steps=10, min_lr=1e-3, max_grad_norm=1.0, progress=True):
        lr_used = max_lr if use_lr else 1e-6
        model.train()

        def new_optimizer():
            if other_parameters:
                return torch.optim.AdamW(torch.nn.Linear(4, 4).parameters(), lr=lr_used)
            params = course_groups(model, weight_decay) if groups else model.parameters()
            return torch.optim.AdamW(params, lr=lr_used, weight_decay=weight_decay)

        def set_lr(i):
            if schedule == "none" or not use_lr:
                return
            rate = course_lr(i - i % eval_every if schedule == "every_eval" else i, max_lr,
                             warmup_steps, n_steps, min_lr)
            for group in optimizer.param_groups[:1] if schedule == "first_group" else optimizer.param_groups:
                group["lr"] = rate

        def clip_now():
            if clip == "normalize":      # every gradient scaled to norm max_grad_norm, small ones too
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                total = torch.cat([g.flatten() for g in grads]).norm()
                for g in grads:
                    g.mul_(max_grad_norm / total)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)

        optimizer = new_optimizer()
        train_losses, eval_losses = [], []
        for i in tqdm(range(n_steps), disable=not progress):
            if optimizer_each_step or (optimizer_every_eval and i % eval_every == 0):
                optimizer = new_optimizer()
            if zero_grad_first:
                optimizer.zero_grad(set_to_none=False)
            tokens = make_batch()
            loss = loss_fn(model(tokens), tokens)
            if clip == "before_backward":
                clip_now()
            if backward:
                loss.backward()
            if clip in ("between", "normalize"):
                clip_now()
            if zero_between:
                optimizer.zero_grad()
            if schedule != "after_step":
                set_lr(i)
            if step:
                optimizer.step()
            if schedule == "after_step":
                set_lr(i)
            if clip == "after_step":
                clip_now()
            if model_zero_grad:
                model.zero_grad()
            elif zero_grad and not zero_grad_first and not zero_between:
                optimizer.zero_grad()
            train_losses.append(loss.item())
            if (i + 1) % eval_every == 0:
                held_out = make_batch() if eval_on_train else eval_tokens
                eval_losses.append((i + 1, evaluate(model, held_out)))
        return train_losses, eval_losses
    return train


class NoMask(components.DemoTransformer):
    """A learner model whose attention forgot the causal mask."""

    def __init__(self, cfg):
        super().__init__(cfg)
        for block in self.blocks:
            block.attn.apply_causal_mask = lambda scores: scores


class MaskOffByOne(components.DemoTransformer):
    """The mask hides only positions > i + 1: each position sees one token ahead."""

    def __init__(self, cfg):
        super().__init__(cfg)
        for block in self.blocks:
            block.attn.apply_causal_mask = self._mask

    @staticmethod
    def _mask(scores):
        q, k = scores.shape[-2:]
        future = torch.triu(torch.ones(q, k, dtype=torch.bool), diagonal=2)
        return scores.masked_fill(future, -1e5)


TRAIN_CORRECT = {
    "solution": (make_train(), None),
    "cross_entropy_zero_grad_first": (make_train(loss_fn=loss_cross_entropy, zero_grad_first=True), None),
    "logsumexp_loss": (make_train(loss_fn=loss_logsumexp), None),
    "model_zero_grad_whole_batch_eval": (make_train(model_zero_grad=True, evaluate=eval_whole), None),
}


# Each check of `train` is a graded training run (150 optimizer steps): the fast tier keeps the
# solution's round trip, the full tier runs every variant and every mistake.
@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name == "solution" else pytest.mark.slow)
                                  for name in TRAIN_CORRECT])
def test_train_correct_variants(name):
    train, model_class = TRAIN_CORRECT[name]
    nb07.check_train(train, model_class)


TRAIN_BUGS = {
    "no_causal_mask": (make_train(), NoMask, "information is leaking from the future"),
    "mask_off_by_one": (make_train(), MaskOffByOne, "check your causal mask"),
    "loss_not_shifted": (make_train(loss_fn=unshifted), None, "the training loss is not shifted"),
    "zero_grad_missing": (make_train(zero_grad=False), None, "Likely mistake: optimizer.zero_grad() is missing"),
    "no_optimizer_step": (make_train(step=False), None, "Likely mistake: optimizer.step() is never called"),
    "no_backward": (make_train(backward=False), None, "Likely mistake: loss.backward() is missing"),
    "zero_grad_between_backward_and_step": (make_train(zero_between=True), None,
                                            "or zero_grad() runs between backward() and step()"),
    "eval_on_training_data": (make_train(eval_on_train=True), None,
                              "Likely mistake: evaluation uses training batches"),
    "lr_ignored": (make_train(use_lr=False), None, "the max_lr argument and the schedule are not used"),
    "decay_on_every_parameter": (make_train(groups=False), None,
                                 "Likely mistake: decay is applied to every parameter"),
    "no_schedule": (make_train(schedule="none"), None, "the rate never changes from max_lr"),
    "lr_set_after_step": (make_train(schedule="after_step"), None,
                          "the rate is set after optimizer.step()"),
    "schedule_in_first_group_only": (make_train(schedule="first_group"), None,
                                     "the param groups got different rates"),
    "schedule_stepped_per_evaluation": (make_train(schedule="every_eval"), None,
                                        "not at every step"),
    "clip_before_backward": (make_train(clip="before_backward"), None,
                             "Likely mistake: clip_grad_norm_ is called before loss.backward()"),
    "clip_after_step": (make_train(clip="after_step"), None, "train does not clip the gradients"),
    "no_clipping": (make_train(clip="none"), None, "train does not clip the gradients"),
    "gradients_always_rescaled": (make_train(clip="normalize"), None,
                                  "train changes the gradients other than clipping does"),
    "evaluate_leaves_eval_mode": (make_train(evaluate=eval_leaves_eval_mode), None,
                                  "the model was in eval mode at"),
    "optimizer_every_step": (make_train(optimizer_each_step=True), None,
                             "Likely mistake: the optimizer is re-created every step"),
    "optimizer_every_eval": (make_train(optimizer_every_eval=True), None,
                             "Likely mistake: the optimizer is re-created during training"),
    "optimizer_on_other_parameters": (make_train(other_parameters=True), None,
                                      "Likely mistake: the optimizer was built on other parameters"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TRAIN_BUGS))
def test_train_mistakes(name):
    train, model_class, expected = TRAIN_BUGS[name]
    fails_with(nb07.check_train, train, expected=expected, first_line=True, model_class=model_class)


def test_train_not_implemented():
    def train(model, make_batch, n_steps, max_lr, eval_tokens, **settings):
        raise NotImplementedError
    fails_with(nb07.check_train, train, expected="not written yet", first_line=True)


WRONG_PARTS = """
def optimizer_groups(model, weight_decay):      # every parameter decayed
    return [{"params": list(model.parameters()), "weight_decay": weight_decay}]


def lr_at(step, max_lr, warmup_steps, total_steps, min_lr):   # no schedule
    return max_lr


@torch.no_grad()
def evaluate(model, tokens, batch_size=256):    # leaves the model in eval mode
    model.eval()
    return lm_cross_entropy_loss(model(tokens), tokens).item()
"""

SOLUTION_TRAIN = """
def train(model, make_batch, n_steps, max_lr, eval_tokens, eval_every=50, weight_decay=0.1,
          warmup_steps=10, min_lr=1e-3, max_grad_norm=1.0, progress=True):
    model.train()
    optimizer = torch.optim.AdamW(optimizer_groups(model, weight_decay), lr=max_lr)
    train_losses, eval_losses = [], []
    for step in range(n_steps):
        tokens = make_batch()
        loss = lm_cross_entropy_loss(model(tokens), tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, max_lr, warmup_steps, n_steps, min_lr)
        optimizer.step()
        optimizer.zero_grad()
        train_losses.append(loss.item())
        if (step + 1) % eval_every == 0 or step + 1 == n_steps:
            eval_losses.append((step + 1, evaluate(model, eval_tokens)))
    return train_losses, eval_losses
"""


@pytest.mark.slow   # a graded training run, as the tiers define slow (the solution's train stays in test-fast)
def test_a_wrong_part_costs_only_its_own_check():
    """A notebook whose optimizer_groups, lr_at and evaluate are wrong and whose train is right:
    each part fails its own check, and train passes its, which runs the course's parts under the
    notebook's names (07 charged each of them to train and Shakespeare as well), and
    gives the learner's back afterwards."""
    notebook = {"torch": torch, "lm_cross_entropy_loss": loss_cross_entropy}
    exec(WRONG_PARTS + SOLUTION_TRAIN, notebook)
    parts = {name: notebook[name] for name in ("optimizer_groups", "lr_at", "evaluate")}
    fails_with(nb07.check_optimizer_groups, parts["optimizer_groups"], expected="optimizer_groups", first_line=True)
    fails_with(nb07.check_lr_at, parts["lr_at"], expected="lr_at", first_line=True)
    fails_with(nb07.check_evaluate, parts["evaluate"], expected="evaluate left the model in eval mode", first_line=True)
    nb07.check_train(notebook["train"])
    assert all(notebook[name] is part for name, part in parts.items())


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


# --- per_position_accuracy ------------------------------------------------------------------------

def _accuracy(logits_slice, tokens_slice, reduce=lambda hits: hits.float().mean(dim=0)):
    @torch.no_grad()
    def per_position_accuracy(model, tokens):
        predictions = model(tokens).argmax(dim=-1)
        return reduce(predictions[:, logits_slice] == tokens[:, tokens_slice])
    return per_position_accuracy


def test_per_position_accuracy_passes_written_either_way():
    nb07.check_per_position_accuracy(_accuracy(slice(None, -1), slice(1, None)))
    nb07.check_per_position_accuracy(_accuracy(slice(0, 15), slice(1, 16),
                                               lambda hits: hits.sum(0) / hits.shape[0]), seed=9, batch=37)


@pytest.mark.parametrize("fn, message", [
    (_accuracy(slice(None, -1), slice(None, -1)), "Likely mistake: no shift"),
    (_accuracy(slice(1, None), slice(1, None)), "Likely mistake: no shift (positions 1..15"),
    (_accuracy(slice(1, None), slice(None, -1)), "Likely mistake: shifted the wrong way"),
    (_accuracy(slice(None, -1), slice(1, None), lambda hits: hits.float().sum(0)), "Likely mistake: a count"),
    (_accuracy(slice(None, -1), slice(1, None), lambda hits: hits.float().mean(1)), "shape"),
], ids=["no_shift", "no_shift_late", "wrong_way", "count", "wrong_axis"])
def test_per_position_accuracy_mistakes_are_named(fn, message):
    with pytest.raises(CheckFailed) as failure:
        nb07.check_per_position_accuracy(fn)
    assert message in str(failure.value), str(failure.value)


# --- optimizer_groups and lr_at ----------------------------------------------------------------

def _groups(decay_if):
    def optimizer_groups(model, weight_decay):
        decay, no_decay = [], []
        for name, param in model.named_parameters():
            (decay if decay_if(name, param) else no_decay).append(param)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return optimizer_groups


def _is_matrix(name, param):
    *_, owner, leaf = name.split(".")
    return leaf.startswith("W_") and leaf not in ("W_E", "W_pos") and not owner.startswith("ln")


def groups_by_module_type(model, weight_decay):
    """Correct, minGPT's way: by the module that owns each parameter, not by its name."""
    decay, no_decay = [], []
    for _, module in model.named_modules():
        for leaf, param in module.named_parameters(recurse=False):
            is_ln = type(module).__name__ == "LayerNorm"
            is_embedding = leaf in ("W_E", "W_pos")
            (no_decay if is_ln or is_embedding or leaf.startswith("b_") else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


@pytest.mark.parametrize("fn", [_groups(_is_matrix), groups_by_module_type], ids=["by name", "by module"])
def test_optimizer_groups_correct_variants(fn):
    nb07.check_optimizer_groups(fn)
    nb07.check_optimizer_groups(fn, seed=3)


def _missing_biases(model, weight_decay):
    return _groups(_is_matrix)(model, weight_decay)[:1]


def _wrong_decay(model, weight_decay):
    groups = _groups(_is_matrix)(model, weight_decay)
    groups[0]["weight_decay"] = 0.01
    return groups


GROUP_BUGS = [
    (_groups(lambda n, p: True), "decay is applied to every parameter"),
    (_groups(lambda n, p: _is_matrix(n, p) or n.split(".")[-1] in ("W_E", "W_pos")),
     "the embeddings W_E and W_pos are decayed"),
    (_groups(lambda n, p: _is_matrix(n, p) or n.split(".")[-2].startswith("ln")), "LayerNorm's w and b are decayed"),
    (_groups(lambda n, p: _is_matrix(n, p) or n.split(".")[-1].startswith("b_")), "the biases b_* are decayed"),
    (_groups(lambda n, p: p.dim() >= 2), "wrong weight decay"),     # nanoGPT's rule on this model
    (_wrong_decay, "not the 0.1 asked for"),
    (_missing_biases, "are in no group"),
    (lambda model, wd: {"params": list(model.parameters())}, "should return a list of dicts"),
]


@pytest.mark.parametrize("fn,expected", GROUP_BUGS, ids=[str(i) for i in range(len(GROUP_BUGS))])
def test_optimizer_groups_mistakes(fn, expected):
    fails_with(nb07.check_optimizer_groups, fn, expected=expected, first_line=True)


def lr_cosine(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def lr_torch(step, max_lr, warmup_steps, total_steps, min_lr):
    """Correct, with tensors: a 0-dim tensor's value is accepted too."""
    s = torch.tensor(float(step), dtype=torch.float64)
    warm = max_lr * (s + 1) / warmup_steps
    progress = ((s - warmup_steps) / (total_steps - warmup_steps)).clamp(0, 1)
    cosine = min_lr + (max_lr - min_lr) * (1 + torch.cos(torch.pi * progress)) / 2
    return torch.where(s < warmup_steps, warm, cosine)


@pytest.mark.parametrize("fn", [lr_cosine, lr_torch], ids=lambda f: f.__name__)
def test_lr_at_correct_variants(fn):
    for seed in (0, 4, 7):
        nb07.check_lr_at(fn, seed=seed)


def _lr(**change):
    def lr_at(step, max_lr, warmup_steps, total_steps, min_lr):
        if change.get("no_warmup") and step < warmup_steps:
            return max_lr
        if step < warmup_steps:
            return max_lr * (step + change.get("warm_offset", 1)) / warmup_steps
        start = 0 if change.get("from_zero") else warmup_steps
        progress = (step - start) / (total_steps - start)
        if not change.get("unclamped"):
            progress = min(1.0, progress)
        floor = 0.0 if change.get("to_zero") else min_lr
        if change.get("linear"):
            return max_lr - (max_lr - floor) * progress
        return floor + 0.5 * (max_lr - floor) * (1 + math.cos(math.pi * progress))
    return lr_at


LR_BUGS = [
    (_lr(no_warmup=True), "there is no warmup"),
    (_lr(warm_offset=0), "the warmup starts at 0"),
    (_lr(to_zero=True), "the decay ends at 0 instead of min_lr"),
    (_lr(linear=True), "the decay is linear"),
    (_lr(from_zero=True), "the cosine counts from step 0"),
    (_lr(unclamped=True), "the rate climbs again"),
    (lambda *args: "0.001", "a learning rate is a Python float"),
]


@pytest.mark.parametrize("fn,expected", LR_BUGS, ids=[str(i) for i in range(len(LR_BUGS))])
def test_lr_at_mistakes(fn, expected):
    fails_with(nb07.check_lr_at, fn, expected=expected, first_line=True)
