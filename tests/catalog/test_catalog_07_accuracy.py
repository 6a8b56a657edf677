"""Training grader (07), per_position_accuracy (graders/exercises/nb07/accuracy.py): catalogued mistakes
fail with their diagnosis; correct variants pass. Like every 07 catalog, it runs in xdist group nb07, on
one worker: the grader's data and models are built once per worker."""
import pytest
import torch

from graders.exercises import nb07
from graders.judging.compare import CheckFailed

pytestmark = pytest.mark.xdist_group("nb07")


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
