"""Notebook 10's RoPE grader (graders/exercises/nb10/rope.py): correct variants (in other styles) pass,
each catalogued mistake fails with its name."""
import pytest
import torch

from graders.exercises import nb10
from graders.exercises.nb10 import reference as ref
from graders.judging.compare import CheckFailed
from course_code import course_code_allowed
from catalog_helpers import fails_with


# The variants are built on the course's reference decoder (a subclass with one method changed).
reference_code_allowed = course_code_allowed(ref)


# --- RoPE --------------------------------------------------------------------------------------

def _table(exponent=2, base=None, interleaved=False, float64=False, swapped=False, degrees=False, first=0):
    def rope_cos_sin(positions, d_head, theta):
        dtype = torch.float64 if float64 else torch.float32
        i = torch.arange(d_head // 2, dtype=dtype)
        angles = (positions.to(dtype)[:, None] + first) * (base or theta) ** (-exponent * i / d_head)
        angles = torch.rad2deg(angles) if degrees else angles
        angles = angles.repeat_interleave(2, -1) if interleaved else angles.repeat(1, 2)
        cos, sin = angles.cos().float(), angles.sin().float()
        return (sin, cos) if swapped else (cos, sin)
    return rope_cos_sin


def _apply(kind="halves"):
    def apply_rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        if kind == "interleaved":
            return ref.apply_rope_interleaved(x, cos, sin)
        neighbours = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)     # the paper's pairs
        if kind == "neighbours":
            return x * cos + neighbours * sin
        if kind == "neighbours_every_other":
            c, s = cos[..., ::2], sin[..., ::2]
            return torch.stack([x[..., ::2] * c - x[..., 1::2] * s, x[..., ::2] * s + x[..., 1::2] * c], -1).flatten(-2)
        if kind == "wrong_way":
            return x * cos + torch.cat([x2, -x1], -1) * sin
        if kind == "cos_only":
            return x * cos
        if kind == "swapped":
            return x * sin + torch.cat([-x2, x1], -1) * cos
        return x * cos + torch.cat([-x2, x1], -1) * sin
    return apply_rope


@pytest.mark.parametrize("table", [_table(), _table(float64=True), ref.rope_cos_sin])
def test_rope_correct_variants_pass(table):
    nb10.check_rope(table, _apply())
    nb10.check_rope(table, _apply(), seed=2, batch=1, seq=30)


@pytest.mark.parametrize("table, apply, expected", [
    (_table(exponent=1), _apply(), "Likely mistake: the frequency exponent is off by a factor of 2"),
    (_table(base=10000.0), _apply(), "Likely mistake: a wrong base"),
    (_table(interleaved=True), _apply(), "Likely mistake: the frequencies are interleaved"),
    (_table(), _apply("interleaved"), "Likely mistake: apply_rope pairs neighbours (0, 1), (2, 3), ...: the paper's "
     "convention"),
    (_table(), _apply("neighbours"), "Likely mistake: apply_rope pairs neighbours (0, 1), (2, 3), ...: the paper's "
     "convention, a rotation with a table of its own"),
    (_table(), _apply("neighbours_every_other"), "your code reads each neighbour pair's angle from every other column"),
    (_table(), _apply("wrong_way"), "Likely mistake: the rotation turns the wrong way"),
    (_table(), _apply("cos_only"), "Likely mistake: the sin term is missing"),
    (_table(), _apply("swapped"), "Likely mistake: cos and sin are swapped in the rotation"),
    (_table(swapped=True), _apply(), "Likely mistake: cos and sin are swapped"),
    (_table(degrees=True), _apply(), "Likely mistake: the angles are in degrees"),
    (_table(first=1), _apply(), "Likely mistake: the positions start at 1"),
    (_table(exponent=-2), _apply(), "Likely mistake: the exponent's sign is flipped"),
    (_table(exponent=-2, float64=True), _apply(), "Likely mistake: the exponent's sign is flipped"),
    (_table(degrees=True, interleaved=True), _apply(), "Likely mistake: the frequencies are interleaved (f0, f0, "
     "f1, f1, ...) as in the paper's pairs: transformers' Llama rotates halves, so the table holds them twice in a "
     "row; and the angles are in degrees"),
    (_table(exponent=1, swapped=True), _apply(), "Likely mistake: the frequency exponent is off by a factor of 2: "
     "theta ** (-2i / d_head) for i = 0 .. d_head/2 - 1; and cos and sin are swapped"),
])
def test_rope_mistakes_are_named(table, apply, expected):
    fails_with(nb10.check_rope, table, apply, expected=expected)


