"""Notebook 08's generate grader (graders/exercises/nb08/generation.py): correct variants pass, each
catalogued mistake fails with its diagnosis."""
import dataclasses

import pytest
import torch

from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference
from graders.judging.compare import CheckFailed

from course_code import course_code_allowed
from catalog_helpers import fails_with
from catalog_08_shared import passes


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


# --- generate ----------------------------------------------------------------------------------

def _generate(crop=True, position=-1, pass_sampling=True, stop="per-row", pad=None, new_only=False,
              crop_to=None):
    """`generate` with a mistake switched on. `stop`: "per-row" (right), "any" (stops when one
    row ends), "all-same-step" (the old rule: every row must sample end-of-text at once),
    "never", "before" (drops the end-of-text token), "unpadded" (finished rows keep sampling).
    `crop_to`: a literal context length in place of model.cfg.n_ctx."""
    def generate(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
        tokens = input_ids
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        for _ in range(max_new_tokens):
            context = tokens[:, -(crop_to or model.cfg.n_ctx):] if crop else tokens
            logits = model(context)[:, position]
            new = reference.sample_next_token(tokens, logits, generator, **(sampling if pass_sampling else {}))
            if eos_token_id is None or stop == "never":
                tokens = torch.cat([tokens, new[:, None]], dim=-1)
                continue
            if stop == "before" and bool((new == eos_token_id).all()):
                break
            if stop in ("per-row", "any"):
                new = new.masked_fill(finished, eos_token_id if pad is None else pad)
            finished = finished | (new == eos_token_id)
            tokens = torch.cat([tokens, new[:, None]], dim=-1)
            done = {"per-row": finished.all(), "unpadded": finished.all(), "any": finished.any(),
                    "all-same-step": (new == eos_token_id).all(), "before": (new == eos_token_id).all()}[stop]
            if bool(done):
                break
        return tokens[:, input_ids.shape[1]:] if new_only else tokens
    return generate


def _generate_cropping_first(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    tokens = input_ids
    for _ in range(max_new_tokens):
        new = reference.sample_next_token(tokens, model(tokens[:, :model.cfg.n_ctx])[:, -1], generator, **sampling)
        tokens = torch.cat([tokens, new[:, None]], dim=-1)
        if eos_token_id is not None and bool((new == eos_token_id).all()):
            break
    return tokens


def _generate_row_by_row(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    """Correct: each row generated alone until it ends, then the rows padded with end-of-text."""
    rows = []
    for row in input_ids:
        tokens = row[None]
        for _ in range(max_new_tokens):
            logits = model(tokens[:, -model.cfg.n_ctx:])[:, -1]
            new = reference.sample_next_token(tokens, logits, generator, **sampling)
            tokens = torch.cat([tokens, new[:, None]], dim=-1)
            if eos_token_id is not None and int(new) == eos_token_id:
                break
        rows.append(tokens[0])
    width = max(len(r) for r in rows)
    pad = eos_token_id if eos_token_id is not None else 0
    return torch.stack([torch.cat([r, torch.full((width - len(r),), pad)]) for r in rows])


def _generate_sampler_crash(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
    tokens = input_ids
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -model.cfg.n_ctx:])          # every position: the sampler crashes
        new = reference.sample_next_token(tokens, logits, generator, **sampling)
        tokens = torch.cat([tokens, new[:, None]], dim=-1)
    return tokens


@pytest.mark.parametrize("fn", [reference.generate, _generate(), _generate_row_by_row])
def test_generate_correct_variants_pass(fn):
    passes(nb08.check_generate, fn)


@pytest.mark.parametrize("fn, message", [
    (_generate(crop=False), "Likely mistake: it runs for 10 new tokens (prompt + new = n_ctx) and crashes beyond"),
    (_generate_cropping_first, "Likely mistake: the context is cropped to the FIRST n_ctx tokens"),
    (_generate(position=0), "Likely mistake: the next token must come from the logits of the LAST position"),
    (_generate(pass_sampling=False), "Likely mistake: the sampling settings do not reach sample_next_token"),
    (_generate(new_only=True), "Likely mistake: only the new tokens are returned"),
    (_generate(stop="never"), "Likely mistake: generation never stops at end-of-text"),
    (_generate(stop="before"), "Likely mistake: the end-of-text token itself is dropped"),
    (_generate(stop="any"), "Likely mistake: generation stopped as soon as one row reached end-of-text"),
    (_generate(stop="all-same-step"), "Likely mistake: generation went on to max_new_tokens"),
    (_generate(stop="unpadded"), "Likely mistake: row 1 kept generating after its end-of-text token"),
    (_generate(pad=0), "Likely mistake: finished rows are padded with 0"),
])
def test_generate_mistakes_fail(fn, message):
    fails_with(nb08.check_generate, fn, expected=message, first_line=True)


def test_generate_rows_ending_at_different_steps_hidden_case():
    """The hidden case has three rows, ending after 4, 2 and 3 new tokens."""
    fails_with(nb08.check_generate, _generate(stop="any"), expected="after 4, 2, 3 new tokens", first_line=True,
               seed=18, batch=3)
    nb08.check_generate(reference.generate, seed=18, batch=3)


OTHER_N_CTX = dict(seed=11, n_ctx=20)   # the visible check's model has n_ctx 16


@pytest.mark.parametrize("fn", [reference.generate, _generate(), _generate_row_by_row])
def test_generate_correct_variants_crop_to_the_models_n_ctx(fn):
    nb08.check_generate(fn, **OTHER_N_CTX)


def test_a_crop_to_the_visible_models_n_ctx_is_named():
    nb08.check_generate(_generate(crop_to=16))   # the visible check's n_ctx: it passes
    fails_with(nb08.check_generate, _generate(crop_to=16),
               expected="(the model's n_ctx is 20, the prompt has 6 tokens). Likely mistake: the context is "
                        "cropped to a literal 16 tokens, not to the model's n_ctx (20 here)",
               first_line=True, **OTHER_N_CTX)


@pytest.mark.parametrize("limit", [64, 1024])   # the notebook-07 model's n_ctx, GPT-2's
def test_a_crop_to_a_literal_longer_than_the_context_is_named(limit):
    fails_with(nb08.check_generate, _generate(crop_to=limit),
               expected="(the model's n_ctx is 16). Likely mistake: the context is cropped to a literal "
                        f"{limit} tokens, not to the model's n_ctx (16 here)", first_line=True)
    fails_with(nb08.check_generate, _generate(crop_to=limit),
               expected="(the model's n_ctx is 20). Likely mistake: the context is cropped to a literal "
                        f"{limit} tokens, not to the model's n_ctx (20 here)", first_line=True, **OTHER_N_CTX)


def test_the_notebook_grades_generate_on_that_model():
    """The case above is the one the notebook's hidden check runs."""
    from graders.harness.manifest import notebook_checks

    graded = [fields for _, fields in notebook_checks("08_sampling")["generate_test"]]
    assert dataclasses.asdict(nb08.check_generate.exercise.case(**OTHER_N_CTX)) in graded


def test_a_crash_in_the_sampler_is_not_blamed_on_cropping():
    with pytest.raises(CheckFailed) as failure:
        nb08.check_generate(_generate_sampler_crash)
    message = str(failure.value)
    assert message.startswith("generate crashed on a prompt of shape [2, 6], max_new_tokens=20"), message
    assert "crop" not in message, message
    # The learner's own exception stays attached, so that their frames are shown with the message.
    assert isinstance(failure.value.__cause__, RuntimeError), repr(failure.value.__cause__)


def test_generate_ignoring_top_k_is_caught():
    def ignores_top_k(model, input_ids, max_new_tokens, generator, eos_token_id=None, **sampling):
        sampling.pop("top_k", None)
        return reference.generate(model, input_ids, max_new_tokens, generator, eos_token_id, **sampling)
    fails_with(nb08.check_generate, ignores_top_k,
               expected=("is not among the 5 most likely", "Likely mistake: the sampling settings (top_k"),
               first_line=True)


def test_reference_generate_pads_finished_rows_with_end_of_text():
    chain = nb08.markov_model(71, 10)
    chain.table[:, 7] = -5.0
    for a, b in ((2, 5), (5, 8), (8, 3), (3, 7)):
        chain.table[a, b] = 10.0
    out = reference.generate(chain, torch.tensor([[1, 2], [1, 8]]), 40, None, eos_token_id=7, temperature=0.0)
    assert out.tolist() == [[1, 2, 5, 8, 3, 7], [1, 8, 3, 7, 7, 7]]
