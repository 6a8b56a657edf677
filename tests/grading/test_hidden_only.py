"""A test cell's result says when an answer passed every visible check and failed a hidden one,
and carries the key of the mistake that failed it."""
import dataclasses

import torch
from torch import nn

from graders.exercises import nb01
from graders.harness.grading import judge_cell
from graders.judging.records import load_records
from graders.judging.session import Session, save_record
from graders.judging.verdict import LearnerCode

VISIBLE = "nb01.check_layernorm(LayerNorm)"
HIDDEN = "### BEGIN HIDDEN TESTS\nnb01.check_layernorm(LayerNorm, block=7)\n### END HIDDEN TESTS"


class LayerNorm(nn.Module):
    unbiased = False

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.var(-1, keepdim=True, unbiased=self.unbiased) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class SampleVariance(LayerNorm):
    unbiased = True


def judged(source: str, blocks: list[int], sample_variance_at: set[int], tmp_path):
    """The cell `source`, whose checks are 01's on `blocks` in order, judged on records where the
    checks at `sample_variance_at` saw the sample variance, the others a correct LayerNorm."""
    exercise = nb01.layernorm
    cases = [exercise.case(block=block) for block in blocks]
    checks = [(exercise.key, dataclasses.asdict(case)) for case in cases]
    for index, case in enumerate(cases):
        learner = SampleVariance if index in sample_variance_at else LayerNorm
        outputs, failure = exercise.run(learner, case, exercise.inputs(case))
        save_record(Session(records=tmp_path), f"cell/{index}", exercise.key, outputs, str(failure or ""))
    cell = {"source": source, "metadata": {"nbgrader": {"grade_id": "cell", "points": 5}}}
    return judge_cell(cell, checks, load_records(tmp_path), None, "", LearnerCode())


def test_failing_only_the_hidden_check_is_hidden_only_with_its_mistake_key(tmp_path):
    result = judged(f"{VISIBLE}\n{HIDDEN}", [0, 7], {1}, tmp_path)
    assert (result.status, result.hidden_only, result.mistake) == \
           ("failed", True, "01_layernorm/layernorm/sample_variance")
    assert "blocks.7.ln1" in result.message


def test_failing_the_visible_check_is_not_hidden_only_even_when_it_comes_after_the_hidden_one(tmp_path):
    result = judged(f"{HIDDEN}\n{VISIBLE}", [7, 0], {0, 1}, tmp_path)
    assert (result.status, result.hidden_only) == ("failed", False)
    assert "blocks.0.ln1" in result.message   # the visible check's verdict, judged first


def test_a_cell_without_visible_checks_has_no_hidden_only_failure(tmp_path):
    result = judged(HIDDEN.replace("block=7)", "block=7)\nnb01.check_layernorm(LayerNorm)"), [7, 0], {1}, tmp_path)
    assert (result.status, result.hidden_only) == ("failed", False)
