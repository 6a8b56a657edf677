"""Grader for 04_mlp: `gelu_new` (hook_pre -> hook_post) and `MLP` (ln2.hook_out -> hook_mlp_out).

The two are graded apart: `MLP`'s check runs the course's `gelu_new` under the learner's name
for it, so a wrong `gelu_new` costs the GELU exercise only; an MLP whose output matches one built
with a usual wrong activation calls another activation than `gelu_new`, and the message says so.
"""
from graders.judging.notebook import ExampleBug, Notebook
import math

import torch
import torch.nn.functional as F
from torch import nn

import graders.reference.components as course
from graders.judging.cases import Case, activations, rand_float, unseen_variant
from graders.judging.exercise import Exercise
from graders.judging.learner import loaded
from graders.reference.store import course_component, part
from graders.reference.config import Config
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, mistake_key, with_fix
from graders.exercises.common.diagnosis import crash, is_crash
from graders.judging.learner import Forbidden, run_learner
from graders.integrity.library_kernels import GELU_KERNELS, TORCH_REFERENCES

GELU_FORBIDDEN = Forbidden(
    "gelu_new",
    targets=[(F, "gelu"), (nn.GELU, "forward"), (course, "gelu_new")],
    source_words=["F.gelu", "functional.gelu", "nn.GELU", "NewGELU", "gelu_pytorch_tanh",
                  "graders.reference.components"],
    kernels=GELU_KERNELS, library_code=TORCH_REFERENCES,
)
MLP_FORBIDDEN = Forbidden(
    "the MLP",
    targets=[(course.MLP, "forward"), (nn.Linear, "forward")],
    source_words=["graders.reference.components", "nn.Linear"],
    # F.gelu in the MLP, as in gelu_new: the exercise calls gelu_new (and the check runs the course's)
    kernels=GELU_KERNELS, kernels_compute="gelu_new", instead="with its four parameters and gelu_new",
)
LINSPACE = (-6.0, 6.0, 1201)
GELU_FIX = "return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))"
GELU_HINT = ("gelu_new is GPT-2's tanh approximation of the GELU x * Phi(x), not the exact one: compare "
             "your line with the notebook's formula, term by term.")


def reference_gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's activation, computed in float64 (the tanh approximation of x * Phi(x))."""
    x = x.double()
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def activation_mistakes(x: torch.Tensor) -> dict:
    """What the usual wrong activations output on `x` (float64), by description."""
    x = x.double()
    c = math.sqrt(2.0 / math.pi)
    return {
        Mistake("exact_gelu", "the exact GELU, x * Phi(x) with the erf (what F.gelu / nn.GELU compute by "
                "default); GPT-2 uses the tanh approximation"): 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
        Mistake("relu", "ReLU instead of GELU"): x.clamp(min=0),
        Mistake("sigmoid_approximation", "the sigmoid approximation x * sigmoid(1.702 x); GPT-2 uses the tanh one"):
            x * torch.sigmoid(1.702 * x),
        Mistake("no_cubic_term", "the cubic term is missing: inside the tanh, x gets a small multiple of its cube "
                "added"):
            0.5 * x * (1.0 + torch.tanh(c * x)),
        Mistake("no_sqrt_2_over_pi", "the factor sqrt(2/pi) is missing inside the tanh"):
            0.5 * x * (1.0 + torch.tanh(x + 0.044715 * x.pow(3))),
        Mistake("squared_not_cubed", "x**2 instead of x**3 in the cubic term"):
            0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * x.pow(2)))),
        Mistake("no_half", "the leading factor 0.5 is missing"): x * (1.0 + torch.tanh(c * (x + 0.044715 * x.pow(3)))),
        Mistake("no_one_plus", "the `1 +` before the tanh is missing"):
            0.5 * x * torch.tanh(c * (x + 0.044715 * x.pow(3))),
        Mistake("identity", "no activation at all (returns x unchanged)"): x,
    }


# --- gelu_new -------------------------------------------------------------------------------

def inputs_gelu(case: Case) -> dict:
    return {"x": activations(case)[f"blocks.{case.block}.mlp.hook_pre"]}


def produce_gelu(gelu_new, case: Case, inputs: dict) -> dict:
    if not callable(gelu_new) or isinstance(gelu_new, type):
        raise CheckFailed(f"gelu_new: expected your function, got {gelu_new!r}.")
    grid = torch.linspace(*LINSPACE)
    pre = inputs["x"]
    pre_before = pre.clone()
    return {
        "grid_out": run_learner("gelu_new", gelu_new, grid, forbidden=GELU_FORBIDDEN),
        "out": run_learner("gelu_new", gelu_new, pre, forbidden=GELU_FORBIDDEN),
        "input_modified": torch.tensor(not torch.equal(pre, pre_before)),
    }


