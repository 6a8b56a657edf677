"""Notebook 12's graders read what the learner's code returns or leaves without trusting it
(graders/exercises/nb12/readers.py): an odd answer gets a message, not a crash in the graders."""
import pytest
import torch

from graders.exercises import nb12
from graders.judging.compare import CheckFailed
from catalog_helpers import fails_with
from test_catalog_12_adamw import _adamw
from test_catalog_12_checkpoint import _load, _save


# --- what the learner's code returns or leaves, read without trusting it ---------------

class _ById(torch.optim.Optimizer):
    """A right AdamW whose state is keyed by id(p): the int hashes like the tensor p."""
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            for p in (p for p in group["params"] if p.grad is not None):
                s = self.state[id(p)]
                if not s:
                    s.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                s["step"] += 1
                p.mul_(1 - lr * group["weight_decay"])
                s["exp_avg"].lerp_(p.grad, 1 - b1)
                s["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                v_hat = s["exp_avg_sq"] / (1 - b2 ** s["step"])
                p.addcdiv_(s["exp_avg"] / (1 - b1 ** s["step"]), v_hat.sqrt() + group["eps"], value=-lr)


def test_adamw_state_kept_by_id_is_named():
    fails_with(nb12.check_adamw, _ById, expected="Likely mistake: the state is kept by id(p)")


def _odd_state(make):
    """A right AdamW that leaves `make(state)` as its optimizer.state after each step."""
    class Odd(_adamw()):
        def _step(self):
            kept = getattr(self, "kept", None)
            self.state = kept if kept is not None else self.state
            super()._step()
            self.kept, self.state = self.state, make(self.state)
    return Odd


def _odd_groups(make):
    class Odd(_adamw()):
        def _step(self):
            super()._step()
            self.param_groups = make(self.param_groups)
    return Odd


def _saving_to(path_use):
    def save(path, model, optimizer, step, generator):
        _save(path, model, optimizer, step, generator)
        path_use(model, optimizer, generator)
    return save


def _returning(value):
    def load(path, model, optimizer, generator):
        _load(path, model, optimizer, generator)
        return value
    return load


_META = torch.empty((), device="meta")
_ODD = [   # (check, the learner's answer, what the message says)
    (nb12.check_cross_entropy, lambda x, t, i: None, "returned NoneType"),
    (nb12.check_cross_entropy, lambda x, t, i: "1.0", "returned str"),
    (nb12.check_cross_entropy, lambda x, t, i: torch.tensor(1 + 1j), "complex"),
    (nb12.check_cross_entropy, lambda x, t, i: _META, "tensor on meta"),
    (nb12.check_cross_entropy, lambda x, t, i: {"loss": 1.0}, "returned dict"),
    (nb12.check_adamw, _odd_state(lambda s: {str(id(p)): v for p, v in s.items()}), "keys of type str"),
    (nb12.check_adamw, _odd_state(lambda s: None), "optimizer.state is NoneType"),
    (nb12.check_adamw, _odd_state(lambda s: {p: [1, 2] for p in s}), "optimizer.state[p]['exp_avg'] is missing"),
    (nb12.check_adamw, _odd_state(lambda s: {p: {**v, "step": torch.ones(2)} for p, v in s.items()}),
     "state['step']"),
    (nb12.check_adamw, _odd_state(lambda s: {p: {**v, "exp_avg": v["exp_avg"].tolist()} for p, v in s.items()}),
     "optimizer.state[p]['exp_avg'] is missing"),
    (nb12.check_adamw, _odd_groups(lambda g: None), "param_groups is NoneType"),
    (nb12.check_adamw, _odd_groups(lambda g: g[:1]), "param_groups is a list of 1"),
    (nb12.check_clip_grad_norm, lambda ps, m: None, "returned None"),
    (nb12.check_clip_grad_norm, lambda ps, m: torch.ones(2), "tensor of shape [2]"),
    (nb12.check_clip_grad_norm, lambda ps, m: _META, "torch.float32 tensor of shape []"),
    (nb12.check_clip_grad_norm, lambda ps, m: torch.tensor(1j), "complex"),
    (nb12.check_training_state_bytes, lambda model, mixed: {torch.tensor(1): 1, "gradients": 2, "adam_moments": 3},
     "with the keys 'adam_moments', 'gradients', a Tensor"),
    (nb12.check_training_state_bytes, lambda model, mixed: {1: 1, 2: 2, 3: 3}, "a dict with the keys"),
    (nb12.check_training_state_bytes, lambda model, mixed: dict.fromkeys(["parameters", "gradients", "adam_moments"]),
     "is None; a number of bytes is an int"),
    (nb12.check_training_state_bytes,
     lambda model, mixed: dict.fromkeys(["parameters", "gradients", "adam_moments"], torch.tensor(2.5)),
     "torch.float32 tensor"),
    (nb12.check_saved_activation_bytes, lambda model, *inputs: None, "returned None"),
    (nb12.check_saved_activation_bytes, lambda model, *inputs: _META, "a number of bytes"),
    (nb12.check_saved_activation_bytes, lambda model, *inputs: [1], "returned [1]"),
    (nb12.check_checkpoints, (_save, _returning(None)), "load_checkpoint returned None"),
    (nb12.check_checkpoints, (_save, _returning(torch.tensor([5, 5]))), "tensor of shape [2]"),
    (nb12.check_checkpoints, (_save, _returning(_META)), "load_checkpoint returned"),
    (nb12.check_checkpoints, (_save, _returning("5")), "load_checkpoint returned '5'"),
    (nb12.check_checkpoints, (_saving_to(lambda model, optimizer, generator: setattr(optimizer, "state", None)), _load),
     "After save_checkpoint, the training loop cannot go on"),
]


@pytest.mark.parametrize("check, answer, expected", _ODD)
def test_odd_answers_get_a_message_not_a_crash_in_the_graders(check, answer, expected):
    """Whatever the learner's code returns or leaves behind, the check fails with a CheckFailed
    (what is wrong, how to fix it): no exception escapes from the course's code."""
    with pytest.raises(CheckFailed) as failure:
        check(*(answer if isinstance(answer, tuple) else (answer,)))
    assert expected in str(failure.value), str(failure.value)


def test_an_extra_tensor_key_in_the_state_is_read_past():
    """A tensor key inside a parameter's state (compared with "exp_avg", it would raise) is skipped."""
    nb12.check_adamw(_odd_state(lambda s: {p: {torch.ones(2): 1, **v} for p, v in s.items()}))
