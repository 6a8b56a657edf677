"""`Forbidden.library_code`: the library code that computes an exercise's answer (torch's AdamW,
F.cross_entropy, tiktoken) fails a check when any of it runs while the learner's code runs,
however it was reached, and the refusal names it; other code of the same library may run."""
import torch
import torch.nn.functional as F

from graders.integrity import provenance
from graders.judging.learner import Forbidden

ADAMW = Forbidden("AdamW", library_code=("torch.optim.adamw", "torch.optim.adam"))
LOSS = Forbidden("the cross-entropy", library_code=("torch.nn.functional:cross_entropy",))


def _refusal(run, forbidden) -> str | None:
    with provenance.Watch() as watch:
        run()
    return watch.library_answer("check", (forbidden,))


def _step(optimizer_class):
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = optimizer_class([parameter], lr=0.1)
    parameter.grad = torch.ones(3)
    optimizer.step()


def test_a_subclass_of_the_library_optimizer_is_refused_and_named():
    class AdamW(torch.optim.AdamW):
        pass

    refusal = _refusal(lambda: _step(AdamW), ADAMW)
    assert refusal is not None and "torch.optim.ada" in refusal and "library version of AdamW" in refusal


def test_an_own_optimizer_on_torch_optimizer_passes():
    class SGD(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    p -= group["lr"] * p.grad

    assert _refusal(lambda: _step(SGD), ADAMW) is None


def test_one_function_of_a_module_is_refused_and_its_neighbours_run():
    logits, targets = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    refusal = _refusal(lambda: F.cross_entropy(logits, targets), LOSS)
    assert refusal is not None and "cross_entropy from torch.nn.functional" in refusal
    assert _refusal(lambda: F.log_softmax(logits, -1).mean(), LOSS) is None


def test_a_library_that_is_not_installed_refuses_nothing():
    absent = Forbidden("nothing", library_code=("no_such_library_anywhere",))
    assert _refusal(lambda: _step(torch.optim.AdamW), absent) is None


def test_compiled_library_code_is_seen_when_the_check_profiles_compiled_calls():
    import math

    compiled = Forbidden("the factorial", library_code=("math:factorial",))
    with provenance.Watch(builtins=True) as watch:
        math.factorial(5)
    assert "your check calls factorial, compiled code" in watch.library_answer("check", (compiled,))
    with provenance.Watch(builtins=True) as watch:
        math.comb(5, 2)
    assert watch.library_answer("check", (compiled,)) is None
