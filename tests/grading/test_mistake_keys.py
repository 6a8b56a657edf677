"""A recognised mistake's verdict carries its key, separate from its words: the key is what a
class's results count it by, and it does not change with the message."""
import pytest
import torch
from torch import nn

from graders.exercises import nb01
from graders.judging.compare import CheckFailed, Mistake, compare
from graders.judging.verdict import LearnerCode, decide


class SampleVariance(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.var(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def test_a_mistake_is_its_description_everywhere_but_carries_a_key():
    named = Mistake("sample_variance", "sample variance")
    assert named == "sample variance" and hash(named) == hash("sample variance")
    assert {named: 1}["sample variance"] == 1 and f"{named}" == "sample variance"
    assert named.key == "sample_variance"


def test_compare_raises_the_key_of_the_mistake_it_names_and_none_for_a_plain_description():
    expected, wrong = torch.zeros(3), torch.ones(3)
    for description, key in ((Mistake("all_ones", "every value is one"), "all_ones"), ("every value is one", None)):
        with pytest.raises(CheckFailed) as failed:
            compare("x", wrong, expected, ("i",), mistakes={description: wrong})
        assert "Likely mistake: every value is one" in str(failed.value) and failed.value.mistake == key


def test_the_verdict_on_the_sample_variance_names_its_key_and_keeps_its_words():
    exercise = nb01.layernorm
    case = exercise.case()
    outputs, failure = exercise.run(SampleVariance, case, exercise.inputs(case))
    verdict = decide(exercise, case, outputs, str(failure or ""), LearnerCode())
    assert not verdict.passed and verdict.mistake == "01_layernorm/layernorm/sample_variance"
    assert verdict.message.startswith("LayerNorm output (blocks.0.ln1) does not match the reference. "
                                      "Likely mistake: sample variance: it divides by d_model - 1")
    assert "sample_variance" not in verdict.message


def one_token_too_few(logits, top_p):
    """The example class's top-p: the token that takes the total past top_p is removed too."""
    if top_p >= 1.0:
        return logits.clone()
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    remove_sorted = sorted_logits.double().softmax(dim=-1).cumsum(dim=-1) >= top_p
    remove_sorted[..., 0] = False
    return logits.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))


def _attention_scaled_by_d_model():
    from test_catalog_03 import ATTN_BUGS

    return next(learner for name, learner, _, _ in ATTN_BUGS if name == "sqrt_d_model")


@pytest.mark.parametrize("check, learner, key", [
    ("nb03.check_attention", _attention_scaled_by_d_model, "03_attention/attention/scaled_by_d_model"),
    ("nb08.check_top_p", lambda: one_token_too_few, "08_sampling/apply_top_p/one_too_few"),
], ids=["a message rewritten after compare", "a mistake found among kept tokens"])
def test_a_key_survives_the_checks_that_reword_a_failure(check, learner, key):
    import importlib

    module, function = check.split(".")
    exercise = getattr(importlib.import_module(f"graders.exercises.{module}"), function).exercise
    case = exercise.case()
    outputs, failure = exercise.run(learner(), case, exercise.inputs(case))
    verdict = decide(exercise, case, outputs, str(failure or ""), LearnerCode())
    assert not verdict.passed and verdict.mistake == key, verdict.message


def _crashes_with_a_likely_cause(learner, case, inputs):
    raise CheckFailed("f crashed on x of shape [2, 3]. Likely mistake: the mask has a fixed size",
                      mistake="fixed_size_mask")


def test_a_failure_while_the_learners_code_runs_keeps_its_key_through_the_record(tmp_path, monkeypatch):
    """A mistake recognised in the kernel, while the learner's code runs (a crash with a likely
    cause), reaches the graded verdict through the check's record; a key that is not one word of
    lower-case letters, digits and underscores (a kernel writes it) is no key."""
    from types import SimpleNamespace

    from graders.harness import grading
    from graders.judging.cases import Case
    from graders.judging.records import load_records
    from graders.judging.session import Session, save_record

    # an exercise as decide reads it, not registered among the course's
    exercise = SimpleNamespace(notebook="98_keys", name="f", key=("98_keys", "f"), forbidden=(),
                               judge=lambda case, outputs: None)
    monkeypatch.setattr(grading, "find", {exercise.key: exercise}.__getitem__)
    with pytest.raises(CheckFailed) as raised:
        _crashes_with_a_likely_cause(None, Case(), {})
    failure = raised.value
    shown = decide(exercise, Case(), None, str(failure), LearnerCode(), failure.mistake)
    assert shown.mistake == "98_keys/f/fixed_size_mask"
    cell = {"metadata": {"nbgrader": {"grade_id": "f_test", "points": 1}}}
    for written, graded_as in ((failure.mistake, shown.mistake), ("../../x y", None), (["list"], None)):
        records = tmp_path / str(len(list(tmp_path.iterdir())))
        records.mkdir()
        save_record(Session(records=records), "f_test/0", exercise.key, None, str(failure), written)
        graded = grading.judge_cell(cell, [(exercise.key, {})], load_records(records), None, "", LearnerCode())
        assert (graded.status, graded.mistake, graded.message) == ("failed", graded_as, str(failure))
