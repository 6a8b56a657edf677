"""The tripwires a check lays on library functions (Forbidden.targets) leave every class as it
was, also when a target is inherited and its base is a target too (torch's AdamW.step is Adam's)."""
import pytest
import torch

from graders.judging.learner import Forbidden, LibraryUsed, _tripwires


def test_an_inherited_target_is_tripwired_while_the_check_runs_and_restored_after():
    forbidden = Forbidden("AdamW", targets=[(torch.optim.Adam, "step"), (torch.optim.AdamW, "step")])
    before = {klass: dict(vars(klass)) for klass in (torch.optim.Adam, torch.optim.AdamW)}
    parameter = torch.nn.Parameter(torch.ones(2))
    parameter.grad = torch.ones(2)
    with _tripwires(forbidden), pytest.raises(LibraryUsed):
        torch.optim.AdamW([parameter]).step()
    assert {klass: dict(vars(klass)) for klass in before} == before
    torch.optim.AdamW([parameter]).step()   # the real step again
