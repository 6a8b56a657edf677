"""Notebook 09's train_mlm grader (graders/exercises/nb09/training.py): correct variants (in other
styles) pass, each catalogued mistake fails with its name."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb09
from graders.judging.compare import CheckFailed

from catalog_helpers import fails_with
from test_catalog_09_mlm import loss_solution, mask_solution

N_ORDINARY, MASK, IGNORE = nb09.N_ORDINARY, nb09.MASK, nb09.IGNORE


# --- 6. train_mlm (each run trains a model: ~5 s on one idle core) -------------------------------

def train_solution(model, make_batch, n_steps, lr, generator):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(n_steps):
        tokens, token_types = make_batch()
        inputs, targets = mask_solution(tokens, generator)
        loss = loss_solution(model(inputs, token_types), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_unmasked(model, make_batch, n_steps, lr, generator):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(n_steps):
        tokens, token_types = make_batch()
        _, targets = mask_solution(tokens, generator)
        loss = loss_solution(model(tokens, token_types), targets)   # the model sees the answers
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_one_batch_too_many(model, make_batch, n_steps, lr, generator):
    make_batch()
    return train_solution(model, make_batch, n_steps, lr, generator)


def test_mlm_training_solution_passes_its_bar():
    nb09.check_mlm_training(train_solution)


@pytest.mark.parametrize("fn, message", [
    (train_unmasked, "Likely mistake: the model is trained on unmasked tokens"),
    (train_one_batch_too_many, "draw exactly one per step"),
], ids=["unmasked", "extra_batch"])
def test_mlm_training_mistakes_are_named(fn, message):
    fails_with(nb09.check_mlm_training, fn, expected=message)


WRONG_MLM_PARTS = """
def mask_tokens(tokens, generator):             # nothing chosen: nothing to learn
    return tokens.clone(), torch.full_like(tokens, IGNORE)


def mlm_loss(logits, targets):                  # no ignore_index: scores every position
    return F.cross_entropy(logits.flatten(0, 1), targets.clamp(min=0).flatten())
"""


def test_a_wrong_mask_or_loss_costs_only_its_own_check():
    """A notebook whose mask_tokens and mlm_loss are wrong and whose train_mlm is right: each part
    fails its own check, and train_mlm passes its, which runs the course's parts under the
    notebook's names (09 charged them to the training run as well), and gives the
    learner's back afterwards."""
    from graders.course.example_class import solution_answers

    notebook = {"torch": torch, "F": F, "nn": nn, "IGNORE": IGNORE}
    exec(WRONG_MLM_PARTS + solution_answers("09_transformer_family")["train_answer"], notebook)
    parts = {name: notebook[name] for name in ("mask_tokens", "mlm_loss")}
    for check, name in ((nb09.check_mask_tokens, "mask_tokens"), (nb09.check_mlm_loss, "mlm_loss")):
        with pytest.raises(CheckFailed):
            check(parts[name])
    nb09.check_mlm_training(notebook["train_mlm"])
    assert all(notebook[name] is part for name, part in parts.items())
