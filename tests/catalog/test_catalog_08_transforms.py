"""Notebook 08's greedy, temperature and frequency-penalty graders
(graders/exercises/nb08/transforms.py): correct variants pass, each catalogued mistake fails with its
diagnosis."""
import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference

from course_code import course_code_allowed
from catalog_helpers import fails_with, named_message
from catalog_08_shared import passes


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


# --- greedy -------------------------------------------------------------------------------------

def _greedy_loop(logits):
    return torch.tensor([max(range(len(row)), key=lambda t: row[t]) for row in logits.tolist()])


@pytest.mark.parametrize("fn", [lambda l: l.argmax(-1), lambda l: l.max(dim=-1).indices,
                                lambda l: l.topk(1, dim=-1).indices[:, 0], _greedy_loop])
def test_greedy_correct_variants_pass(fn):
    passes(nb08.check_greedy, fn)


@pytest.mark.parametrize("fn, message", [
    (lambda l: l.argmin(-1), "argmin instead of argmax"),
    (lambda l: l.argmax(0)[: l.shape[0]] if l.shape[0] > 1 else l.argmax(0),
     "Likely mistake: argmax over the batch dimension"),
    (lambda l: l.argmax(0), "Likely mistake: argmax over the batch dimension (dim=0)"),
    (lambda l: torch.max(l, 0).indices, "Likely mistake: argmax over the batch dimension (dim=0)"),
    (lambda l: l.argmax(-1, keepdim=True), "Likely mistake: keepdim=True"),
    (lambda l: l.topk(1).indices, "Likely mistake: keepdim=True (or topk's [batch, 1] indices)"),
    (lambda l: l.argmax(), "Likely mistake: argmax without dim"),
    (lambda l: l.max(-1).values, "return token ids (torch.long): the index of the largest logit"),
])
def test_greedy_mistakes_fail(fn, message):
    fails_with(nb08.check_greedy, fn, expected=message, first_line=True)


# --- temperature --------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda l, t: l / t, lambda l, t: l * (1.0 / t),
                                lambda l, t: torch.div(l, t) - l.max()])
def test_temperature_correct_variants_pass(fn):
    passes(nb08.check_temperature, fn)


def _in_place_temperature(l, t):
    l /= t
    return l


@pytest.mark.parametrize("fn, message", [
    (lambda l, t: l * t, "Likely mistake: multiplying by the temperature"),
    (lambda l, t: l.softmax(-1) / t, "Likely mistake: temperature applied after softmax"),
    (lambda l, t: l - t, "Likely mistake: the temperature is subtracted"),
    (_in_place_temperature, "in place"),
    (lambda l, t: (l / t).softmax(-1), "looks like probabilities"),
])
def test_temperature_mistakes_fail(fn, message):
    fails_with(nb08.check_temperature, fn, expected=message, first_line=True)


def test_a_named_temperature_mistake_ends_with_the_division():
    message = named_message(nb08.check_temperature, lambda l, t: l * t)
    assert message.endswith("\n  Show the fix: return logits / temperature"), message


# --- frequency penalty --------------------------------------------------------------------------

def _penalty_bincount(ids, logits, a):
    counts = torch.stack([torch.bincount(row, minlength=logits.shape[-1]) for row in ids])
    return logits - a * counts


def _penalty_one_hot(ids, logits, a):
    return logits - a * F.one_hot(ids, logits.shape[-1]).sum(1).float()


def _penalty_loop(ids, logits, a):
    out = logits.clone()
    for row in range(ids.shape[0]):
        for token in ids[row].tolist():
            out[row, token] -= a
    return out


@pytest.mark.parametrize("fn", [reference.apply_frequency_penalty, _penalty_bincount, _penalty_one_hot,
                                _penalty_loop])
def test_penalty_correct_variants_pass(fn):
    passes(nb08.check_frequency_penalty, fn)


def _presence(ids, logits, a):
    return logits - a * (F.one_hot(ids, logits.shape[-1]).sum(1) > 0).float()


def _whole_batch(ids, logits, a):
    return logits - a * torch.bincount(ids.flatten(), minlength=logits.shape[-1])


def _presence_loop(ids, logits, a):
    out = logits.clone()
    for row in range(ids.shape[0]):
        for token in set(ids[row].tolist()):
            out[row, token] -= a
    return out


def _penalty_in_place(ids, logits, a):
    logits -= a * F.one_hot(ids, logits.shape[-1]).sum(1)
    return logits


@pytest.mark.parametrize("fn, message", [
    (_presence, "Likely mistake: each token seen is penalised once"),
    (_whole_batch, "Likely mistake: tokens are counted over the whole batch"),
    (lambda ids, l, a: l + a * F.one_hot(ids, l.shape[-1]).sum(1), "Likely mistake: the penalty is added"),
    (lambda ids, l, a: l / (1 + a * F.one_hot(ids, l.shape[-1]).sum(1)), "Likely mistake: the logits are divided"),
    (_penalty_in_place, "in place"),
    (lambda ids, l, a: l - a * F.one_hot(ids[:, -1], l.shape[-1]),
     "Likely mistake: only the last token of each row is penalised"),
    (_presence_loop, "Likely mistake: each token seen is penalised once"),
    (lambda ids, l, a: l - a * (torch.bincount(ids.flatten(), minlength=l.shape[-1]) > 0),
     "a presence penalty over the whole batch"),
])
def test_penalty_mistakes_fail(fn, message):
    fails_with(nb08.check_frequency_penalty, fn, expected=message, first_line=True)
