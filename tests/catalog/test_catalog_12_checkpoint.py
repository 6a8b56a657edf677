"""Notebook 12's checkpoint grader (graders/exercises/nb12/checkpoint.py): correct variants (in other
styles) pass, each catalogued mistake fails with its name, and a load that reads what save kept in
memory is named."""
import functools

import nbformat
import pytest
import torch

from graders.exercises import nb12
from graders.layout import SOLUTIONS
from catalog_helpers import fails_with


# --- checkpoints -------------------------------------------------------------------------------

def _save(path, model, optimizer, step, generator, *, optimizer_state=True, data_rng=True, torch_rng=True):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer_state else None,
                "step": step, "generator": generator.get_state() if data_rng else None,
                "rng": torch.get_rng_state() if torch_rng else None}, path)


def _load(path, model, optimizer, generator, *, optimizer_state=True, data_rng=True, torch_rng=True, train=True,
          step=True, weights=True, swapped=False):
    saved = torch.load(path)
    if swapped:
        saved["generator"], saved["rng"] = saved["rng"], saved["generator"]
    if weights:
        model.load_state_dict(saved["model"])
    if optimizer_state:
        optimizer.load_state_dict(saved["optimizer"])
    if data_rng:
        generator.set_state(saved["generator"])
    if torch_rng:
        torch.set_rng_state(saved["rng"])
    if train:
        model.train()
    if step in ("+1", "-1"):
        return saved["step"] + int(step)
    return saved["step"] if step is True else step      # step=0: not restored; step=5: always 5


def _pair(**mistake):
    saving = {k: v for k, v in mistake.items() if k in ("optimizer_state", "data_rng", "torch_rng")}
    return functools.partial(_save, **saving), functools.partial(_load, **mistake)


def test_checkpoints_correct_variants_pass():
    def save_parts(path, model, optimizer, step, generator):     # another style: the training flag saved
        torch.save([model.state_dict(), optimizer.state_dict(), step, generator.get_state(),
                    torch.random.get_rng_state(), True], path)

    def load_parts(path, model, optimizer, generator):
        weights, opt, step, data, rng, training = torch.load(path, weights_only=True)
        model.load_state_dict(weights)
        optimizer.load_state_dict(opt)
        generator.set_state(data)
        torch.random.set_rng_state(rng)
        model.train(training)
        return step
    for save, load in (_pair(), (save_parts, load_parts)):
        nb12.check_checkpoints(save, load)
    nb12.check_checkpoints(*_pair(), seed=2)


def test_the_step_load_checkpoint_returns_may_be_an_int_or_a_tensor_as_the_text_says():
    save, load = _pair()
    nb12.check_checkpoints(save, lambda *args: torch.tensor(load(*args)))
    posed = "\n".join(c.source for c in nbformat.read(SOLUTIONS / "12_training_step.ipynb", as_version=4).cells
                      if c.cell_type == "markdown")
    assert "returns the step to resume from: the next step to run" in posed
    assert "a one-element integer tensor" in posed and "or a\n  one-element tensor, as `torch.optim.AdamW`" in posed


@pytest.mark.parametrize("mistake, expected", [
    (dict(optimizer_state=False), "Likely mistake: the optimizer's state is not restored"),
    (dict(data_rng=False), "Likely mistake: the data generator is not restored"),
    (dict(step=0), "Likely mistake: the step is not restored, so the schedule restarts"),
    (dict(train=False), "Likely mistake: the model is left in eval mode after loading"),
    (dict(torch_rng=False), "Likely mistake: torch's global random generator is not restored"),
    (dict(weights=False), "Likely mistake: the model's weights are not restored"),
    (dict(step="+1"), "Likely mistake: the step is off by one"),
    (dict(step="-1"), "Likely mistake: the step is off by one"),
    (dict(swapped=True), "Likely mistake: the two generators' states are swapped"),
])
def test_checkpoint_mistakes_are_named(mistake, expected):
    fails_with(nb12.check_checkpoints, *_pair(**mistake), expected=expected)


def test_a_load_that_returns_a_fixed_step_fails_the_hidden_case():
    nb12.check_checkpoints(*_pair(step=5))
    fails_with(nb12.check_checkpoints, *_pair(step=5), seed=2,
               expected="Likely mistake: the step is not the one saved")


# --- a checkpoint that keeps references -------------------------------------------------

_IN_MEMORY = {}


def _save_references(path, model, optimizer, step, generator):
    _IN_MEMORY.update(model=model.state_dict(), optimizer=optimizer.state_dict(), step=step,
                      generator=generator.get_state(), rng=torch.get_rng_state())
    torch.save({"step": step}, path)


def _load_references(path, model, optimizer, generator):
    model.load_state_dict(_IN_MEMORY["model"])
    optimizer.load_state_dict(_IN_MEMORY["optimizer"])
    generator.set_state(_IN_MEMORY["generator"])
    torch.set_rng_state(_IN_MEMORY["rng"])
    model.train()
    return _IN_MEMORY["step"]


def _save_optimizer_object(path, model, optimizer, step, generator):
    _save(path, model, optimizer, step, generator)
    _IN_MEMORY["optimizer_object"] = optimizer


def _load_optimizer_from_memory(path, model, optimizer, generator):
    step = _load(path, model, optimizer, generator)
    optimizer.load_state_dict(_IN_MEMORY["optimizer_object"].state_dict())
    return step


@pytest.mark.parametrize("save, load", [(_save_references, _load_references),
                                        (_save_optimizer_object, _load_optimizer_from_memory)])
def test_a_load_that_reads_what_save_kept_in_memory_is_named(save, load):
    fails_with(nb12.check_checkpoints, save, load,
               expected="Likely mistake: load reads the objects that save kept in memory")
