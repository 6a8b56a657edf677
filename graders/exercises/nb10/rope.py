"""Notebook 10, exercise 2: rotary position embedding, `rope_cos_sin(positions, d_head, theta)` and
`apply_rope(x, cos, sin)`, judged against transformers' LlamaRotaryEmbedding and
apply_rotary_pos_emb, for Llama 2's base (10,000) and Llama 3's (500,000).

First the frequency table; then a property of the learner's two functions together: shifting
every position by the same offset leaves the scores q·k unchanged (they depend on m - n only);
then the rotation itself. A rotation no listed mistake explains is read from apply_rope's matrix
at each position (it is linear in x), fitted as x' * cos + r(x) * sin (`read_rotation`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import torch

from graders.exercises.common.diagnosis import is_crash
from graders.judging.compare import (FIX, LIKELY, CheckFailed, Mistake,
                                     compare, diagnosed, keyed_like, mistake_key, with_fix)
from graders.exercises.nb10 import reference as ref
from graders.exercises.nb10.norm_mlp import DEFAULTS, NOTEBOOK
from graders.exercises.common.properties import axis_reordered, signed_map
from graders.judging.cases import Case
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner

THETAS = (10000.0, 500000.0)
D_HEAD, N_HEADS = 32, 4
FORBIDDEN = Forbidden("RoPE", source_words=["apply_rotary_pos_emb", "LlamaRotaryEmbedding", "rotary_emb"])
TABLE_DIMS, X_DIMS = ("position", "d_head"), ("batch", "head", "position", "d_head")


def offset(case: Case) -> int:
    return 7 + 3 * case.seed


def _qk(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(800 + case.seed)
    return tuple(torch.randn(case.batch, N_HEADS, case.seq, D_HEAD, generator=generator) for _ in range(2))


def rotation_table(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of seeded random angles, laid out as RoPE's table is (each angle on a dimension
    and on its partner d_head/2 later): what apply_rope is checked with. Not RoPE's own table,
    which would be rope_cos_sin's answer in the kernel."""
    generator = torch.Generator().manual_seed(810 + case.seed)
    angles = torch.rand(case.seq, D_HEAD // 2, generator=generator) * 2 * math.pi
    table = torch.cat([angles, angles], dim=-1)
    return table.cos(), table.sin()


def produce(learner, case: Case, inputs: dict) -> dict:
    rope_cos_sin, apply_rope = learner
    positions = torch.arange(case.seq)
    q, k = _qk(case)
    outputs = {}
    for theta in THETAS:
        cos, sin = _pair(run_learner("RoPE (rope_cos_sin)", rope_cos_sin, positions, D_HEAD, theta,
                                     forbidden=FORBIDDEN))
        outputs[f"cos_{theta:g}"], outputs[f"sin_{theta:g}"] = cos, sin
    cos, sin = rotation_table(case)
    outputs["q_rotated"] = run_learner("RoPE (apply_rope)", apply_rope, q, cos, sin, forbidden=FORBIDDEN)
    try:   # what read_rotation reads; a style it does not run in is judged without it
        outputs["map"] = run_learner("RoPE (apply_rope)", apply_rope, *_map_inputs(), forbidden=FORBIDDEN)
    except CheckFailed as failure:
        if not is_crash(failure):
            raise
    for name, start in (("scores", 0), ("scores_shifted", offset(case))):
        cos, sin = _pair(run_learner("RoPE (rope_cos_sin)", rope_cos_sin, positions + start, D_HEAD, THETAS[0],
                                     forbidden=FORBIDDEN))
        q_rot = run_learner("RoPE (apply_rope)", apply_rope, q, cos, sin, forbidden=FORBIDDEN)
        k_rot = run_learner("RoPE (apply_rope)", apply_rope, k, cos, sin, forbidden=FORBIDDEN)
        outputs[name] = q_rot @ k_rot.transpose(-1, -2)
    return outputs


def _pair(result) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"rope_cos_sin returned {type(result).__name__}; return a pair (cos, sin), "
                          "each [posn, d_head].")
    return result


