"""Notebook 12's library versions are refused: library code captured before a check, library routines at
the level they run, and a learner's code that switches the check's watch off."""
import queue
import threading

import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb12
from catalog_helpers import fails_with
from test_catalog_12_adamw import _adamw
from test_catalog_12_clipping import _clip
from test_catalog_12_loss import _loss


# --- library code reached past the tripwires and the word scan (Forbidden.library_code) ---------

_CAPTURED = {"loss": getattr(F, "cross" + "_entropy"), "optimizer": getattr(torch.optim, "Ad" + "amW"),
             "clip": getattr(torch.nn.utils, "clip_grad" + "_norm_")}


def test_library_code_captured_before_the_check_is_refused_and_named():
    def cross_entropy(logits, targets, ignore_index=-100):
        return _CAPTURED["loss"](logits.float().flatten(0, 1), targets.flatten(), ignore_index=ignore_index)

    class AdamW(_adamw()):
        def step(self, closure=None):
            if not hasattr(self, "inner"):
                self.inner = _CAPTURED["optimizer"](self.param_groups)
                self.state = self.inner.state
            return self.inner.step()

    def clip_grad_norm(parameters, max_norm):
        return _CAPTURED["clip"](parameters, max_norm)
    fails_with(nb12.check_cross_entropy, cross_entropy, expected="a library version of the cross-entropy")
    fails_with(nb12.check_adamw, AdamW, expected="a library version of AdamW")
    fails_with(nb12.check_clip_grad_norm, clip_grad_norm, expected="a library version of clipping by the global norm")


# --- library routines refused at the level they run ------------------------

def _first_logit(x, t):
    return x.gather(-1, t.clamp(min=0)[..., None])[..., 0]


_aten, _nn = torch.ops.aten, torch._C._nn
_lse = getattr(_aten, "logsum" + "exp")                                  # past the word scan
_special_log_softmax = getattr(torch.special, "log_" + "softmax")        # taken before the tripwires


@pytest.mark.parametrize("body, name", [
    (lambda x, t, i: -(_aten._log_softmax(x.float(), -1, False).gather(-1, t.clamp(min=0)[..., None])[..., 0])
     [t != i].mean(), "aten::_log_softmax"),
    (lambda x, t, i: _nn.cross_entropy_loss(x.float().flatten(0, 1), t.flatten(), None, 1, i, 0.0),
     "aten::cross_entropy_loss"),   # the outermost refused kernel: the one a grading kernel's dispatcher refuses
    (lambda x, t, i: (_lse(x.float(), [-1]) - _first_logit(x.float(), t))[t != i].mean(),
     "aten::logsumexp"),
    (lambda x, t, i: -_special_log_softmax(x.float(), -1).gather(
        -1, t.clamp(min=0)[..., None])[..., 0][t != i].mean(), "aten::log" "_softmax"),   # not the word itself
    (lambda x, t, i: -(x.float().softmax(-1).gather(-1, t.clamp(min=0)[..., None])[..., 0].log())[t != i].mean(),
     "aten::softmax"),
    (lambda x, t, i: _aten.nll_loss_forward(x.float().flatten(0, 1) - x.float().flatten(0, 1).amax(-1, keepdim=True),
                                            t.flatten(), None, 1, i)[0], "aten::nll_loss_forward"),
])
def test_cross_entropy_library_kernels_are_refused_however_reached(body, name):
    fails_with(nb12.check_cross_entropy, body, expected=[name, "torch's own kernel for part of the cross-entropy"])


def _copy_of(module: str, package: str) -> dict:
    """torch's own source of `module`, compiled again under another name (as a learner could paste it)."""
    import importlib.util

    origin = importlib.util.find_spec(module).origin
    namespace = {"__name__": "pasted", "__package__": package}
    exec(compile(open(origin).read(), "<pasted>", "exec"), namespace)
    return namespace


def test_adamw_library_kernels_and_copies_are_refused():
    class Fused(_adamw()):
        def _step(self):
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                for p in params:
                    self.state[p] or self.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                                                          exp_avg_sq=torch.zeros_like(p))
                states = [self.state[p] for p in params]
                _aten._fused_adamw_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                                    [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
                                    lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                                    weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False,
                                    maximize=False)

    class Foreach(_adamw()):
        def _step(self):
            super()._step()
            torch._foreach_mul_([p for group in self.param_groups for p in group["params"]], 1.0)

    pasted = _copy_of("torch.optim.adam", "torch.optim")

    class Pasted(pasted["Adam"]):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             decoupled_weight_decay=True)
    fails_with(nb12.check_adamw, Fused, expected=["aten::_fused_adamw_", "torch's fused AdamW step"])
    fails_with(nb12.check_adamw, Foreach, expected="aten::_foreach_mul_")
    fails_with(nb12.check_adamw, Pasted, expected=["torch.optim.adam.", "compiled from a copy of its source"])


def test_a_library_kernel_on_a_thread_started_before_the_check_is_refused():
    """The norms computed by torch's multi-tensor kernel on a worker thread that waits on a queue:
    the dispatch mode sees its own thread only, torch's profiler every thread."""
    requests, replies = queue.Queue(), queue.Queue()

    def worker():
        while (grads := requests.get()) is not None:
            replies.put(torch._foreach_norm(grads))
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    def clip_grad_norm(parameters, max_norm):
        params = [p for p in parameters if p.grad is not None]
        requests.put([p.grad for p in params])
        total = torch.stack(replies.get()).norm()
        for p in params:
            p.grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total
    try:
        fails_with(nb12.check_clip_grad_norm, clip_grad_norm, expected=["aten::_foreach_norm", "on another thread"])
    finally:
        requests.put(None)
        thread.join()


def test_clipping_library_kernels_and_copies_are_refused():
    pasted = _copy_of("torch.nn.utils.clip" + "_grad", "torch.nn.utils")

    def clip_grad_norm(parameters, max_norm):
        return pasted["clip_grad" + "_norm_"](parameters, max_norm)
    fails_with(nb12.check_clip_grad_norm, _clip("foreach"), expected="aten::_foreach_norm")
    fails_with(nb12.check_clip_grad_norm, clip_grad_norm,
               expected=["torch.nn.utils.clip_grad.", "compiled from a copy of its source"])


def test_switching_the_watch_off_is_refused():
    from torch.utils import _python_dispatch

    def hidden(logits, targets, ignore_index=-100):
        with _python_dispatch._disable_current_modes():
            log_probs = _aten._log_softmax(logits.float(), -1, False)
        return -(_first_logit(log_probs, targets))[targets != ignore_index].mean()

    def popped(logits, targets, ignore_index=-100):
        _python_dispatch._pop_mode()
        return _loss()(logits, targets, ignore_index)
    fails_with(nb12.check_cross_entropy, hidden, expected=["switched off the check's watch", "_disable_current_modes"])
    fails_with(nb12.check_cross_entropy, popped, expected=["switched off the check's watch", "_pop_mode"])
