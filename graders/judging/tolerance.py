"""The course's one tolerance policy, and the few named exceptions to it.

Every comparison of a learner's numbers with the reference goes through `tolerance`/`close`.
The exceptions below are not comparisons with the reference: each decides something else
(whether an output moved, whether probabilities sum to one, how far a decision is from a tie,
how unlikely a sampler's draws are), and each is named here so that none hides in a grader.
"""
from __future__ import annotations

import math

import torch

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



def close_in_half(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether a float16 output agrees with a float16 reference (notebook 10's RMSNorm in a float16
    model): within HALF_ULPS of float16's rounding, or the policy's tolerance."""
    expected, actual = expected.double(), actual.double()
    slack = HALF_ULPS * 2.0 ** -11 * expected.abs() + tolerance(expected)
    return bool(((actual - expected).abs() <= slack).all())


# --- Named exceptions ------------------------------------------------------------------------
# Whether an output *changed* when an input was perturbed (causality probes): a change below
# this fraction of the output's largest magnitude is rounding, far above it is a real dependence.
CHANGED_RELATIVE = 1e-4
# How far a probability vector may sum from 1 and still count as a distribution (fp32 softmax
# over 50,257 entries rounds by ~1e-6).
PROBABILITY_SUM_SLACK = 1e-4
# A grader picks inputs whose decisions (top-p cutoffs, beam rankings) are at least this far
# from a tie, so that fp32 code and the float64 reference decide the same way.
DECISION_MARGIN = 1e-3
# A correct sampler fails a chi-square test with probability P_VALUE_FLOOR per seeded run.
P_VALUE_FLOOR = 1e-6
# Whether a training step used the gradient backward had just computed (notebook 07's loop
# probe): a cleared gradient, clipped or not, is parallel to the new one up to fp32 rounding
# (cosine 1 - 1e-7); one that still holds earlier steps' gradients (no zero_grad) points
# elsewhere, far below this cosine after a few steps.
GRADIENT_CLEARED_COSINE = 0.999
# How far a clipped gradient's total norm may sit from min(norm, max_grad_norm) (07's loop
# probe): fp32 norms of a few million numbers round at ~1e-6, and clip_grad_norm_ divides by
# norm + 1e-6; a loop that does not clip, or clips each tensor alone, misses by far more.
CLIPPED_NORM_SLACK = 1e-3
# float16 outputs (10's RMSNorm in a float16 model) round at 2**-11 relative: a correct
# float32 normalisation cast back differs from transformers' by where the weight's product is
# rounded (one ulp); computed in float16 instead, x**2 overflows and the output is 0 or nan.
HALF_ULPS = 2
