"""Diagnoses several notebooks' checks share, beyond the comparison of tensors (which is
graders.judging.compare's, with the course's wording of every failure):

- `crash(...)`: a crash inside learner code at a given input, reported with that input and the
  likely cause, before the library's own words.
- `judge_generated(...)`: the shape of a `generate` output (notebooks 07 and 08).
- `judge_randomness(...)`: where the randomness of a sampler or data generator comes from, with
  one message per mistake (always the most likely token, a fixed seed, torch's global generator).
"""
from __future__ import annotations

import re
from typing import Mapping

import torch

from graders.judging.compare import CheckFailed, check_shape, mistake_key, require_tensor, with_fix


def is_crash(failure: CheckFailed) -> bool:
    """Whether a `run_learner` failure is the learner's code raising (not a stub, a forbidden
    library call or a grader's own verdict)."""
    cause = failure.__cause__
    return isinstance(cause, Exception) and not isinstance(cause, CheckFailed)


def crash(what: str, failure: CheckFailed, on: str, likely: str = "") -> CheckFailed:
    """A crash of learner code `what` on input `on`, the likely cause first when known."""
    head = f"{what} crashed on {on}"
    head += f". Likely mistake: {likely}" if likely else "."
    return CheckFailed(f"{head}\n  {str(failure).splitlines()[0]}" +
                       "".join(f"\n  {line.strip()}" for line in str(failure).splitlines()[1:]),
                       mistake=mistake_key(likely))


SIZE_MISMATCH = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def mismatched_sizes(failure: CheckFailed) -> tuple[int, int] | None:
    """The two sizes of a broadcasting error, if that is what the learner's code raised."""
    found = SIZE_MISMATCH.search(str(failure))
    return (int(found.group(1)), int(found.group(2))) if found else None


def judge_randomness(what: str, outputs: Mapping, made: str, how: str,
                     deterministic: Mapping[str, torch.Tensor] = {}) -> None:
    """Randomness must come from the generator the caller passes, and only from it.

    `outputs` holds "a" and "a_again" (same seed), "b" (another seed) and "global_rng_used";
    `deterministic` maps a description of a known deterministic mistake (e.g. "always takes the
    most likely token (argmax)") to what it outputs on the same input as "a"; `how` is the call
    that draws right, the message's fix.
    """
    if bool(outputs["global_rng_used"]) and not torch.equal(outputs["a"], outputs["a_again"]):
        raise CheckFailed(with_fix(
            f"{what} draws from torch's global random generator, not from the generator it is given: "
            f"two calls with generators seeded the same gave different {made}. Pass the generator "
            "you are given to the call that draws (its `generator=` argument).", how),
            mistake="global_generator")
    if not torch.equal(outputs["a"], outputs["a_again"]):
        raise CheckFailed(with_fix(
            f"{what}: two calls with generators seeded the same gave different {made}: some "
            "randomness does not come from the generator you are given. Draw every random number "
            "from it.", how),
            mistake="randomness_not_from_the_generator")
    if torch.equal(outputs["a"], outputs["b"]):
        for description, output in deterministic.items():
            if output.shape == outputs["a"].shape and torch.equal(outputs["a"], output):
                raise CheckFailed(with_fix(
                    f"{what} {description}, so generators with different seeds give the same "
                    f"{made}. Sample instead, from the generator you are given.", how),
                    mistake=mistake_key(description))
        if bool(outputs["global_rng_used"]):
            raise CheckFailed(with_fix(
                f"{what} reseeds torch's global random generator (torch.manual_seed), so generators "
                f"with different seeds give the same {made}. Use only the generator you are given.", how),
                mistake="reseeds_the_global_generator")
        raise CheckFailed(with_fix(
            f"{what} ignores the generator's seed: generators with different seeds give the same "
            f"{made}. Likely mistake: it draws from a generator of its own with a fixed seed (or "
            "reseeds the one it is given); draw from the generator you are given, as it is.", how),
            mistake="fixed_seed")
    if bool(outputs["global_rng_used"]):
        raise CheckFailed(with_fix(
            f"{what} used or reseeded torch's global random generator. Use only the generator "
            "passed in, so that callers control the randomness.", how),
            mistake="global_generator_used")


def judge_generated(where: str, out: torch.Tensor, prompt: torch.Tensor, n_new: int) -> None:
    """Shape, dtype and prompt of a `generate` output expected to hold prompt + n_new tokens."""
    require_tensor(where, out)
    n_prompt = prompt.shape[1]
    if out.ndim == 2 and out.shape[0] == prompt.shape[0] and out.shape[1] == n_new:
        raise CheckFailed(with_fix(
            f"{where}: shape {list(out.shape)}, expected {[prompt.shape[0], n_prompt + n_new]}. "
            "Likely mistake: only the new tokens are returned; return the prompt followed by them, "
            "joined along the position dimension.", "torch.cat([input_ids, new_tokens], dim=-1)"),
            mistake="only_new_tokens_returned")
    check_shape(where, out, (prompt.shape[0], n_prompt + n_new), ("batch", "position"))
    if out.dtype != torch.long:
        raise CheckFailed(f"{where}: dtype {out.dtype}; return token ids as torch.long.")
    if not torch.equal(out[:, :n_prompt], prompt):
        raise CheckFailed(f"{where}: the output must start with the prompt, then the new tokens.")


def describe(x) -> str:
    """A learner-facing description of an argument: dtype and shape for tensors."""
    if isinstance(x, torch.Tensor):
        dtype = str(x.dtype).replace("torch.", "")
        return f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} tensor of shape {list(x.shape)}"
    return "None" if x is None else type(x).__name__
