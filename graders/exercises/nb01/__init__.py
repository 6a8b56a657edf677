"""Grader for 01_layernorm: `LayerNorm` against the reference's ln1 / ln2 / ln_final."""
from graders.judging.notebook import ExampleBug, Notebook
import torch
import torch.nn.functional as F
from torch import nn

from graders.judging.cases import Case, activations, rand_float, unseen_variant
from graders.judging.exercise import Exercise
from graders.judging.learner import loaded
from graders.reference.store import course_component, part
from graders.reference.config import Config
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, with_fix
from graders.judging.learner import Forbidden, reads_global, run_learner
from graders.integrity.library_kernels import NORMALISATION_KERNELS, TORCH_REFERENCES

DIMS = ("batch", "position", "d_model")
FORBIDDEN = Forbidden(
    "LayerNorm",
    targets=[(F, "layer_norm"), (torch, "layer_norm"), (nn.LayerNorm, "forward"),
             (F, "group_norm"), (F, "instance_norm")],
    source_words=["nn.LayerNorm", "F.layer_norm", "layer_norm", "functional.layer_norm"],
    kernels=NORMALISATION_KERNELS, library_code=TORCH_REFERENCES,
)


def _where(case: Case) -> tuple[str, str, str]:
    """(weights prefix, input hook, output hook) graded for this case's block."""
    if case.block == -1:
        return "ln_final", "blocks.11.hook_resid_post", "ln_final.hook_out"
    b = f"blocks.{case.block}"
    return f"{b}.ln1", f"{b}.hook_resid_pre", f"{b}.ln1.hook_out"


SAMPLE_VARIANCE = Mistake("sample_variance", "sample variance: it divides by d_model - 1 (torch.var's default); "
                          "LayerNorm's variance is the population one, which divides by d_model")
EPS_OUTSIDE = Mistake("eps_outside_root", "eps added outside the square root: it belongs inside, added to the variance")
NOT_CENTRED = Mistake("not_centred", "the mean is not subtracted before dividing (centre first)")
UNCENTRED_VARIANCE = Mistake("uncentred_variance", "the variance is taken of the uncentred x (the mean of its "
                             "squares): square the centred values")
WRONG_DIM = ("normalising over the wrong dimension: {what} taken across positions (dim=1 of "
             "[batch, posn, d_model]); take {it} over d_model, the last dimension")
CENTRE = "centred = residual - residual.mean(dim=-1, keepdim=True)"
VARIANCE = "variance = centred.pow(2).mean(dim=-1, keepdim=True)"
NORMALISE = "normalised = centred / (variance + self.cfg.layer_norm_eps).sqrt()"
SCALE_SHIFT = "return normalised * self.w + self.b"
FIXES = {
    SAMPLE_VARIANCE: VARIANCE,
    EPS_OUTSIDE: NORMALISE,
    Mistake("rms_style", "RMS-style normalisation: the mean is never subtracted (that is RMSNorm); "
            "LayerNorm centres first, then divides by the standard deviation"): CENTRE,
    NOT_CENTRED: CENTRE,
    UNCENTRED_VARIANCE: VARIANCE,
    Mistake("no_scale", "the learned scale w is not applied"): SCALE_SHIFT,
    Mistake("no_shift", "the learned shift b is not added"): SCALE_SHIFT,
    Mistake("divides_by_variance", "dividing by the variance instead of the standard deviation (its square "
            "root)"): NORMALISE,
    Mistake("wrong_dim", WRONG_DIM.format(what="the statistics are", it="them")): f"{CENTRE}; {VARIANCE}",
    Mistake("wrong_dim_sample_variance", WRONG_DIM.format(what="the mean and the (sample) variance are",
                                                          it="them")): f"{CENTRE}; {VARIANCE}",
    Mistake("wrong_dim_mean", WRONG_DIM.format(what="the mean is", it="it")): CENTRE,
}
HINT = ("see the notebook's LayerNorm formula: statistics over d_model, the last dimension; the "
        "population variance (look up torch.var's `unbiased`); eps inside the square root.")


def layernorm_mistakes(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5):
    """What the usual LayerNorm mistakes output on `x`, by description (their fixes: FIXES)."""
    centred = x - x.mean(-1, keepdim=True)
    pop_var = centred.pow(2).mean(-1, keepdim=True)
    outputs = (
        centred / (x.var(-1, keepdim=True, unbiased=True) + eps).sqrt() * w + b,
        centred / (pop_var.sqrt() + eps) * w + b,
        x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w + b,
        x / (pop_var + eps).sqrt() * w + b,
        centred / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w + b,
        centred / (pop_var + eps).sqrt() + b,
        centred / (pop_var + eps).sqrt() * w,
        centred / (pop_var + eps) * w + b,
        (x - x.mean(-2, keepdim=True)) / (x.var(-2, keepdim=True, unbiased=False) + eps).sqrt() * w + b,
        (x - x.mean(-2, keepdim=True)) / (x.var(-2, keepdim=True, unbiased=True) + eps).sqrt() * w + b,
        (x - x.mean(-2, keepdim=True)) / ((x - x.mean(-2, keepdim=True)).pow(2).mean(-1, keepdim=True)
                                          + eps).sqrt() * w + b,
    )
    return dict(zip(FIXES, outputs, strict=True))


