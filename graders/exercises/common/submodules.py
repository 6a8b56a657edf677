"""Watching a learner's submodules while their module runs: forward hooks record each call's input
and output, so a grader can say which step of a forward differs first, and which call crashed
with what it was given. Used by notebooks 05, 06, 09 and 10."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from graders.exercises.common.diagnosis import describe, is_crash
from graders.judging.compare import CheckFailed

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


class CallRecorder:
    """Record (input, output) of every call of some named submodules while a forward runs.

    Names that point at the same object (e.g. `self.ln2 = self.ln1`) share that object's calls in
    order: the first name gets its first call, the second name its second call, and so on.
    """

    def __init__(self, named: dict[str, nn.Module]):
        self.named = {n: m for n, m in named.items() if isinstance(m, nn.Module)}
        self.calls: dict[int, list] = {}
        self.handles = []
        self.open: list[tuple[int, object]] = []   # calls entered and not yet returned: (module, input)

    def __enter__(self):
        for module in {id(m): m for m in self.named.values()}.values():
            self.calls[id(module)] = []
            self.handles.append(module.register_forward_pre_hook(self._enter(id(module))))
            self.handles.append(module.register_forward_hook(self._hook(id(module))))
        return self

    def _enter(self, key):
        def entered(module, inputs):
            self.open.append((key, inputs[0] if inputs else None))
        return entered

    def _hook(self, key):
        def record(module, inputs, output):
            first = inputs[0] if inputs else None
            self.calls[key].append((_keep(first), _keep(output)))
            for i in range(len(self.open) - 1, -1, -1):
                if self.open[i][0] == key:
                    del self.open[i]
                    break
        return record

    def crashed_in(self) -> tuple[str, object] | None:
        """(name, first input) of the innermost watched submodule a crash happened in."""
        if not self.open:
            return None
        key, given = self.open[-1]
        name = next(n for n, m in self.named.items() if id(m) == key)
        return name, given

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def call(self, name: str):
        """(input, output) of the call that belongs to `name`, or None when there was none."""
        if name not in self.named:
            return None
        module = self.named[name]
        earlier = [n for n in self.named if n != name and self.named[n] is module]
        index = sum(1 for n in earlier if list(self.named).index(n) < list(self.named).index(name))
        calls = self.calls.get(id(module), [])
        return calls[index] if index < len(calls) else None

    def count(self, name: str) -> int:
        module = self.named.get(name)
        return len(self.calls.get(id(module), [])) if module is not None else 0


TAKES_TOKENS = "the token ids, an integer tensor [batch, position]"
TAKES_RESIDUAL = "the residual stream, a float tensor [batch, position, d_model]"


def submodule_crash(what: str, failure: CheckFailed, rec: CallRecorder, takes: dict[str, str],
                    d_model: int) -> CheckFailed:
    """A crash inside one of the watched submodules, reported as the call that failed and what
    it was given (the likely mistake when that is not what the submodule takes)."""
    where = rec.crashed_in()
    if where is None or not is_crash(failure):
        return failure
    name, given = where
    wanted = takes.get("blocks" if name.startswith("blocks.") else name, "")
    call = f"self.{name}(...)" if not name.startswith("blocks.") else f"self.blocks[{name.split('.')[1]}](...)"
    head = f"{what}: the call {call} failed; it was given {describe(given)}"
    wrong, key = "", None
    if isinstance(given, torch.Tensor) and wanted == TAKES_TOKENS and (given.is_floating_point() or given.ndim != 2):
        wrong = (f" Likely mistake: {name} takes {wanted}, as embed does; it was passed "
                 + ("the embedding or residual stream" if given.ndim == 3 else "something else")
                 + f" instead: call self.{name}(tokens).")
        key = "not_given_tokens"
    elif isinstance(given, torch.Tensor) and wanted == TAKES_RESIDUAL and (
            not given.is_floating_point() or given.ndim != 3 or given.shape[-1] != d_model):
        wrong, key = f" Likely mistake: {call} takes {wanted}.", "not_given_the_residual_stream"
    elif not isinstance(given, torch.Tensor) and wanted:
        wrong = f" Likely mistake: {call} takes {wanted}, passed as its first positional argument."
        key = "not_given_a_tensor"
    lines = str(failure).splitlines()
    return CheckFailed(f"{head}.{wrong}\n  " + "\n  ".join(line.strip() for line in lines), mistake=key)


def _keep(value):
    """A copy of a recorded tensor; of a tuple's first item, for a module that returns
    (output, cache) as 10's attention and decoder layers do."""
    if isinstance(value, tuple) and value:
        value = value[0]
    return value.detach().clone() if isinstance(value, torch.Tensor) else None


def module_or_none(obj, attr):
    value = getattr(obj, attr, None)
    return value if isinstance(value, nn.Module) else None


def watch(named: dict, run: Callable, x, taps: Sequence[tuple[str, str, int]],
          runner: Callable | None = None, crash: Callable | None = None):
    """Run `run(x)` (as `runner(run, x)` when given) while recording the `named` submodules.

    Returns (output, {key: value} for each tap (key, submodule name, 0 = its input / 1 = its
    output) that was called, the recorder). A learner crash becomes `crash(failure, recorder)`."""
    with CallRecorder(named) as rec:
        try:
            out = runner(run, x) if runner else run(x)
        except CheckFailed as failure:
            if crash is None:
                raise
            raise crash(failure, rec) from failure.__cause__
    values = {}
    for key, name, which in taps:
        call = rec.call(name)
        if call is not None and call[which] is not None:
            values[key] = call[which]
    return out, values, rec
