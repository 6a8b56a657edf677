"""Reading a wrong output's properties against the reference's, to name a mistake no catalog
lists: inside one small function, localising by activation has nothing to say, but the output
still shows what kind of mistake made it.

- `row_lengths`: every row points the reference's way and only its length differs (a
  normaliser, a scale); `named_factor` names a constant factor by the sizes it comes from.
- `power_mean_divisor`: what a normalised row was divided by, read as a power mean of |x|
  (p = 1: the mean absolute value; p = inf: the largest entry).
- `scaling_degree`: how an output scales when an input (or a weight) is scaled.
- `as_combination`: the output as a sum of known tensors times numbers (the reference plus the
  input: a residual added inside; one part's output twice: a sublayer applied twice).
- `axis_reordered`: the reference with an axis's entries in another order (halves exchanged,
  reversed, rolled, neighbours paired).
- `read_output`: those readings, in words, for a part that maps x to an output of x's shape.
- `signed_map`: a linear map [d, d] read as "dimension i takes ±x[j]", written by halves when
  it acts by halves (rotate-half as cat([-x2, x1])).
- `transposed_operand`, `transposed_declaration`: a matrix used or declared transposed, read
  from the sizes in a crash or a loading error.
"""
from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

import torch

from graders.judging.compare import Mistake
from graders.judging.tolerance import close, tolerance

# How far a property may sit from exact and still be read as holding: float32 rounding is ~1e-7
# relative; every mistake these readers name moves it by far more than 1e-4.
SLACK = 1e-4
# A row "points the reference's way" when its cosine with the reference's row is within this of 1:
# float32 rows of 256 numbers reach 1 - 1e-7; a wrong direction is far below.
COSINE_SLACK = 1e-6


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().reshape(-1, t.shape[-1])


