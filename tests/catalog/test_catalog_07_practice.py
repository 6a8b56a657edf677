"""Training grader (07), optimizer_groups and lr_at (graders/exercises/nb07/practice.py): catalogued
mistakes fail with their diagnosis; correct variants pass. Like every 07 catalog, it runs in xdist group
nb07, on one worker: the grader's data and models are built once per worker."""
import math

import pytest
import torch

from graders.exercises import nb07
from catalog_helpers import fails_with

pytestmark = pytest.mark.xdist_group("nb07")


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