def judge_gelu(case: Case, outputs: dict) -> None:
    grid = torch.linspace(*LINSPACE)
    compare(f"gelu_new on torch.linspace{LINSPACE}", outputs["grid_out"], reference_gelu_new(grid),
            ("x",), mistakes=lambda: activation_mistakes(grid), hint=GELU_HINT, fix=GELU_FIX)
    if bool(outputs["input_modified"]):
        raise CheckFailed(with_fix("gelu_new changed its input tensor in place (e.g. `x *= ...` or "
                                   "`x.pow_(3)`). Compute new tensors instead.", GELU_FIX),
                          mistake="modifies_input_in_place")
    acts = activations(case)
    b = f"blocks.{case.block}.mlp"
    compare(f"gelu_new on {b}.hook_pre (compared with {b}.hook_post)", outputs["out"],
            acts[f"{b}.hook_post"], ("batch", "position", "d_mlp"),
            mistakes=lambda: activation_mistakes(acts[f"{b}.hook_pre"]), hint=GELU_HINT, fix=GELU_FIX)


gelu = Exercise("04_mlp", "gelu_new", produce_gelu, judge_gelu,
                 inputs=inputs_gelu, forbidden=(GELU_FORBIDDEN,))
check_gelu_new = gelu.checker(
    "Grade the learner's `gelu_new` function (visible check: block 0 on the reference text).")


# --- MLP ------------------------------------------------------------------------------------

# The corrected lines of the MLP (the notebook's names), and which a named mistake gets.
HIDDEN_LAYER = ('pre = einops.einsum(normalized_resid_mid, self.W_in, "batch posn d_model, d_model d_mlp -> '
          'batch posn d_mlp") + self.b_in')
ACTIVATION = "post = gelu_new(pre)"
OUTPUT = ('return einops.einsum(post, self.W_out, "batch posn d_mlp, d_mlp d_model -> batch posn d_model") '
          '+ self.b_out')
MLP_FIX = f"{HIDDEN_LAYER}; {ACTIVATION}; {OUTPUT}"
MLP_HINT = ("the MLP is two layers, each with its bias, and gelu_new between them, on an input of shape "
            "[batch, position, d_model]: see the notebook's MLP.")
CALLS_ANOTHER_ACTIVATION = ("the MLP's activation is {name}. This check runs the course's gelu_new in "
                            "place of yours, so your MLP calls another activation: call gelu_new")
NO_B_IN = Mistake("no_b_in", "b_in is missing: the hidden layer has a bias, added before gelu_new")
NO_B_OUT = Mistake("no_b_out", "b_out is missing: the output projection has a bias too")
B_IN_AFTER = Mistake("b_in_after_activation", "b_in is added after the activation instead of before it")
ADDS_INPUT = Mistake("adds_input", "the MLP adds its input back (the residual connection belongs to the block, "
                     "not the MLP): return only the MLP's output")
ACTIVATION_LAST = Mistake("activation_after_output", "the activation is applied after the output projection: "
                          "gelu_new goes between the two layers, on the hidden layer")
ACTIVATION_BEFORE_B_OUT = Mistake("activation_after_output_before_b_out", "the activation is applied after the "
                                  "output projection, before b_out: gelu_new goes between the two layers, on the "
                                  "hidden layer")
ACTIVATION_TWICE = Mistake("activation_twice", "the activation is applied twice, after each layer: only the hidden "
                           "layer goes through gelu_new")


def calls_another_activation(name: Mistake) -> Mistake:
    """The MLP's mistake of calling the activation `name` (one of activation_mistakes') instead of
    gelu_new; its key is that activation's, prefixed "activation_" ("activation_relu")."""
    return Mistake(f"activation_{mistake_key(name)}", CALLS_ANOTHER_ACTIVATION.format(name=name))


MLP_FIXES = {
    **{calls_another_activation(name): ACTIVATION for name in activation_mistakes(torch.zeros(1))},
    NO_B_IN: HIDDEN_LAYER, B_IN_AFTER: HIDDEN_LAYER, NO_B_OUT: OUTPUT, ADDS_INPUT: OUTPUT, ACTIVATION_TWICE: OUTPUT,
    ACTIVATION_LAST: f"{ACTIVATION}; {OUTPUT}", ACTIVATION_BEFORE_B_OUT: f"{ACTIVATION}; {OUTPUT}",
}


