"""The learner's optimizer.state, read as torch.optim.Optimizer keeps it (a dict from each parameter
tensor to a dict of its state under torch's names) without trusting it: a state keyed otherwise,
or holding other things, is read as missing and said what it is, never looked up in a way that
raises in the course's code."""
from __future__ import annotations

import torch

from graders.exercises.nb12.readers import items_of, real_number, real_tensor
from graders.judging.compare import Mistake
from graders.judging.learner import recorded_text

STATE = ("exp_avg", "exp_avg_sq")
KEYED_BY_PARAMETERS = "parameters"     # what optimizer.state's keys should be


def state_by_parameter(optimizer, params: list) -> tuple[dict, str]:
    """The learner's optimizer.state read without looking anything up in it: a key that is not the
    parameter itself (id(p), an int, hashes like p) would be compared with a tensor, which raises.
    {id(p): p's state} for the tensor keys, and what the keys are when none is a tensor: "ids"
    (id(p) of the parameters), another type's name, or what optimizer.state is instead of a dict."""
    state = getattr(optimizer, "state", None)
    items = items_of(state)
    if items is None:
        return {}, f"optimizer.state is {type(state).__name__}, not a dict"
    found = {id(key): value for key, value in items if isinstance(key, torch.Tensor)}
    others = [key for key, _ in items if not isinstance(key, torch.Tensor)]
    if found or not others:
        return found, ""
    ids = {id(p) for _, p in params}
    if all(type(key) is int and key in ids for key in others):
        return dict(items), "ids"
    return {}, f"keys of type {type(others[0]).__name__}"


def state_numbers(states: dict, p: torch.Tensor, key: str) -> torch.Tensor:
    """p's state[key] as float32 numbers (p's size for the moments, one for the step), NaN where it
    is missing or of another kind."""
    size = p.numel() if key in STATE else 1
    entries = items_of(states.get(id(p)))
    value = next((v for k, v in entries if isinstance(k, str) and k == key), None) if entries else None
    number = real_number(value)
    value = torch.tensor(number) if number is not None else real_tensor(value)
    if value is None or value.numel() not in (1, size):
        return torch.full((size,), float("nan"))
    return value.float().flatten().expand(size).clone()   # not a live view


def keys_mistake(outputs: dict) -> str:
    """What is wrong with the keys of the learner's optimizer.state ("" when they are the parameters)."""
    keys = recorded_text(outputs["keys"]) if "keys" in outputs else KEYED_BY_PARAMETERS
    if keys == "ids":
        return Mistake("state_by_id", "the state is kept by id(p), not by the parameter: key self.state by the "
                       "parameter tensor itself, self.state[p], as torch.optim.Optimizer does, so that state_dict() "
                       "and load_state_dict() find it (a checkpoint saves nothing of a state keyed by ids)")
    return ("" if keys == KEYED_BY_PARAMETERS else Mistake("state_not_by_parameter", f"{keys}: optimizer.state must "
            "be the dict torch.optim.Optimizer makes, keyed by each parameter tensor (self.state[p])"))
