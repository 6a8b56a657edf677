"""The one comparison-and-diagnosis engine every notebook's grader uses.

A check has two halves, kept apart on purpose:
- `produce` runs the learner's code on inputs the grader chooses and returns plain tensors;
- `judge` compares those tensors with the reference and decides, without running learner code.
In the notebook both run in the learner's kernel, for instant feedback; the instructor pipeline
can run `produce` in the learner's sandbox and `judge` in a clean process.
"""
from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

# --- The tolerance policy (the only one in the course) ------------------------------------
# Everything is fp32. A value passes when |actual - expected| <= sqrt(depth) * (ATOL_REL *
# rms(expected) + RTOL * |expected|), where depth is the number of transformer blocks the value
# went through in the learner's code (1 for a single component).
# - Why 2e-5: the subtlest single-component mistakes are small: sample instead of population
#   variance changes LayerNorm outputs by 6.5e-4 relative, the erf GELU differs from gelu_new
#   by up to 5e-4 (1e-4 relative). Correct implementations (einsum vs matmul vs einops, -inf vs
#   -1e5 masks, var() vs a hand-written mean of squares, one-hot lookups) differ from the
#   reference by fp32 rounding only, at most ~0.1 of this tolerance on one component.
# - Why sqrt(depth): rounding errors of independent blocks add up like a random walk; after
#   twelve blocks a correct model's logits sit at ~0.5 of the single-component tolerance, and
#   other CPUs' kernels can round differently. Whole-model checks only need to see whole-model
#   mistakes, which are orders of magnitude larger; the subtle ones are caught per component.
RTOL = 2e-5
ATOL_REL = 2e-5


def tolerance(expected: torch.Tensor, depth: int = 1) -> torch.Tensor:
    """The per-element tolerance for `expected` under the course's single policy."""
    expected = expected.double()
    rms = expected.pow(2).mean().sqrt() if expected.numel() else expected.new_zeros(())
    return math.sqrt(depth) * (ATOL_REL * rms + RTOL * expected.abs())


def close(actual: torch.Tensor, expected: torch.Tensor, depth: int = 1) -> bool:
    """Whether two same-shaped tensors agree within the policy."""
    return bool(((actual.double() - expected.double()).abs() <= tolerance(expected, depth)).all())


class CheckFailed(AssertionError):
    """A check found a mistake; the message says what and where."""


# --- Comparing one tensor ---------------------------------------------------------------------

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
            shown = ", ".join(map(str, wrong[:8])) + (" ..." if len(wrong) > 8 else "")
            notes.append(f"only some {dim} values are wrong: {dim} {shown} "
                         f"({len(wrong)} of {per_index.numel()})")
    return notes


def compare(what: str, actual, expected: torch.Tensor, dims: Sequence[str],
            mistakes: Mapping[str, torch.Tensor] | None = None, hint: str = "",
            depth: int = 1) -> None:
    """Check type, shape and values of `actual` against `expected`; explain any difference.

    `mistakes` maps a description of a known mistake to the output that mistake produces on
    the same input; when the learner's output matches one, the message names it.
    """
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
    for description, wrong_output in (mistakes or {}).items():
        if wrong_output.shape == actual.shape and close(actual, wrong_output, depth):
            lines.append(f"  Likely mistake: {description}")
            break
    if hint:
        lines.append(f"  Hint: {hint}")
    raise CheckFailed("\n".join(lines))


# --- Running the learner's code on the grader's inputs ------------------------------------

@dataclass
class Forbidden:
    """Library implementations of the thing the learner must build, by where they live."""
    what: str                      # "LayerNorm"
    targets: Sequence[tuple[object, str]] = field(default_factory=tuple)  # (module/class, attr)
    source_words: Sequence[str] = field(default_factory=tuple)            # in the learner's source


ALWAYS_FORBIDDEN_WORDS = ("transformer_lens", "transformers", "HookedTransformer", "TransformerBridge")


class LibraryUsed(RuntimeError):
    pass


@contextlib.contextmanager
def _tripwires(forbidden: Forbidden):
    """Make the forbidden library functions raise while the learner's code runs."""
    saved = []

    def tripwire(name):
        def fail(*args, **kwargs):
            raise LibraryUsed(name)
        return fail

    try:
        for owner, attr in forbidden.targets:
            saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, tripwire(f"{getattr(owner, '__name__', owner)}.{attr}"))
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def _source_of(obj) -> str:
    try:
        return inspect.getsource(obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj))
    except (OSError, TypeError):
        return ""


def run_learner(what: str, fn: Callable, *args, forbidden: Forbidden | None = None, **kwargs):
    """Call learner code, turning crashes and library shortcuts into messages a learner can act on."""
    forbidden = forbidden or Forbidden(what)
    source = _source_of(fn if not isinstance(fn, torch.nn.Module) else type(fn))
    code_lines = [ln.split("#")[0] for ln in source.splitlines()
                  if not ln.strip().startswith(("#", '"""', "'''"))]
    code = "\n".join(code_lines)
    for word in tuple(forbidden.source_words) + ALWAYS_FORBIDDEN_WORDS:
        if _mentions(code, word):
            raise CheckFailed(f"{what}: your code uses `{word}`. The point of this exercise is to "
                              f"implement {forbidden.what} yourself from tensor operations; "
                              "replace the library call with your own computation.")
    try:
        with _tripwires(forbidden), torch.no_grad():
            return fn(*args, **kwargs)
    except LibraryUsed as used:
        raise CheckFailed(f"{what}: your code calls `{used}`. Implement {forbidden.what} yourself "
                          "from tensor operations instead of calling the library version.") from None
    except CheckFailed:
        raise
    except NotImplementedError:
        raise CheckFailed(f"{what}: not implemented yet (the cell still raises "
                          "NotImplementedError). Write your solution in the cell above.") from None
    except Exception as err:  # the learner's bug: report it in their terms, not torch's
        raise CheckFailed(f"{what} raised {type(err).__name__}: {err}\n"
                          f"  while running on {describe_args(args)}.") from err


def _mentions(code: str, word: str) -> bool:
    import re

    return re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)" if "." not in word
                     else re.escape(word), code) is not None


def describe_args(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"a {a.dtype} tensor of shape {list(a.shape)}")
        else:
            parts.append(type(a).__name__)
    return ", ".join(parts) or "no arguments"


def build_module(what: str, cls, *args):
    """Instantiate the learner's class, reporting a crash in `__init__` clearly."""
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise CheckFailed(f"{what}: expected your class (a subclass of nn.Module), got {cls!r}.")
    try:
        return cls(*args)
    except NotImplementedError:
        raise CheckFailed(f"{what}: __init__ is not implemented yet.") from None
    except Exception as err:
        raise CheckFailed(f"{what}: creating {cls.__name__}(cfg) raised "
                          f"{type(err).__name__}: {err}") from err


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