def row_lengths(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor | None:
    """|actual row| / |expected row| for each row (last axis), when every row of `actual` points
    exactly the reference's way (a positive multiple of it); None otherwise."""
    if actual.shape != expected.shape or not actual.is_floating_point():
        return None
    a, e = _rows(actual), _rows(expected)
    length_a, length_e = a.norm(dim=-1), e.norm(dim=-1)
    if (length_e == 0).any() or (length_a == 0).any() or not torch.isfinite(a).all():
        return None
    cosine = (a * e).sum(-1) / (length_a * length_e)
    return length_a / length_e if bool((cosine > 1 - COSINE_SLACK).all()) else None


def is_constant(values: torch.Tensor) -> bool:
    return bool(((values - values.mean()).abs() <= SLACK * values.abs().mean()).all())


def named_factor(factor: float, sizes: Mapping[str, int]) -> str:
    """`factor` written from the sizes it likely comes from ("1/8 = 1/n_heads"), or as a number."""
    candidates = {"2": 2.0, "1/2": 0.5, "-1": -1.0}
    for name, size in sizes.items():
        candidates.update({name: size, f"1/{name}": 1 / size, f"sqrt({name})": math.sqrt(size),
                           f"1/sqrt({name})": 1 / math.sqrt(size)})
    for words, value in candidates.items():
        if abs(factor - value) <= SLACK * abs(value):
            shown = f"{value:.4g}" if "/" not in words else f"1/{1 / value:.4g}"
            return f"{shown} = {words}" if words not in (shown, "2", "1/2", "-1") else words
    return f"{factor:.4g}"


def power_mean(x: torch.Tensor, p: float) -> torch.Tensor:
    """mean(|x|**p) ** (1/p) over the last axis (p = inf: the largest |x|)."""
    x = _rows(x).abs()
    return x.amax(-1) if math.isinf(p) else x.pow(p).mean(-1).pow(1 / p)


POWERS = {1.0: "the mean absolute value, mean(|x|)", 2.0: "the root mean square, sqrt(mean(x**2))",
          3.0: "the cube root of mean(|x|**3)", 4.0: "the fourth root of mean(x**4)",
          math.inf: "the largest absolute value, max(|x|)", 0.5: "mean(sqrt(|x|))**2"}


def power_mean_divisor(divisor: torch.Tensor, x: torch.Tensor, sizes: Mapping[str, int]) -> str | None:
    """What `divisor` (one number per row of `x`) is, read as c · mean(|x|**p) ** (1/p) for one
    of the usual p and a constant c named by `sizes` ("256 = d_model times the mean absolute
    value": sum(|x|)); None when no p fits every row."""
    divisor = divisor.double().flatten()
    for p, words in POWERS.items():
        ratio = divisor / power_mean(x, p)
        if is_constant(ratio):
            c = ratio.mean().item()
            return words if abs(c - 1) <= SLACK else f"{named_factor(c, sizes)} times {words}"
    return None


def scaling_degree(before: torch.Tensor, after: torch.Tensor, factor: float) -> float | None:
    """The power p with after = factor**p · before, when `after` is `before` times one number
    (scaling an input or a weight by `factor` scaled the output by factor**p); None otherwise."""
    if before.shape != after.shape:
        return None
    b, a = before.detach().double().flatten(), after.detach().double().flatten()
    if b.norm() == 0:
        return None
    ratio = (a @ b / (b @ b)).item()
    if ratio <= 0 or (a - ratio * b).norm() > SLACK * a.norm():
        return None
    return math.log(ratio) / math.log(factor)


def as_combination(actual: torch.Tensor, terms: Mapping[str, torch.Tensor]) -> dict[str, float] | None:
    """The numbers c_i with actual = sum_i c_i · terms[i] within the course's tolerance, or None
    when no such sum reproduces it."""
    if not terms or any(t.shape != actual.shape for t in terms.values()):
        return None
    basis = torch.stack([t.detach().flatten().double() for t in terms.values()], 1)
    coefficients = torch.linalg.lstsq(basis, actual.detach().flatten().double()[:, None]).solution[:, 0]
    fitted = (basis @ coefficients).reshape(actual.shape)
    return dict(zip(terms, coefficients.tolist())) if close(actual, fitted) else None


def combination_words(coefficients: Mapping[str, float]) -> str:
    """"1·x + 0.5·mlp_out", leaving out terms with a coefficient of 0."""
    shown = [f"{c:.3g}·{name}" for name, c in coefficients.items() if abs(c) > 1e-3]
    return " + ".join(shown).replace("+ -", "- ") or "0"


def axis_reordered(actual: torch.Tensor, expected: torch.Tensor, dims: Sequence[str]) -> str | None:
    """Whether `actual` is `expected` with the entries of one axis in another order, and which:
    "its d_head axis with its two halves exchanged", "its position axis reversed"; None when no
    single axis's reordering reproduces it."""
    if actual.shape != expected.shape or close(actual, expected):
        return None
    allowed = tolerance(expected)
    for axis, dim in enumerate(dims):
        n = actual.shape[axis]
        if n < 2:
            continue
        a, e, tol = (t.detach().double().movedim(axis, 0).reshape(n, -1) for t in (actual, expected, allowed))
        misfit = ((a[:, None, :] - e[None, :, :]).abs() / tol[None, :, :]).amax(-1)   # [actual i, reference j]
        order, taken = [], set()
        for i in range(n):                      # each entry the closest reference entry not yet taken
            j = min((j for j in range(n) if j not in taken), key=lambda j: misfit[i, j].item())
            if misfit[i, j] > 1:
                break
            order.append(j)
            taken.add(j)
        if len(order) == n and order != list(range(n)):
            return f"its {dim} axis {_order_words(order)}"
    return None


def _order_words(order: list[int]) -> str:
    n = len(order)
    if order == list(range(n))[::-1]:
        return "reversed"
    half = n // 2
    if n % 2 == 0 and order == list(range(half, n)) + list(range(half)):
        return "with its two halves exchanged"
    if n % 2 == 0 and order == list(range(half))[::-1] + list(range(half, n))[::-1]:
        return "with each half reversed"
    shift = order[0]
    if order == [(i + shift) % n for i in range(n)]:
        moved = f"i + {shift}" if shift <= n // 2 else f"i - {n - shift}"
        return f"rolled (entry i holds the reference's entry {moved}, mod {n})"
    if n % 2 == 0 and order == [i ^ 1 for i in range(n)]:
        return "with neighbours exchanged (entry 2k and 2k + 1)"
    shown = ", ".join(map(str, order[:8])) + (" ..." if n > 8 else "")
    return f"in another order (entry i holds the reference's entries {shown})"


def read_output(actual: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, what: str, dims: Sequence[str],
                sizes: Mapping[str, int]) -> str | None:
    """A mistake nobody listed in a part that maps x to an output of x's shape (an MLP, an
    attention), named from the output's properties: the reference plus the input (a residual
    added inside the part), the reference times one number, or the reference with an axis's
    entries in another order."""
    fit = as_combination(actual, {what: expected, "x": x}) if x.shape == expected.shape else None
    if fit is not None and abs(fit["x"]) > 1e-3:
        if abs(fit[what] - 1) < 1e-3 and abs(fit["x"] - 1) < 1e-3:
            return Mistake("residual_added_inside", f"your output is {what} plus its input x (the difference "
                           f"from the reference is x itself): the residual is added inside; the layer adds "
                           f"it, {what} returns its own output only")
        return Mistake("grows_with_input", f"your output is {combination_words(fit)}: the difference from the "
                       "reference grows with the input x")
    for sign in (1, -1):
        lengths = row_lengths(sign * actual, expected)
        if lengths is not None and is_constant(lengths):
            factor = sign * lengths.mean().item()
            if abs(factor + 1) < 1e-3:
                return Mistake("sign_flipped", f"your output is the reference's with its sign flipped: {what} has "
                               "no minus sign")
            return Mistake("scaled_by_a_constant", f"your output is the reference's times "
                           f"{named_factor(factor, sizes)}, the same factor everywhere: {what} has no such factor")
    reordered = axis_reordered(actual, expected, dims)
    return Mistake("axis_reordered", f"your output is the reference's, {reordered}") if reordered else None


def signed_map(matrix: torch.Tensor, name: str = "x", tol: float = 1e-3) -> str | None:
    """A matrix M [d, d] (output i = sum_j M[i, j] · x[j]) whose entries are 0 or ±1, read in
    words: by halves when it acts by halves ("cat([x2, -x1])"), else by where each dimension's
    entry comes from; None when it is not such a matrix."""
    m = matrix.double()
    rounded = m.round()
    if (m - rounded).abs().max() > tol or rounded.abs().max() > 1:
        return None
    d = m.shape[0]
    half = d // 2
    if d % 2 == 0:
        blocks = [[rounded[r * half:(r + 1) * half, c * half:(c + 1) * half] for c in range(2)] for r in range(2)]
        eye = torch.eye(half, dtype=torch.float64)
        parts = []
        for r in range(2):
            terms = []
            for c in range(2):
                block = blocks[r][c]
                if torch.equal(block, eye):
                    terms.append(f"{name}{c + 1}")
                elif torch.equal(block, -eye):
                    terms.append(f"-{name}{c + 1}")
                elif block.abs().sum() != 0:
                    terms = None
                    break
            if terms is None:
                break
            parts.append(" + ".join(terms).replace("+ -", "- ") or "0")
        else:
            return f"cat([{parts[0]}, {parts[1]}])"
    partners = []
    for i in range(d):
        nonzero = rounded[i].nonzero().flatten().tolist()
        if len(nonzero) != 1:
            return None
        partners.append(("-" if rounded[i, nonzero[0]] < 0 else "", (nonzero[0] - i) % d))
    if len(set(partners)) == 1:
        sign, offset = partners[0]
        return f"the vector with {sign}{name}[(i + {offset}) mod {d}] at each dimension i"
    shown = ", ".join(f"{sign}{name}[{(i + offset) % d}]" for i, (sign, offset) in enumerate(partners[:6]))
    return f"the vector {shown}, ..."


MATMUL = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")


def transposed_operand(message: str, matrices: Mapping[str, Sequence[int]]) -> str | None:
    """The matrix a failed product used transposed, read from torch's sizes: (a x b) @ (c x b)
    with one of `matrices` of shape [b, c] means that matrix's .T went in where it belongs as is."""
    found = MATMUL.search(message)
    if not found:
        return None
    _, inner, rows, cols = map(int, found.groups())
    names = [name for name, shape in matrices.items() if tuple(shape) == (cols, rows)]
    if cols != inner or not names:
        return None
    which = " or ".join(names)
    return Mistake("weight_used_transposed", f"{which} is used transposed: it is [{cols}, {rows}], made to be "
                   f"multiplied as it is (h @ {names[0]}, h's last size {cols}); its .T needs h's last size to "
                   f"be {rows}")


SHAPE = re.compile(r"wrong shape: (\S+) is \[(\d+), (\d+)\], expected \[(\d+), (\d+)\]")


def transposed_declaration(message: str) -> str | None:
    """A parameter declared with its two sizes the other way round ([out, in], as nn.Linear
    stores it, where the course multiplies x @ W with W [in, out]), read from a loading error."""
    found = SHAPE.search(message)
    if not found:
        return None
    name, a, b, c, d = found.groups()
    if (a, b) != (d, c) or a == b:
        return None
    return Mistake("weight_declared_transposed", f"{name} is declared transposed, [{a}, {b}] as nn.Linear "
                   f"stores a weight ([out, in]): the course multiplies x @ {name.split('.')[-1]} with it [{c}, "
                   f"{d}] ([in, out])")
