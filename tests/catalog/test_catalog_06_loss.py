"""GPT-2 grader (06): next-token loss mistakes are named; correct variants pass."""
import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb06
from graders.judging.compare import CheckFailed


# --- next-token loss ------------------------------------------------------------------------

def gather(logits, tokens):
    lp = logits.log_softmax(-1)[:, :-1]
    return -lp.gather(-1, tokens[:, 1:, None]).mean()


def cross_entropy(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def indexing(logits, tokens):
    lp = logits.log_softmax(-1)
    b, p = torch.meshgrid(torch.arange(tokens.shape[0]), torch.arange(tokens.shape[1] - 1), indexing="ij")
    return -lp[b, p, tokens[:, 1:]].mean()


def cross_entropy_vocabulary_second(logits, tokens):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:])


@pytest.mark.parametrize("fn", [gather, cross_entropy, indexing, cross_entropy_vocabulary_second],
                         ids=lambda f: f.__name__)
def test_correct_loss_passes(fn):
    nb06.check_loss(fn)
    nb06.check_loss(fn, text=None, seed=2, batch=2)


def no_shift(logits, tokens):
    return -logits.log_softmax(-1).gather(-1, tokens[..., None]).mean()


def wrong_shift(logits, tokens):
    return -logits.log_softmax(-1)[:, 1:].gather(-1, tokens[:, :-1, None]).mean()


def positive(logits, tokens):
    return -gather(logits, tokens)


def summed(logits, tokens):
    return -logits.log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).sum()


def raw_logits(logits, tokens):
    return -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


def probabilities(logits, tokens):
    return -logits.softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


def per_position(logits, tokens):
    return -logits.log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]


LOSS_BUGGY = [
    (no_shift, "Likely mistake: the loss is not shifted"),
    (wrong_shift, "Likely mistake: shifted the wrong way"),
    (positive, "Likely mistake: the minus sign is missing"),
    (summed, "Likely mistake: the losses are summed instead of averaged"),
    (raw_logits, "Likely mistake: raw logits are used instead of log-probabilities"),
    (probabilities, "Likely mistake: probabilities"),
    (per_position, "Likely mistake: one loss per position"),
]


@pytest.mark.parametrize("fn, diagnosis", LOSS_BUGGY, ids=lambda v: getattr(v, "__name__", None))
def test_buggy_loss_is_named(fn, diagnosis):
    with pytest.raises(CheckFailed) as failure:
        nb06.check_loss(fn)
    assert diagnosis in str(failure.value).splitlines()[0], str(failure.value)


def cross_entropy_vocabulary_last(logits, tokens):
    return F.cross_entropy(logits[:, :-1], tokens[:, 1:])


def cross_entropy_vocabulary_last_unshifted(logits, tokens):
    return F.cross_entropy(logits, tokens)


def cross_entropy_targets_not_flattened(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:])


@pytest.mark.parametrize("fn, diagnosis", [
    (cross_entropy_vocabulary_last, "reads the class scores from the second axis"),
    (cross_entropy_vocabulary_last_unshifted, "and the loss is not shifted"),
    (cross_entropy_targets_not_flattened, "the logits are flattened to [batch*position, d_vocab] but the targets"),
], ids=lambda v: getattr(v, "__name__", None))
def test_a_cross_entropy_call_that_crashes_is_named_and_ends_with_the_fix(fn, diagnosis):
    """torch's own words ("Expected target size ...") stay, after the mistake in the course's
    words; the corrected call is the message's last line."""
    with pytest.raises(CheckFailed) as failure:
        nb06.check_loss(fn)
    lines = str(failure.value).splitlines()
    assert "Likely mistake:" in lines[0] and diagnosis in lines[0], str(failure.value)
    assert lines[-1] == "  Show the fix: F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())"


def test_a_crash_no_listed_call_reproduces_is_not_named():
    def wrong_targets(logits, tokens):
        return F.cross_entropy(logits[:, :-1], tokens[:, 1:].flatten())

    with pytest.raises(CheckFailed) as failure:
        nb06.check_loss(wrong_targets)
    assert "Likely mistake" not in str(failure.value) and "Show the fix" not in str(failure.value)
