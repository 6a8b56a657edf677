"""Notebook 08's sampler and sample_next_token graders (graders/exercises/nb08/samplers.py): correct
variants pass, each catalogued mistake fails with its diagnosis."""
import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference

from course_code import course_code_allowed
from catalog_helpers import fails_with
from catalog_08_shared import INF, passes


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


# --- the basic sampler -------------------------------------------------------------------------

def _gumbel_max(logits, generator):
    u = torch.rand(logits.shape, generator=generator)
    return (logits - (-u.log()).log()).argmax(-1)


def _inverse_cdf(logits, generator):
    cdf = logits.softmax(-1).cumsum(-1)
    u = torch.rand(logits.shape[0], 1, generator=generator)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=logits.shape[-1] - 1)[:, 0]


@pytest.mark.parametrize("fn", [reference.sample_basic, _gumbel_max, _inverse_cdf])
def test_sampler_correct_variants_pass(fn):
    passes(nb08.check_sampler, fn)


def _sampler_global_seed(logits, generator):
    torch.manual_seed(generator.initial_seed())
    return torch.multinomial(logits.softmax(-1), 1)[:, 0]


def _sampler_loop_argmax(logits, generator):
    return torch.tensor([int(row.argmax()) for row in logits])


@pytest.mark.parametrize("fn, message", [
    (lambda l, g: l.argmax(-1), "sample_basic always takes the most likely token (argmax)"),
    (_sampler_loop_argmax, "sample_basic always takes the most likely token (argmax)"),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1)[:, 0],
     "sample_basic draws from torch's global random generator, not from the generator it is given"),
    (_sampler_global_seed, "used or reseeded torch's global random generator"),
    (lambda l, g: torch.multinomial(l.softmax(0), 1, generator=g)[:, 0],
     "Likely mistake: softmax over the batch dimension"),
    (lambda l, g: torch.multinomial(F.softmax(l, dim=0), 1, generator=g).squeeze(-1),
     "Likely mistake: softmax over the batch dimension"),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1, generator=g),
     "Likely mistake: the [batch, 1] result of torch.multinomial"),
    (lambda l, g: torch.multinomial((l > -INF).float(), 1, generator=g)[:, 0],
     "Likely mistake: sampling uniformly"),
    (lambda l, g: torch.multinomial(l.softmax(-1).softmax(-1) * (l > -INF), 1, generator=g)[:, 0],
     "Likely mistake: the softmax is taken twice"),
    (lambda l, g: torch.multinomial((2 * l).softmax(-1), 1, generator=g)[:, 0],
     "Likely mistake: the logits are doubled"),
    (lambda l, g: torch.multinomial(torch.ones_like(l), 1, generator=g)[:, 0],
     ("probability 0", "Likely mistake: the logits are ignored")),
    (lambda l, g: torch.multinomial(l.softmax(-1), 1, generator=torch.Generator().manual_seed(0))[:, 0],
     ("sample_basic ignores the generator's seed", "a generator of its own with a fixed seed")),
])
def test_sampler_mistakes_fail(fn, message):
    fails_with(nb08.check_sampler, fn, expected=message, first_line=True)


# --- sample_next_token ------------------------------------------------------------------------

def _pipeline(order="ptkq", zero="greedy", temper="divide"):
    """sample_next_token with its steps in `order`: p(enalty), t(emperature), k, q (top-p).
    `zero`: "greedy" (argmax of the penalised logits), "raw" (argmax of the raw logits, the
    penalty forgotten), "divide" (no special case: divides by 0)."""
    def sample(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
        if temperature == 0.0 and zero == "greedy":
            return reference.apply_frequency_penalty(input_ids, logits, freq_penalty).argmax(-1)
        if temperature == 0.0 and zero == "raw":
            return logits.argmax(-1)
        steps = {"p": lambda l: reference.apply_frequency_penalty(input_ids, l, freq_penalty),
                 "t": lambda l: l / temperature if temper == "divide" else l * temperature,
                 "k": lambda l: reference.apply_top_k(l, top_k) if top_k else l,
                 "q": lambda l: reference.apply_top_p(l, top_p) if top_p < 1 else l}
        for step in order:
            logits = steps[step](logits)
        return reference.sample_basic(logits, generator)
    return sample


def _pipeline_gumbel(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
    logits = reference.next_token_logits(input_ids, logits, max(temperature, 1e-8), top_k, top_p, freq_penalty)
    return _gumbel_max(logits, generator)


def _pipeline_greedy_first_loop(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0,
                                freq_penalty=0.0):
    """Correct, written with a per-row loop for the penalty and greedy_search at temperature 0."""
    logits = logits.clone()
    for row in range(input_ids.shape[0]):
        for token in input_ids[row].tolist():
            logits[row, token] -= freq_penalty
    if temperature == 0:
        return reference.greedy_search(logits)
    return reference.sample_next_token(input_ids, logits, generator, temperature, top_k, top_p, 0.0)


def _pipeline_zero_before_penalty(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0,
                                  freq_penalty=0.0):
    if temperature == 0:                 # greedy on the raw logits: the penalty is forgotten
        return reference.greedy_search(logits)
    return reference.sample_next_token(input_ids, logits, generator, temperature, top_k, top_p, freq_penalty)


@pytest.mark.parametrize("fn", [reference.sample_next_token, _pipeline(), _pipeline_gumbel,
                                _pipeline_greedy_first_loop])
def test_pipeline_correct_variants_pass(fn):
    passes(nb08.check_sample_next_token, fn)


@pytest.mark.parametrize("fn, message", [
    (_pipeline("pkqt"), "Likely mistake: the temperature is applied after top-k/top-p"),
    (_pipeline("tpkq"), "Likely mistake: the frequency penalty is applied after the temperature"),
    (_pipeline("tkq"), "Likely mistake: the frequency penalty is ignored"),
    (_pipeline("pkq"), "Likely mistake: the temperature is ignored"),
    (_pipeline("ptq"), "Likely mistake: top_k is ignored"),
    (_pipeline("ptk"), "Likely mistake: top_p is ignored"),
    (_pipeline(zero="divide"), "temperature 0 means greedy decoding"),
    (_pipeline(temper="multiply"), "Likely mistake: the temperature multiplies the logits instead of dividing"),
    (_pipeline(zero="raw"), "Likely mistake: at temperature 0 the frequency penalty is ignored"),
    (_pipeline_zero_before_penalty, "Likely mistake: at temperature 0 the frequency penalty is ignored"),
])
def test_pipeline_mistakes_fail(fn, message):
    fails_with(nb08.check_sample_next_token, fn, expected=message, first_line=True)
