"""Notebook 12 as a whole: an answer of the wrong kind gets one line, an untouched exercise is answered
at once, and the setup cell says what it does before it imports."""
import pytest
import torch

from graders.exercises import nb12
from catalog_helpers import fails_with

@pytest.mark.parametrize("check, learner, expected", [
    (nb12.check_cross_entropy, (None,), "cross_entropy: expected your function"),
    (nb12.check_adamw, (torch.nn.Linear,), "a subclass of torch.optim.Optimizer"),
    (nb12.check_clip_grad_norm, (3,), "clip_grad_norm: expected your function"),
    (nb12.check_training_state_bytes, (lambda model, mixed: 7,), "return a dict with the keys"),
    (nb12.check_saved_activation_bytes, (lambda model, *inputs: 1.5,), "a number of bytes, a Python int"),
    (nb12.check_checkpoints, (None, None), "save_checkpoint: expected your function"),
    (nb12.check_checkpoints, (lambda *args: None, lambda *args: None), "wrote no file at path"),
])
def test_answers_of_the_wrong_kind_get_one_line(check, learner, expected):
    fails_with(check, *learner, expected=expected)


# --- an untouched exercise is answered at once -------------------------------

def test_untouched_exercises_are_answered_before_any_reference_is_built(monkeypatch):
    """The stubs' checks say "not written yet" without building a reference (those take seconds):
    every reference builder of 12's checks raises here, and no check reaches one."""
    from graders.exercises.nb12 import adamw, checkpoint, clipping, loss, memory

    def built(*args, **kwargs):
        raise AssertionError("a reference was built for an untouched exercise")
    for module, name in ((loss, "expected_loss"), (loss, "loss_mistakes"), (adamw, "torch_trajectory"),
                         (adamw, "adamw_mistakes"), (clipping, "expected"), (memory, "measured_state"),
                         (memory, "saved_records"), (checkpoint, "uninterrupted")):
        monkeypatch.setattr(module, name, built)

    def stub(*args, **kwargs):
        raise NotImplementedError

    class AdamW(torch.optim.Optimizer):     # the notebook's given __init__, step still the stub
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self, closure=None):
            raise NotImplementedError
    for check, answer in ((nb12.check_cross_entropy, (stub,)), (nb12.check_adamw, (AdamW,)),
                          (nb12.check_clip_grad_norm, (stub,)), (nb12.check_training_state_bytes, (stub,)),
                          (nb12.check_saved_activation_bytes, (stub,)), (nb12.check_checkpoints, (stub, stub))):
        fails_with(check, *answer, expected="not written yet")


def test_the_setup_cell_says_what_it_does_before_it_imports():
    """Its imports take seconds: a line says what is happening first, and another when it is done."""
    import ast
    import json

    cells = json.load(open("solutions/12_training_step.ipynb"))["cells"]
    setup = next(c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == "setup")
    body = ast.parse("".join(setup["source"])).body
    first_slow = next(i for i, node in enumerate(body) if isinstance(node, (ast.Import, ast.ImportFrom))
                      and node.names[0].name != "time")
    printed = [i for i, node in enumerate(body) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", "") == "print"]
    assert printed and printed[0] < first_slow and printed[-1] == len(body) - 1