# The frequency table's settings, each with its right value first and the ways it goes wrong, and
# what a wrong value is called. Every combination is tried, fewest wrong settings first, so a
# table with two mistakes at once is named as such.
TABLE_SETTINGS = {
    "exponent": {-2: "", -1: Mistake("exponent_halved", with_fix(
                     "the frequency exponent is off by a factor of 2: theta ** (-2i / d_head) for i = 0 .. "
                     "d_head/2 - 1", "theta ** (-torch.arange(0, d_head, 2) / d_head)")),
                 2: Mistake("exponent_sign_flipped", "the exponent's sign is flipped: theta ** (+2i / d_head) makes "
                            "the frequencies grow; they fall, 1 / theta ** (2i / d_head)"),
                 1: Mistake("exponent_sign_flipped_and_halved", "the exponent is +i / d_head: its sign is flipped "
                            "and it is half the right one, 1 / theta ** (2i / d_head)"),
                 -4: Mistake("exponent_doubled", "the frequency exponent is twice the right one: theta ** "
                             "(-2i / d_head) for i = 0 .. d_head/2 - 1")},
    "layout": {"halves": "", "interleaved": Mistake("frequencies_interleaved", with_fix(
        "the frequencies are interleaved (f0, f0, f1, f1, ...) as in the paper's pairs: transformers' Llama "
        "rotates halves, so the table holds them twice in a row", "torch.cat([freqs, freqs], dim=-1)"))},
    "order": {"cos, sin": "", "sin, cos": Mistake("cos_sin_swapped", "cos and sin are swapped: return (cos, sin), "
                                                  "in that order")},
    "unit": {1.0: "", 180 / math.pi: Mistake("angles_in_degrees", "the angles are in degrees: torch.cos and "
                                             "torch.sin take radians, m * theta ** (-2i / d_head)")},
    "first": {0: "", 1: Mistake("positions_from_one", "the positions start at 1: the first position is 0, with "
                                "angle 0")},
}


def _settings(theta: float) -> dict:
    """TABLE_SETTINGS with the base: theta, and 10,000 as a mistake where theta is another."""
    wrong_base = {} if theta == 10000.0 else {10000.0: Mistake("wrong_base", "a wrong base: the frequencies use "
                                                               "10000, not the theta you are given")}
    return {**TABLE_SETTINGS, "base": {theta: "", **wrong_base}}


