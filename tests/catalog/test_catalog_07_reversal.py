"""Training grader (07), the reversal data and evaluate (graders/exercises/nb07/reversal.py): catalogued
mistakes fail with their diagnosis; correct variants pass. Like every 07 catalog, it runs in xdist group
nb07, on one worker: the grader's data and models are built once per worker."""
import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb07
from catalog_helpers import fails_with
from catalog_07_shared import loss_cross_entropy, loss_gather, loss_logsumexp, per_position, unshifted

pytestmark = pytest.mark.xdist_group("nb07")


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
