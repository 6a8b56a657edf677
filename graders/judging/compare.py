"""Compare a learner's output with the expected one and explain any difference: the one
comparison every check uses.

`compare` checks type, shape and values under the course tolerance (graders.judging.tolerance),
names a known mistake when the output matches what that mistake produces (or when a `reading` of
the output's properties recognises one), and words the failure the course's way: the diagnosis on
the first line, a hint only when no mistake is named, the corrected code last (`with_fix`), on the
line the displays fold away (graders.judging.rendering). `diagnosed` applies the same wording to
any judge's failure; `decide` (graders.judging.verdict) applies it to every verdict.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from graders.judging.rendering import FIX_PREFIX, fix_line
from graders.judging.tolerance import close, tolerance

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

LIKELY = "Likely mistake:"
FIX = FIX_PREFIX.strip()      # "Show the fix:", as rendering.py marks the line

class Mistake(str):
    """A known mistake's description that carries its key: a short name, fixed where the mistake
    is declared, by which a class's results count it (graders.harness.insights) however its
    wording changes. It is the description everywhere else (messages, dictionary keys)."""

    key: str

    def __new__(cls, key: str, description: str):
        named = super().__new__(cls, description)
        named.key = key
        return named


def mistake_key(description) -> str | None:
    """The key of a declared `Mistake`, None for a description declared as plain text."""
    return getattr(description, "key", None)


def keyed_like(named, text: str) -> str:
    """`text`, a message or description that names the mistake `named`, carrying `named`'s key
    (plain text when `named` has none): how a check that rewords a known mistake keeps its key."""
    key = mistake_key(named)
    return Mistake(key, text) if key else text


# Known mistakes: their description -> the output each produces; or a function that computes
# them, called only when the learner's output differs (a correct answer never pays for them).
Mistakes = Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]] | None


class CheckFailed(AssertionError):
    """A check found a mistake; the message says what and where, and `mistake` is the key of the
    known mistake it names (None when it names none, or one declared without a key)."""

    def __init__(self, message: str = "", mistake: str | None = None):
        super().__init__(message)
        self.mistake = mistake

    # Set by the check that raises it in a learner's own kernel: its display folds the message's
    # `Show the fix:` line away (graders.judging.rendering). Validate and `make check` read the
    # cell's error as text, and keep the line.
    folds_fix = False

    def _render_traceback_(self) -> list[str]:
        """What IPython (and so JupyterLab and nbgrader's Validate) shows for a failed check:
        the diagnosis, and the learner's own frames when their code raised; no grader frames."""
        from graders.judging.rendering import render

        return render(self, fold=self.folds_fix)


def _describe_shape(dims: Sequence[str], shape: Sequence[int]) -> str:
    return "[" + ", ".join(f"{d}={n}" for d, n in zip(dims, shape)) + "]"


def check_shape(what: str, actual, expected_shape: Sequence[int], dims: Sequence[str]) -> None:
    """Fail with a message naming the wrong dimension when `actual` has the wrong shape."""
    require_tensor(what, actual)
    shape, expected_shape = tuple(actual.shape), tuple(expected_shape)
    if shape == expected_shape:
        return
    want = _describe_shape(dims, expected_shape)
    if len(shape) != len(expected_shape):
        hint = ""
        if len(shape) == len(expected_shape) + 1 and shape[-1] == 1:
            hint = " (a trailing dimension of size 1: did you forget to squeeze, or keepdim=True?)"
        if len(shape) + 1 == len(expected_shape):
            hint = " (a dimension is missing: did a sum/mean drop it, or did you forget keepdim=True?)"
        raise CheckFailed(f"{what}: has {len(shape)} dimensions {list(shape)}, expected "
                          f"{len(expected_shape)}: {want}{hint}.")
    wrong = [f"dimension {i} ({dims[i]}) is {n}, should be {m}"
             for i, (n, m) in enumerate(zip(shape, expected_shape)) if n != m]
    hint = ""
    if sorted(shape) == sorted(expected_shape):
        hint = " The sizes are right but in another order: check your transpose/rearrange."
    raise CheckFailed(f"{what}: shape {list(shape)}, expected {want}: " + "; ".join(wrong) + "." + hint)


def require_tensor(what: str, actual) -> None:
    """Only a real floating-point torch.Tensor counts (no look-alikes, no numpy arrays)."""
    if type(actual) not in (torch.Tensor, torch.nn.Parameter):
        raise CheckFailed(f"{what}: expected a torch.Tensor, got {type(actual).__name__}. "
                          "Return the tensor itself (not a list, numpy array or tuple).")


def _worst_place(err: torch.Tensor, dims: Sequence[str]) -> str:
    index = torch.unravel_index(err.argmax(), err.shape)
    return ", ".join(f"{d}={int(i)}" for d, i in zip(dims, index))


def _concentration(bad: torch.Tensor, dims: Sequence[str]) -> list[str]:
    """Name the dimensions along which the wrong values cluster (e.g. 'only position 0')."""
    notes = []
    for axis, dim in enumerate(dims):
        if dim == "batch" and bad.shape[axis] == 1 or bad.shape[axis] == 1:
            continue
        other = tuple(a for a in range(bad.ndim) if a != axis)
        per_index = bad.any(dim=other) if other else bad
        wrong = per_index.nonzero().flatten().tolist()
        if 0 < len(wrong) < per_index.numel():
            notes.append(_how_many_wrong(dim, wrong, per_index.numel()))
    return notes


def _how_many_wrong(dim: str, wrong: list[int], total: int) -> str:
    """The quantifier follows the count; when most are wrong, the few right ones say more."""
    def listed(indices):
        return ", ".join(map(str, indices[:8])) + (" ..." if len(indices) > 8 else "")
    if 2 * len(wrong) <= total:
        return f"only some {dim} values are wrong: {dim} {listed(wrong)} ({len(wrong)} of {total})"
    right = sorted(set(range(total)) - set(wrong))
    return f"most {dim} values are wrong ({len(wrong)} of {total}); right only at {dim} {listed(right)}"


def compare(what: str, actual, expected: torch.Tensor, dims: Sequence[str],
            mistakes: Mistakes = None, hint: str = "", depth: int = 1,
            reading: Callable[[torch.Tensor], str | None] | None = None,
            fix: str = "", fixes: Mapping[str, str] = {}) -> None:
    """Check type, shape and values of `actual` against `expected`; explain any difference.

    `mistakes` maps a description of a known mistake to the output that mistake produces on
    the same input (or is a function returning that map); when the learner's output matches
    one, the message names it on its first line. When none matches, `reading(actual)`
    (graders.exercises.common.properties) may name one from the output's properties; it is asked
    only about a finite output of the right shape. `hint` is printed only when no mistake is
    named (it is general, the mistake is precise); `fixes` holds the corrected code of a named
    mistake, `fix` the code of any mistake here.
    """
    try:
        _differences(what, actual, expected, dims, mistakes, depth)
    except CheckFailed as failure:
        message, key = str(failure), failure.mistake
        if reading is not None and LIKELY not in message and _readable(actual, expected):
            found = reading(actual.detach())
            if found:
                message, key = _with_likely(message, found), mistake_key(found)
        named = named_mistake(message)
        if named is None and hint:
            message += f"\n  Hint: {hint}"
        message = diagnosed(with_fix(message, fixes.get(named, fix)))
        if message == str(failure) and key == failure.mistake:
            raise
        raise CheckFailed(message, mistake=key) from failure.__cause__


def _differences(what: str, actual, expected: torch.Tensor, dims: Sequence[str], mistakes: Mistakes,
                 depth: int) -> None:
    """Fail, saying where and by how much `actual` differs from `expected` and which listed
    mistake it matches, if any."""
    check_shape(what, actual, expected.shape, dims)
    if not actual.is_floating_point():
        raise CheckFailed(f"{what}: dtype {actual.dtype}, expected a floating-point tensor "
                          f"({expected.dtype}).")
    actual = actual.detach().to("cpu", torch.float64)
    if not torch.isfinite(actual).all():
        n_bad = int((~torch.isfinite(actual)).sum())
        place = _worst_place((~torch.isfinite(actual)).double(), dims)
        raise CheckFailed(f"{what}: {n_bad} values are NaN or infinite (first at {place}). "
                          "Look for a division by zero, a sqrt of a negative number, or a "
                          "-inf that reached a sum.")
    err = (actual - expected.double()).abs()
    tol = tolerance(expected, depth)
    bad = err > tol
    if not bad.any():
        return
    lines = [f"{what} does not match the reference.",
             f"  largest error {err.max().item():.3g} at [{_worst_place(err, dims)}] "
             f"(expected {expected.flatten()[err.argmax()].item():.6g}, "
             f"got {actual.flatten()[err.argmax()].item():.6g}); "
             f"{100 * (1 - bad.double().mean().item()):.1f}% of values within tolerance."]
    lines += ["  " + note for note in _concentration(bad, dims)]
    key = None
    for description, wrong_output in ((mistakes() if callable(mistakes) else mistakes) or {}).items():
        if wrong_output.shape == actual.shape and close(actual, wrong_output, depth):
            lines.append(f"  {LIKELY} {description}")
            key = mistake_key(description)
            break
    raise CheckFailed("\n".join(lines), mistake=key)


def _readable(actual, expected: torch.Tensor) -> bool:
    return (isinstance(actual, torch.Tensor) and actual.shape == expected.shape and actual.is_floating_point()
            and bool(torch.isfinite(actual).all()))


def _with_likely(message: str, likely: str) -> str:
    """`message` with a "Likely mistake: ..." line before its hint or its fix (at its end without)."""
    lines = message.split("\n")
    at = next((i for i, line in enumerate(lines)
               if line.strip().startswith("Hint:") or line.startswith(FIX_PREFIX)), len(lines))
    return "\n".join(lines[:at] + [f"  {LIKELY} {likely}"] + lines[at:])


def with_fix(message: str, code: str) -> str:
    """`message` ending with the corrected code, on the line the displays fold away."""
    return message + fix_line(code) if code else message


def named_mistake(message: str) -> str | None:
    """The description on a message's "Likely mistake: ..." line, None when it names none."""
    for line in message.split("\n"):
        if LIKELY in line:
            return line.split(LIKELY, 1)[1].strip()
    return None


def fix_last(message: str) -> str:
    """`message` with its "Show the fix:" lines moved to the end, once each (a matched mistake's
    description carries one, and a hint may follow it)."""
    lines = message.split("\n")
    fixes = [line for line in lines if line.strip().startswith(FIX)]
    return "\n".join([line for line in lines if line not in fixes] + list(dict.fromkeys(fixes)))


def lift_diagnosis(message: str) -> str:
    """`message` with its first "Likely mistake: ..." line moved up to the end of its first line."""
    lines = message.split("\n")
    if not lines or LIKELY in lines[0]:
        return message
    for i, line in enumerate(lines[1:], start=1):
        if line.strip().startswith(LIKELY):
            first = lines[0].rstrip()
            return "\n".join([f"{first} {line.strip()}"] + lines[1:i] + lines[i + 1:])
    return message


def diagnosed(message: str) -> str:
    """A failure worded the course's way: the mistake it names on its first line (the line a
    learner reads), the corrected code last. Applying it twice changes nothing."""
    return fix_last(lift_diagnosis(message))


def judge_generator_use(what: str, outputs: Mapping, made: str, how: str) -> None:
    """Randomness must come from the generator the caller passes, and only from it.

    `outputs` holds "a" and "a_again" (same seed), "b" (another seed) and "global_rng_used";
    `made` names what was produced ("sequences", "tokens"), `how` the call that draws right.
    """
    if not torch.equal(outputs["a"], outputs["a_again"]):
        raise CheckFailed(f"{what}: two calls with generators seeded the same gave different "
                          f"{made}. Draw every random number from the generator you are given: "
                          f"{how}.")
    if torch.equal(outputs["a"], outputs["b"]):
        raise CheckFailed(f"{what}: generators with different seeds gave the same {made}: draw "
                          f"from the generator you are given ({how}); do not reseed it, use a "
                          "fixed seed, or always take the most likely token.")
    if bool(outputs["global_rng_used"]):
        raise CheckFailed(f"{what} used or reseeded torch's global random generator. Use only the "
                          f"generator passed in ({how}), so that callers control the randomness.")


def ok(message: str) -> None:
    """Print a passed check on stdout (never stderr: nbgrader zeroes cells that write there)."""
    print(f"\N{CHECK MARK} {message}")
