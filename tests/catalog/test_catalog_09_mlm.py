"""Notebook 09's mask_tokens and mlm_loss graders (graders/exercises/nb09/mlm.py): correct variants (in
other styles) pass, each catalogued mistake fails with its name."""
import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb09

from catalog_helpers import fails_with

N_ORDINARY, MASK, IGNORE = nb09.N_ORDINARY, nb09.MASK, nb09.IGNORE


# --- 5. mask_tokens and mlm_loss ------------------------------------------------------------------

def mask_solution(tokens, generator):
    ordinary = tokens < N_ORDINARY
    chosen = (torch.rand(tokens.shape, generator=generator) < 0.15) & ordinary
    action = torch.rand(tokens.shape, generator=generator)
    random_tokens = torch.randint(0, N_ORDINARY, tokens.shape, generator=generator)
    inputs = torch.where(chosen & (action < 0.8), MASK, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, torch.where(chosen, tokens, IGNORE)


def mask_hf_style(tokens, generator):
    """Hugging Face's data collator: bernoulli draws, 80% masked, then half of the rest random."""
    labels = tokens.clone()
    chosen = torch.bernoulli(torch.full(tokens.shape, 0.15), generator=generator).bool()
    chosen &= tokens < N_ORDINARY
    labels[~chosen] = IGNORE
    inputs = tokens.clone()
    masked = torch.bernoulli(torch.full(tokens.shape, 0.8), generator=generator).bool() & chosen
    inputs[masked] = MASK
    randomised = torch.bernoulli(torch.full(tokens.shape, 0.5), generator=generator).bool() & chosen & ~masked
    inputs[randomised] = torch.randint(N_ORDINARY, tokens.shape, generator=generator)[randomised]
    return inputs, labels


def mask_multinomial(tokens, generator):
    chosen = (torch.rand(tokens.shape, generator=generator) < 0.15) & (tokens < N_ORDINARY)
    action = torch.multinomial(torch.tensor([0.8, 0.1, 0.1]), tokens.numel(), replacement=True,
                               generator=generator).view(tokens.shape)
    replacement = torch.randint(0, N_ORDINARY, tokens.shape, generator=generator)
    inputs = tokens.clone()
    inputs[chosen & (action == 0)] = MASK
    inputs[chosen & (action == 1)] = replacement[chosen & (action == 1)]
    targets = torch.full_like(tokens, IGNORE)
    targets[chosen] = tokens[chosen]
    return inputs, targets


@pytest.mark.parametrize("fn", [mask_solution, mask_hf_style, mask_multinomial], ids=lambda f: f.__name__)
def test_mask_tokens_correct_variants_pass(fn):
    nb09.check_mask_tokens(fn)
    nb09.check_mask_tokens(fn, seed=11)


def _mask(choose_specials=False, all_tokens=False, split=(0.8, 0.9), random_high=N_ORDINARY,
          targets_everywhere=False, p=0.15, global_rng=False, targets_are_inputs=False):
    def fn(tokens, generator):
        def rand(shape):
            return torch.rand(shape) if global_rng else torch.rand(shape, generator=generator)
        eligible = torch.ones_like(tokens, dtype=torch.bool) if choose_specials else tokens < N_ORDINARY
        chosen = (rand(tokens.shape) < p) & eligible
        action = rand(tokens.shape)
        random_tokens = torch.randint(0, random_high, tokens.shape, generator=generator)
        apply = torch.ones_like(chosen) if all_tokens else chosen
        inputs = torch.where(apply & (action < split[0]), MASK, tokens)
        inputs = torch.where(apply & (action >= split[0]) & (action < split[1]), random_tokens, inputs)
        targets = torch.where(chosen, inputs if targets_are_inputs else tokens, IGNORE)
        if targets_everywhere:
            targets = tokens.clone()
        return inputs, targets
    return fn


@pytest.mark.parametrize("fn, message", [
    (_mask(targets_everywhere=True), "Likely mistake: loss on every position"),
    (_mask(choose_specials=True), "Likely mistake: masking special tokens"),
    (_mask(all_tokens=True), "Likely mistake: 80/10/10 is applied to all tokens"),
    (_mask(split=(1.0, 1.0)), "Likely mistake: every chosen token is replaced by [MASK]"),
    (_mask(split=(0.8, 0.8)), "Likely mistake: the random branch is missing"),
    (_mask(split=(0.8, 0.82)), "Likely mistake: the random branch takes 10% of the remaining 20%"),
    (_mask(random_high=nb09.D_VOCAB), "Likely mistake: the random token is drawn from the whole vocabulary"),
    (_mask(p=0.85), "Likely mistake: the comparison is reversed"),
    (_mask(p=0.10), "expected 15%"),
    (_mask(global_rng=True), "generator"),
    (_mask(targets_are_inputs=True), "Likely mistake: the targets are the corrupted inputs"),
])
def test_mask_tokens_mistakes_are_named(fn, message):
    fails_with(nb09.check_mask_tokens, fn, expected=message)


def loss_solution(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def loss_by_hand(logits, targets):
    chosen = targets != IGNORE
    picked = logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return -(picked * chosen).sum() / chosen.sum()


def loss_boolean_index(logits, targets):
    chosen = targets != IGNORE
    return F.cross_entropy(logits[chosen], targets[chosen])


@pytest.mark.parametrize("fn", [loss_solution, loss_by_hand, loss_boolean_index], ids=lambda f: f.__name__)
def test_mlm_loss_correct_variants_pass(fn):
    nb09.check_mlm_loss(fn)
    nb09.check_mlm_loss(fn, seed=3, batch=2, seq=11)


def _picked(logits, targets):
    return logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0], targets != IGNORE


@pytest.mark.parametrize("fn, message", [
    (lambda l, t: -(lambda p, c: (p * c).sum() / c.numel())(*_picked(l, t)),
     "the loss is averaged over every position"),
    (lambda l, t: -_picked(l, t)[0].mean(), "loss on every position"),
    (lambda l, t: -(lambda p, c: ((p * c).sum(1) / c.sum(1)).mean())(*_picked(l, t)),
     "each sequence's mean is averaged"),
    (lambda l, t: F.cross_entropy(l.flatten(0, 1), t.flatten(), reduction="sum"), "a sum instead of a mean"),
    (lambda l, t: -(lambda p, c: (p * c).sum() / c.sum())(*_picked(l, t)) * -1, "the sign"),
])
def test_mlm_loss_mistakes_are_named(fn, message):
    fails_with(nb09.check_mlm_loss, fn, expected="Likely mistake: " + message)