def test_the_paper_s_rope_reports_both_functions_in_one_run_each_fix_last():
    """One test cell checks rope_cos_sin and apply_rope: every one that differs is reported at once,
    each in words, their corrected code on the message's last lines."""
    with pytest.raises(CheckFailed) as failure:
        nb10.check_rope(_table(interleaved=True), _apply("neighbours"))
    message = str(failure.value)
    assert message.startswith("rope_cos_sin(") and "\napply_rope(q " in message, message
    assert "Likely mistake: the frequencies are interleaved" in message.splitlines()[0]
    assert "That is not a rotation" not in message and "a rotation with a table of its own" in message
    assert message.splitlines()[-2:] == [
        "  Show the fix: torch.cat([freqs, freqs], dim=-1)",
        "  Show the fix: x * cos + torch.cat([-x2, x1], dim=-1) * sin   # x1, x2 = x.chunk(2, dim=-1)"], message


def _frequencies_counted_from_1(positions, d_head, theta):
    i = torch.arange(1, d_head // 2 + 1, dtype=torch.float32)
    angles = positions.float()[:, None] * theta ** (-2 * i / d_head)
    return torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()


def _sin_doubled(positions, d_head, theta):
    cos, sin = _table()(positions, d_head, theta)
    return cos, 2 * sin


def _frequencies_counted_down(positions, d_head, theta):     # invented here, in no catalog
    i = torch.arange(d_head // 2 - 1, -1, -1, dtype=torch.float32)
    angles = positions.float()[:, None] * theta ** (-2 * i / d_head)
    return torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()


def _positions_reversed(positions, d_head, theta):     # invented here, in no catalog
    return _table()(positions.flip(0), d_head, theta)


@pytest.mark.parametrize("table, expected", [
    (_frequencies_counted_down, "Likely mistake: your cos table is the right one, its d_head axis with each "
                                "half reversed: the frequencies run from the slowest to the fastest"),
    (_positions_reversed, "Likely mistake: your cos table is the right one, its position axis reversed"),
])
def test_a_table_with_an_axis_reordered_is_named(table, expected):
    fails_with(nb10.check_rope, table, _apply(), expected=expected)


@pytest.mark.parametrize("table, expected", [
    (_frequencies_counted_from_1, "The angle per position differs in 22 of 32 columns, first in column 0: 0.5623 "
                                  "rad where f = theta ** (-2i / d_head) with i = j mod 16 is 1."),
    (_table(first=3), "Position 0's angles are not 0"),
    (_sin_doubled, "cos² + sin² is not 1 at [position 1, d_head 0]"),
])
def test_a_table_no_listed_mistake_explains_is_read_as_angles(table, expected):
    """A table outside the catalog: the check says where it departs, read as angles (position
    0's, each column's per position) or as no angle at all."""
    fails_with(nb10.check_rope, table, _apply(), expected=expected)


def _rotate_by(rotate_half):
    def apply_rope(x, cos, sin):
        return x * cos + rotate_half(x) * sin
    return apply_rope


def _halves(x):
    return x.chunk(2, dim=-1)


def _result_halves_exchanged(x, cos, sin):
    y = _apply()(x, cos, sin)
    return torch.cat(_halves(y)[::-1], -1)


@pytest.mark.parametrize("apply, expected", [
    # held-out mistake: rotate_half's halves in the wrong order
    (_rotate_by(lambda x: torch.cat([_halves(x)[0], -_halves(x)[1]], -1)),
     "Likely mistake: your rotate_half(x) is cat([x1, -x2]) (its two halves in the wrong order), where it is "
     "cat([-x2, x1]) (x1, x2: the halves of x). It mixes no two dimensions"),
    # invented here, in no catalog
    (_rotate_by(lambda x: torch.cat(_halves(x)[::-1], -1)),
     "Likely mistake: your rotate_half(x) is cat([x2, x1]), where it is cat([-x2, x1]) (x1, x2: the halves of x). "
     "That is not a rotation: it changes the vectors' lengths."),
    (_rotate_by(lambda x: torch.roll(x, x.shape[-1] // 4, -1)),
     "Likely mistake: your rotate_half(x) is the vector with x[(i + 24) mod 32] at each dimension i"),
    (_result_halves_exchanged, "Likely mistake: your apply_rope computes cat([x2, x1]) * cos + cat([x1, -x2]) * sin"),
    (_rotate_by(lambda x: torch.cat([-_halves(x)[1], _halves(x)[0]], -1).flip(-1)),
     "Likely mistake: your rotate_half(x) is the vector x[15], x[14], x[13], x[12], x[11], x[10], ..., where it is "
     "cat([-x2, x1])"),
])
def test_apply_rope_mistakes_nobody_listed_are_read_from_its_matrix(apply, expected):
    """apply_rope is linear in x: its matrix at each position, fitted as x' * cos + r(x) * sin,
    says what it does."""
    fails_with(nb10.check_rope, _table(), apply, expected=expected)