def table_mistakes(positions: torch.Tensor, theta: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(cos, sin) of every wrong combination of the table's settings, by description, fewest
    mistakes first."""
    settings, found = _settings(theta), {}
    for combination in sorted(itertools.product(*(s.items() for s in settings.values())),
                              key=lambda values: sum(bool(why) for _, why in values)):
        whys = [why for _, why in combination if why]
        if whys:
            found[joined(whys)] = _table(positions, **dict(zip(settings, (v for v, _ in combination))))
    return found


def joined(whys: list[str]) -> Mistake:
    """Several mistakes in one description: their words joined by "; and ", their fixes after;
    its key, their keys joined by "_and_"."""
    words, fixes = [], []
    for why in whys:
        said, *fix = why.split(f"\n  {FIX} ")
        words.append(said)
        fixes += fix
    return Mistake("_and_".join(mistake_key(why) for why in whys),
                   "".join(["; and ".join(words)] + [f"\n  {FIX} {fix}" for fix in fixes]))


def _table(positions, exponent, layout, order, unit, first, base) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.arange(0, D_HEAD, 2, dtype=torch.float32) * -exponent / 2   # in float32, as a learner's
    angles = (positions.float()[:, None] + first) / base ** (index / D_HEAD) * unit
    angles = angles.repeat_interleave(2, -1) if layout == "interleaved" else torch.cat([angles, angles], -1)
    pair = (angles.cos(), angles.sin())
    return pair[::-1] if order == "sin, cos" else pair


def table_localised(cos, sin, positions: torch.Tensor, theta: float, named: bool) -> list[str]:
    """Where the learner's table departs from the right one, read as angles: whether cos and sin
    are of one angle, position 0's angle, and each column's angle per position; unless the
    mistake is `named` already, which exponent and base those angles per position fit (they
    are compared modulo 2π, which a fast frequency's float32 rounding does not upset). The line
    that names that mistake is a `Mistake`, with its key."""
    if not all(isinstance(t, torch.Tensor) and t.shape == (len(positions), D_HEAD) for t in (cos, sin)):
        return []
    cos, sin = cos.detach().double(), sin.detach().double()
    off = ((cos ** 2 + sin ** 2 - 1).abs() > 1e-3).nonzero()
    if len(off):
        return [f"  cos² + sin² is not 1 at [position {off[0, 0].item()}, d_head {off[0, 1].item()}]: these are "
                "not the cosine and sine of one angle."]
    angle = torch.atan2(sin, cos)
    lines = []
    if (angle[0].abs() > 1e-3).any():
        lines.append(f"  Position 0's angles are not 0 (column {int((angle[0].abs() > 1e-3).nonzero()[0])}: "
                     f"{angle[0].abs().max().item():.4g} rad at most): position m turns by m·f, 0 at the first "
                     "position.")
    step = _wrapped(angle[1] - angle[0])        # each column's turn from position 0 to 1, in (-pi, pi]
    right = _wrapped(_frequencies(-2, theta))
    wrong = ((step - right).abs() > 1e-3).nonzero().flatten().tolist()
    if wrong:
        j = wrong[0]
        lines.append(f"  The angle per position differs in {len(wrong)} of {D_HEAD} columns, first in column {j}: "
                     f"{step[j].item():.4g} rad where f = theta ** (-2i / d_head) with i = j mod "
                     f"{D_HEAD // 2} is {right[j].item():.4g}.")
    if wrong and not named:
        settings = _settings(theta)
        for exponent, base in itertools.product(settings["exponent"], settings["base"]):
            whys = [why for why in (settings["exponent"][exponent], settings["base"][base]) if why]
            if whys and (_wrapped(_frequencies(exponent, base) - step).abs() < 1e-2).all():
                lines.append(keyed_like(joined(whys), f"  {LIKELY} {joined(whys)}"))
                break
    return lines


def _frequencies(exponent: int, base: float) -> torch.Tensor:
    """The turn per position of each column (halves layout) for the exponent `exponent`·i / d_head."""
    return torch.cat([base ** (torch.arange(0, D_HEAD, 2, dtype=torch.float64) * exponent / 2 / D_HEAD)] * 2)


def _wrapped(angles: torch.Tensor) -> torch.Tensor:
    return torch.remainder(angles + math.pi, 2 * math.pi) - math.pi


MAP_POSITIONS = 8


def _map_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the matrix apply_rope applies is read from: x [d_head, 1, MAP_POSITIONS, d_head] whose
    batch item j is the unit vector e_j at every position, and a table of random angles (each
    twice, the halves layout), so that every position has its own cos and sin."""
    angles = torch.rand(MAP_POSITIONS, D_HEAD // 2, generator=torch.Generator().manual_seed(77)) * 2 * math.pi
    angles = torch.cat([angles, angles], -1)
    x = torch.eye(D_HEAD)[:, None, None, :].expand(D_HEAD, 1, MAP_POSITIONS, D_HEAD).contiguous()
    return x, angles.cos(), angles.sin()


def read_rotation(basis_out) -> str | None:
    """What the learner's apply_rope does, read from its matrix at each position (output i =
    sum_j M_m[i, j] x[j]): written as x' * cos + r(x) * sin with x' and r fixed rearrangements of
    x, fitted over positions, and whether M_m is a rotation at all."""
    _, cos, sin = _map_inputs()
    if not (isinstance(basis_out, torch.Tensor) and basis_out.shape == (D_HEAD, 1, MAP_POSITIONS, D_HEAD)):
        return None
    maps = basis_out[:, 0].double().permute(1, 2, 0)                   # [position m, output i, input j]
    a, b = torch.empty(D_HEAD, D_HEAD, dtype=torch.float64), torch.empty(D_HEAD, D_HEAD, dtype=torch.float64)
    for i in range(D_HEAD):
        design = torch.stack([cos[:, i], sin[:, i]], 1).double()        # [position, 2]
        a[i], b[i] = torch.linalg.lstsq(design, maps[:, i, :]).solution
    fitted = cos.double()[:, :, None] * a + sin.double()[:, :, None] * b
    if (fitted - maps).abs().max() > 1e-4:
        return None
    kept, turned = signed_map(a), signed_map(b)
    if kept is None or turned is None:
        return None
    lengths = (maps @ maps.transpose(1, 2) - torch.eye(D_HEAD, dtype=torch.float64)).abs().max() > 1e-4
    mixes = (maps.abs() > 1e-6).sum(-1).max() == 1
    effect = (" It mixes no two dimensions: each is only scaled (by cos ± sin), so nothing turns." if mixes else
              " That is not a rotation: it changes the vectors' lengths." if lengths else "")
    right = ref.rotate_half(torch.eye(D_HEAD, dtype=torch.float64)).T          # rotate_half as a matrix
    if kept != "cat([x1, x2])":
        return Mistake("cos_term_rearranged", f"your apply_rope computes {kept} * cos + {turned} * sin (x1, x2: the "
                       f"halves of x), where it is x * cos + rotate_half(x) * sin with rotate_half(x) = "
                       f"cat([-x2, x1]).{effect}")
    order = (" (its two halves in the wrong order)" if torch.equal(b.round().roll(D_HEAD // 2, 0), right) else "")
    return Mistake("rotate_half_halves_in_wrong_order" if order else "wrong_rotate_half",
                   f"your rotate_half(x) is {turned}{order}, where it is cat([-x2, x1]) (x1, x2: the halves of "
                   f"x).{effect}")


NEIGHBOURS = ("apply_rope pairs neighbours (0, 1), (2, 3), ...: the paper's convention, a rotation with a "
              "table of its own (each angle on two neighbours). transformers' Llama, which this check follows, "
              "pairs halves (i, i + d_head/2), and its table holds each angle at i and at i + d_head/2")
HALVES_FIX = "x * cos + torch.cat([-x2, x1], dim=-1) * sin   # x1, x2 = x.chunk(2, dim=-1)"


def _neighbours_turned(x: torch.Tensor) -> torch.Tensor:
    """The paper's partner of each dimension: (-x1, x0, -x3, x2, ...)."""
    return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)


def rotation_mistakes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict[str, torch.Tensor]:
    half = D_HEAD // 2
    every_other = (t[..., 0::2].repeat_interleave(2, dim=-1) for t in (cos, sin))
    return {
        Mistake("neighbour_pairs_first_half", with_fix(
            f"{NEIGHBOURS}; your code reads each neighbour pair's angle from the first half of the table",
            HALVES_FIX)): ref.apply_rope_interleaved(x, cos, sin),
        Mistake("neighbour_pairs_every_other", with_fix(
            f"{NEIGHBOURS}; your code reads each neighbour pair's angle from every other column of the table",
            HALVES_FIX)): x * next(every_other) + _neighbours_turned(x) * next(every_other),
        Mistake("neighbour_pairs", with_fix(
            f"{NEIGHBOURS}; read with that table, the two dimensions of a neighbour pair turn by two different "
            "angles, so the vectors' lengths change", HALVES_FIX)):
            x * cos + _neighbours_turned(x) * sin,
        Mistake("rotation_reversed", "the rotation turns the wrong way: rotate_half(x) is cat([-x2, x1]), not "
                "cat([x2, -x1])"):
            x * cos - ref.rotate_half(x) * sin,
        Mistake("halves_not_swapped", "the halves are not swapped: x * cos + rotate_half(x) * sin needs "
                "rotate_half(x) = cat([-x2, x1])"): x * cos + torch.cat([-x[..., :half], x[..., half:]], -1) * sin,
        Mistake("no_sin_term", "the sin term is missing: x * cos + rotate_half(x) * sin"): x * cos,
        Mistake("cos_sin_swapped_in_rotation", "cos and sin are swapped in the rotation: x * cos + rotate_half(x) "
                "* sin"): x * sin + ref.rotate_half(x) * cos,
    }


def judge(case: Case, outputs: dict) -> None:
    """Each function on its own, rope_cos_sin's table and apply_rope's rotation, every one that
    differs reported in one run; then the two together."""
    failures, keys = [], []
    for part in (_judge_table, _judge_rotation):
        try:
            part(case, outputs)
        except CheckFailed as failed:
            failures.append(diagnosed(str(failed)))
            keys.append(failed.mistake)
    if failures:   # the key of the first mistake named, the one the first line names
        raise CheckFailed("\n".join(failures), mistake=next((key for key in keys if key), None))
    compare(f"q·k after RoPE, every position shifted by {offset(case)} (rope_cos_sin and apply_rope "
            "together)", outputs.get("scores_shifted"), outputs["scores"].double(), ("batch", "head", "query", "key"),
            hint="RoPE rotates q at position m by m·θ_i and k at n by n·θ_i, so q·k depends on m - n "
                 "only: the same rotation for both, a pure rotation of each pair.")


def _judge_table(case: Case, outputs: dict) -> None:
    positions = torch.arange(case.seq)
    for theta in THETAS:
        expected = ref.hf_rope(replace(ref.ModernConfig(), d_head=D_HEAD, rope_theta=theta), positions)
        for i, name in enumerate(("cos", "sin")):
            try:
                compare(f"rope_cos_sin(positions 0..{case.seq - 1}, d_head={D_HEAD}, theta={theta:g}): {name}",
                        outputs.get(f"{name}_{theta:g}"), expected[i], TABLE_DIMS,
                        mistakes=lambda i=i: {why: pair[i] for why, pair in table_mistakes(positions, theta).items()},
                        hint="angle[m, j] = m * theta ** (-2i / d_head) with i = j mod (d_head / 2).")
            except CheckFailed as failed:
                actual, named = outputs.get(f"{name}_{theta:g}"), LIKELY in str(failed)
                reordered = None if named or not isinstance(actual, torch.Tensor) else axis_reordered(
                    actual, expected[i], TABLE_DIMS)
                localised = table_localised(outputs.get(f"cos_{theta:g}"), outputs.get(f"sin_{theta:g}"),
                                            positions, theta, named=named or reordered is not None)
                key = failed.mistake if named else next((mistake_key(line) for line in localised
                                                         if mistake_key(line)), None)
                if reordered:
                    key = ("frequencies_reversed" if "d_head axis" in reordered and "reversed" in reordered
                           else "table_axis_reordered")
                    localised.insert(0, f"  {LIKELY} your {name} table is the right one, {reordered}"
                                        + (": the frequencies run from the slowest to the fastest"
                                           if "d_head axis" in reordered and "reversed" in reordered
                                           else ""))
                raise CheckFailed("\n".join([str(failed), *localised]), mistake=key) from None


def _judge_rotation(case: Case, outputs: dict) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = _qk(case)
    cos, sin = rotation_table(case)
    expected, _ = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    compare(f"apply_rope(q {list(q.shape)}, cos and sin of seeded angles)", outputs.get("q_rotated"), expected, X_DIMS,
            mistakes=lambda: rotation_mistakes(q, cos, sin), hint="x * cos + rotate_half(x) * sin.",
            reading=lambda actual: read_rotation(outputs.get("map")))


exercise = Exercise(NOTEBOOK, "RoPE", produce, judge, forbidden=(FORBIDDEN,), defaults=DEFAULTS)
check_rope = exercise.checker(
    "Grade `rope_cos_sin` and `apply_rope` against transformers' Llama rotary embedding.",
    learner=lambda rope_cos_sin, apply_rope: (rope_cos_sin, apply_rope))
