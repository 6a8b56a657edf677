"""Notebook 08 as a whole: a notebook whose every part is wrong loses only those parts' checks."""
import pytest
import torch

from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference
from graders.judging.compare import CheckFailed

from course_code import course_code_allowed
from catalog_helpers import fails_with


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


# --- One mistake, one exercise -------------------------------------------------------

WRONG_PARTS = '''
def greedy_search(logits):
    return logits.argmin(dim=-1)


def apply_temperature(logits, temperature):
    return logits * temperature


def apply_frequency_penalty(input_ids, logits, freq_penalty):
    return logits


def apply_top_k(logits, k):
    return logits


def apply_top_p(logits, top_p):                  # the example class's: one token too few
    if top_p >= 1.0:
        return logits.clone()
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    remove_sorted = sorted_logits.double().softmax(dim=-1).cumsum(dim=-1) >= top_p
    remove_sorted[..., 0] = False
    return logits.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))


def sample_basic(logits, generator):
    return logits.argmax(dim=-1)


def forward_with_cache(model, new_tokens, cache=None):
    return reference.forward_with_cache(model, new_tokens, cache, mistake="offset")
'''

SOLUTION_COMPOSITES = '''
def sample_next_token(input_ids, logits, generator, temperature=1.0, top_k=0, top_p=1.0, freq_penalty=0.0):
    logits = apply_frequency_penalty(input_ids, logits, freq_penalty)
    if temperature == 0.0:
        return greedy_search(logits)
    logits = apply_temperature(logits, temperature)
    if top_k > 0:
        logits = apply_top_k(logits, top_k)
    if top_p < 1.0:
        logits = apply_top_p(logits, top_p)
    return sample_basic(logits, generator)


@torch.no_grad()
def generate(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    tokens = input_ids
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        next_id = sample_next_token(tokens, model(tokens[:, -model.cfg.n_ctx:])[:, -1], generator, **sampling)
        if eos_token_id is not None:
            next_id = next_id.masked_fill(finished, eos_token_id)
            finished = finished | (next_id == eos_token_id)
        tokens = torch.cat([tokens, next_id[:, None]], dim=-1)
        if eos_token_id is not None and bool(finished.all()):
            break
    return tokens


@torch.no_grad()
def generate_with_cache(model, input_ids, max_new_tokens):
    if input_ids.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"prompt + max_new_tokens exceed the context, n_ctx = {model.cfg.n_ctx}")
    logits, cache = forward_with_cache(model, input_ids)
    tokens = input_ids
    for step in range(max_new_tokens):
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, next_id], dim=-1)
        if step + 1 < max_new_tokens:
            logits, cache = forward_with_cache(model, next_id, cache)
    return tokens
'''


def test_a_wrong_part_costs_only_its_own_check():
    """A notebook whose every part is wrong, its composites right: each part fails its own check,
    and sample_next_token, generate and generate_with_cache pass theirs, which run the course's
    parts under the notebook's names (08 charged the example class's top-p twice), and
    give the learner's back afterwards."""
    notebook = {"torch": torch, "reference": reference}
    exec(WRONG_PARTS + SOLUTION_COMPOSITES, notebook)
    parts = {name: notebook[name] for name in (*reference.GENERATION_PARTS, "forward_with_cache")}
    fails_with(nb08.check_top_p, parts["apply_top_p"], expected="one token too few", first_line=True)
    for check, name in ((nb08.check_greedy, "greedy_search"), (nb08.check_temperature, "apply_temperature"),
                        (nb08.check_frequency_penalty, "apply_frequency_penalty"),
                        (nb08.check_top_k, "apply_top_k"), (nb08.check_sampler, "sample_basic"),
                        (nb08.check_forward_with_cache, "forward_with_cache")):
        with pytest.raises(CheckFailed):
            check(parts[name])
    nb08.check_sample_next_token(notebook["sample_next_token"])
    nb08.check_generate(notebook["generate"])
    nb08.check_generate_with_cache(notebook["generate_with_cache"])
    assert all(notebook[name] is part for name, part in parts.items())