def mlp_mistakes(x: torch.Tensor, w: dict) -> dict:
    """What an MLP with each usual mistake outputs on `x`, by description (their fixes: MLP_FIXES)."""
    x = x.double()
    W_in, b_in, W_out, b_out = (w[k].double() for k in ("W_in", "b_in", "W_out", "b_out"))
    pre = x @ W_in + b_in
    mistakes = {}
    for name, post in activation_mistakes(pre).items():
        mistakes[calls_another_activation(name)] = post @ W_out + b_out
    right = reference_gelu_new(pre) @ W_out
    mistakes.update({
        NO_B_IN: reference_gelu_new(x @ W_in) @ W_out + b_out,
        NO_B_OUT: right,
        B_IN_AFTER: (reference_gelu_new(x @ W_in) + b_in) @ W_out + b_out,
        ADDS_INPUT: right + b_out + x,
        ACTIVATION_LAST: reference_gelu_new(pre @ W_out + b_out),
        ACTIVATION_BEFORE_B_OUT: reference_gelu_new(pre @ W_out) + b_out,
        ACTIVATION_TWICE: reference_gelu_new(reference_gelu_new(pre) @ W_out + b_out),
    })
    return mistakes


def inputs_mlp(case: Case) -> dict:
    return {"x": activations(case)[f"blocks.{case.block}.ln2.hook_out"]}


def produce_mlp(MLP, case: Case, inputs: dict) -> dict:
    prefix = f"blocks.{case.block}.mlp"
    module = loaded("MLP", MLP, prefix)
    x = inputs["x"]
    x_before = x.clone()
    random_input = rand_float(case.seed, 2, 4, Config().d_model)
    try:
        return {
            "random_out": run_learner("MLP", module, random_input, forbidden=MLP_FORBIDDEN),
            "out": run_learner("MLP", module, x, forbidden=MLP_FORBIDDEN),
            "unseen_out": run_learner("MLP", module, unseen_variant(x, case.seed), forbidden=MLP_FORBIDDEN),
            "input_modified": torch.tensor(not torch.equal(x, x_before)),
        }
    except CheckFailed as failure:
        if is_crash(failure) and any(words in str(failure) for words in SHAPE_CRASHES):
            raise crash("MLP", failure, "an input of shape [batch, position, d_model]",
                        SHAPE_HINT) from failure.__cause__
        raise


SHAPE_CRASHES = ("cannot be multiplied", "must match the size", "does not broadcast",
                 "size mismatch", "Shape mismatch", "inconsistent size")
SHAPE_HINT = Mistake("weight_transposed", "a weight matrix is used transposed (or the two are swapped). They are "
                     "stored input-first: W_in is [d_model, d_mlp] and W_out is [d_mlp, d_model], so x @ W_in "
                     "and post @ W_out work without a transpose (x is [batch, position, d_model], the "
                     "hidden layer [batch, position, d_mlp]).")


def judge_mlp(case: Case, outputs: dict) -> None:
    dims = ("batch", "position", "d_model")
    check_shape("MLP output on a random [2, 4, d_model] input", outputs["random_out"],
                (2, 4, Config().d_model), dims)
    if bool(outputs["input_modified"]):
        raise CheckFailed("MLP changed its input tensor in place. Compute new tensors instead: "
                          "the residual stream must not be modified by reading it.",
                          mistake="modifies_input_in_place")
    b = f"blocks.{case.block}"
    acts = activations(case)
    compare(f"MLP output ({b}.hook_mlp_out)", outputs["out"], acts[f"{b}.hook_mlp_out"], dims,
            mistakes=lambda: mlp_mistakes(acts[f"{b}.ln2.hook_out"], part(f"{b}.mlp")),
            hint=MLP_HINT, fix=MLP_FIX, fixes=MLP_FIXES)
    # Inputs no file holds: the expected outputs are computed here, with the course's MLP.
    course = course_component("MLP", f"{b}.mlp")
    for key, what, x in (("random_out", "a random [2, 4, d_model] input",
                          rand_float(case.seed, 2, 4, Config().d_model)),
                         ("unseen_out", "a rescaled, noisy input that no file holds",
                          unseen_variant(acts[f"{b}.ln2.hook_out"], case.seed))):
        with torch.no_grad():
            expected = course(x)
        compare(f"MLP output ({b}) on {what}", outputs[key], expected, dims,
                mistakes=lambda: mlp_mistakes(x, part(f"{b}.mlp")), hint=MLP_HINT, fix=MLP_FIX, fixes=MLP_FIXES)


# The learner's MLP runs with the course's `gelu_new` in place of theirs, which has a check of its
# own: a mistake in the activation costs that check only.
mlp = Exercise("04_mlp", "MLP", produce_mlp,
               judge_mlp,
               inputs=inputs_mlp, forbidden=(MLP_FORBIDDEN,), course_parts={"gelu_new": course.gelu_new})
check_mlp = mlp.checker(
    "Grade the learner's `MLP` class (visible check: block 0 on the reference text).")


NOTEBOOK = Notebook(
    '04_mlp',
    # The classic mistake of the example class's buggy student: x**2 in gelu_new's cubic term.
    ExampleBug('gelu_answer', '0.044715 * x.pow(3)',
               '0.044715 * x.pow(2)',
               costs=('gelu_test',), named='x**2 instead of x**3'),
    course_code=('reference/components.py',),
)
