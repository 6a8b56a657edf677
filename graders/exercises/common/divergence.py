"""The first activation in forward order where a learner's composite (a block, a model, a
decoder layer) differs from the reference, compared with what each known mistake makes there:
how 05, 06, 09 and 10 name a wiring mistake by its place, listed or not."""
from __future__ import annotations

from typing import Sequence

import torch

from graders.judging.compare import CheckFailed, compare, mistake_key, with_fix
from graders.judging.tolerance import close


def _matching_first(traces: dict[str, dict], actual, key: str = "hook_resid_post") -> dict[str, dict]:
    """The traces, those whose `key` matches `actual` first (so the likeliest mistake is named)."""
    def matches(trace):
        value = trace.get(key)
        return (isinstance(actual, torch.Tensor) and value is not None and
                value.shape == actual.shape and close(actual, value))
    return dict(sorted(traces.items(), key=lambda item: not matches(item[1])))


def first_divergence(what: str, outputs: dict, acts: dict, hooks: Sequence[tuple[str, str]],
                     traces: dict[str, dict], dims: Sequence[str], hints: dict, counts: str,
                     final: str, places: dict | None = None, fixes: dict | None = None) -> None:
    """Raise for the first hook (learner key, reference key) whose value differs from the reference,
    named by `places` (its key otherwise); `hints` say in words what each place computes, `fixes`
    hold its corrected line, the message's last."""
    fixes = fixes or {}
    places = places or {}
    traces = _matching_first(traces, outputs.get(final), final)
    for key, ref_key in hooks:
        expected = acts[ref_key]
        actual = outputs.get(key)
        if actual is None:
            lines = [f"{what}: could not see {places.get(key, key)} ({counts}). The value is read from the input or "
                     "output of your submodule; call each submodule once, as `self.name(x)`."]
            named = None
            for description, trace in traces.items():
                if key not in trace:
                    final_value = trace.get(final)
                    if (isinstance(outputs.get(final), torch.Tensor) and final_value is not None
                            and final_value.shape == outputs[final].shape
                            and close(outputs[final], final_value)):
                        lines.append(f"  Likely mistake: {description}")
                        named = description
                        break
            if hints.get(key) and len(lines) == 1:
                lines.append(f"  Hint: {hints[key]}")
            raise CheckFailed(with_fix("\n".join(lines), fixes.get(key, "")), mistake=mistake_key(named))
        if isinstance(actual, torch.Tensor) and actual.shape == expected.shape and close(actual, expected):
            continue
        mistakes = {d: t[key] for d, t in traces.items() if t.get(key) is not None}
        compare(f"{what}: {places.get(key, key)}, the first activation in forward order that differs from the "
                f"reference,", actual, expected, dims, mistakes=mistakes, hint=hints.get(key, ""),
                fix=fixes.get(key, ""))
        return