def _quiet(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`x` shrunk until its variance is about eps: where eps's place in the formula shows."""
    return x * (eps / x.var(-1, keepdim=True, unbiased=False).mean()).sqrt()


def eps_not_read(case: Case, global_cfg: bool) -> Mistake | None:
    """On a case whose config has another layer_norm_eps: the mistake of a LayerNorm that keeps
    GPT-2's default eps (a literal 1e-5, or the notebook's global `cfg`), None on other cases."""
    wanted, default = case.config().layer_norm_eps, Config().layer_norm_eps
    if wanted == default:
        return None
    how = ("it reads the notebook's global `cfg`, not `self.cfg`, the config the module was built "
           "with" if global_cfg else "read it from the module's own config, not a literal")
    return Mistake("eps_not_from_config", f"eps is not read from cfg.layer_norm_eps (your LayerNorm used "
                   f"{default:g}; this check's config has {wanted:g}): {how}")


def default_eps_output(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What a LayerNorm with GPT-2's default eps outputs on `x`."""
    centred = x - x.mean(-1, keepdim=True)
    return centred / (centred.pow(2).mean(-1, keepdim=True) + Config().layer_norm_eps).sqrt() * w + b


def inputs_layernorm(case: Case) -> dict:
    return {"x": activations(case)[_where(case)[1]]}


def produce_layernorm(LayerNorm, case: Case, inputs: dict) -> dict:
    prefix, _, _ = _where(case)
    cfg = case.config()
    fresh = loaded("LayerNorm", LayerNorm, prefix, cfg)
    random_input = rand_float(case.seed, 2, 4, cfg.d_model)
    x = inputs["x"]
    x_before = x.clone()
    out = run_learner("LayerNorm", fresh, x, forbidden=FORBIDDEN)
    return {
        "random_out": run_learner("LayerNorm", fresh, random_input, forbidden=FORBIDDEN),
        "out": out,
        "quiet_out": run_learner("LayerNorm", fresh, _quiet(x, cfg.layer_norm_eps), forbidden=FORBIDDEN),
        "unseen_out": run_learner("LayerNorm", fresh, unseen_variant(x, case.seed), forbidden=FORBIDDEN),
        "input_modified": torch.tensor(not torch.equal(x, x_before)),
        "reads_global_cfg": torch.tensor(reads_global(LayerNorm, "cfg")),
    }


def judge_layernorm(case: Case, outputs: dict) -> None:
    prefix, source, target = _where(case)
    check_shape("LayerNorm output on a random [2, 4, d_model] input", outputs["random_out"],
                (2, 4, Config().d_model), DIMS)
    if bool(outputs["input_modified"]):
        raise CheckFailed(with_fix("LayerNorm changed its input tensor in place (e.g. `x -= mean`): the "
                                   "residual stream must not be modified by reading it. Compute a new "
                                   "tensor instead.", CENTRE), mistake="modifies_input_in_place")
    acts, w = activations(case), part(prefix)
    eps, global_cfg = case.config().layer_norm_eps, bool(outputs.get("reads_global_cfg", False))
    # The files hold GPT-2's outputs; a case with other settings is judged by the course's
    # LayerNorm built with them.
    course = course_component("LayerNorm", prefix, case.config())

    eps_mistake = eps_not_read(case, global_cfg)
    fixes = {**FIXES, **({eps_mistake: NORMALISE} if eps_mistake else {})}

    def mistakes(x: torch.Tensor) -> dict:
        return {**({eps_mistake: default_eps_output(x, w["w"], w["b"])} if eps_mistake else {}),
                **layernorm_mistakes(x, w["w"], w["b"], eps)}

    with torch.no_grad():
        expected = course(acts[source]) if case.settings() else acts[target]
    compare(f"LayerNorm output ({prefix})", outputs["out"], expected, DIMS,
            mistakes=lambda: mistakes(acts[source]), hint=HINT, fixes=fixes)
    # Real residuals have a variance far above eps; this input's is about eps, so it matters.
    quiet = _quiet(acts[source], eps)
    compare(f"LayerNorm output ({prefix}) on a residual with variance close to eps",
            outputs["quiet_out"], F.layer_norm(quiet, quiet.shape[-1:], w["w"], w["b"], eps), DIMS,
            mistakes=lambda: mistakes(quiet), fixes=fixes,
            hint="this input's variance is about eps, so where eps goes shows: it is added to the "
                 "variance, inside the square root.")
    # Inputs no file holds: the expected outputs are computed here, with the course's LayerNorm.
    for key, what, x in (("random_out", "a random [2, 4, d_model] input",
                          rand_float(case.seed, 2, 4, Config().d_model)),
                         ("unseen_out", "a rescaled, noisy input that no file holds",
                          unseen_variant(acts[source], case.seed))):
        with torch.no_grad():
            expected = course(x)
        compare(f"LayerNorm output ({prefix}) on {what}", outputs[key], expected, DIMS,
                mistakes=lambda: mistakes(x), hint=HINT, fixes=fixes)


layernorm = Exercise("01_layernorm", "LayerNorm", produce_layernorm, judge_layernorm,
                     inputs=inputs_layernorm, forbidden=(FORBIDDEN,))
check_layernorm = layernorm.checker(
    "Grade the learner's `LayerNorm` class (visible check: block 0 on the reference text).")


NOTEBOOK = Notebook(
    '01_layernorm',
    # The classic mistake of the example class's buggy student: sample variance.
    ExampleBug('layernorm_answer', 'centred.pow(2).mean(dim=-1, keepdim=True)',
               'centred.var(dim=-1, keepdim=True)',
               costs=('layernorm_test',), named='sample variance'),
    pictures=1,
    course_code=('reference/components.py',),
)
