"""Notebook 08's beam-search grader (graders/exercises/nb08/beam.py): correct variants pass, each
catalogued mistake fails with its diagnosis."""
import pytest
import torch

from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference
from graders.judging.compare import CheckFailed

from course_code import course_code_allowed
from catalog_helpers import fails_with
from catalog_08_shared import INF, passes


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


# --- beam search -------------------------------------------------------------------------------

def _beam_loop(model, input_ids, num_beams, max_new_tokens):
    """Beam search written with Python lists, in float32."""
    beams = [(input_ids[0].tolist(), 0.0)]
    for _ in range(max_new_tokens):
        candidates = []
        for tokens, score in beams:
            log_probs = model(torch.tensor([tokens]))[0, -1].log_softmax(-1)
            candidates += [(tokens + [t], score + float(lp)) for t, lp in enumerate(log_probs)]
        beams = sorted(candidates, key=lambda c: -c[1])[:num_beams]
    return torch.tensor([t for t, _ in beams]), torch.tensor([s for _, s in beams])


@pytest.mark.parametrize("fn", [reference.beam_search, _beam_loop])
def test_beam_search_correct_variants_pass(fn):
    passes(nb08.check_beam_search, fn)


def _beam(score_update="sum", rank_by_last=False, reverse=False, probabilities=False):
    def search(model, input_ids, num_beams, max_new_tokens):
        beams, scores = input_ids, torch.zeros(1)
        for _ in range(max_new_tokens):
            logits = model(beams)[:, -1]
            step = logits.softmax(-1) if probabilities else logits.log_softmax(-1)
            if rank_by_last:    # choose by this step's log-prob, but report the sums
                total = (scores[:, None] + step).flatten()
                _, best = step.flatten().topk(min(num_beams, step.numel()))
                scores = total[best]
                beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
                continue
            cand = (step + (scores[:, None] if score_update == "sum" else 0)).flatten()
            scores, best = cand.topk(min(num_beams, len(cand)))
            beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
        if reverse:
            return beams.flip(0), scores.flip(0)
        return beams, scores
    return search


def _beam_best_child(model, input_ids, num_beams, max_new_tokens):
    """Each beam extended by its own best token only (a single beam, from a single prompt)."""
    beams, scores = input_ids, torch.zeros(1)
    for _ in range(max_new_tokens):
        best, token = model(beams)[:, -1].log_softmax(-1).max(-1)
        beams, scores = torch.cat([beams, token[:, None]], -1), scores + best
    return beams, scores


def _beam_best_child_after_first_loop(model, input_ids, num_beams, max_new_tokens):
    """The first step keeps the num_beams best tokens; then each beam keeps only its best child."""
    first = model(input_ids)[0, -1].log_softmax(-1)
    top = first.topk(min(num_beams, first.numel()))
    beams = [(input_ids[0].tolist() + [t], float(s)) for s, t in zip(top.values, top.indices.tolist())]
    for _ in range(max_new_tokens - 1):
        extended = []
        for tokens, score in beams:
            log_probs = model(torch.tensor([tokens]))[0, -1].log_softmax(-1)
            extended.append((tokens + [int(log_probs.argmax())], score + float(log_probs.max())))
        beams = sorted(extended, key=lambda b: -b[1])
    return torch.tensor([t for t, _ in beams]), torch.tensor([s for _, s in beams])


def _beam_from_copies(model, input_ids, num_beams, max_new_tokens):
    """Starts from num_beams copies of the prompt, each scored 0: the first step's candidates
    come num_beams times each, and so do the beams kept."""
    beams, scores = input_ids.repeat(num_beams, 1), torch.zeros(num_beams)
    for _ in range(max_new_tokens):
        step = model(beams)[:, -1].log_softmax(-1)
        scores, best = (scores[:, None] + step).flatten().topk(num_beams)
        beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
    return beams, scores


def _beam_two_children(model, input_ids, num_beams, max_new_tokens):
    """Each beam offers only its two best children, so the beams double at each step at most."""
    beams, scores = input_ids, torch.zeros(1)
    for _ in range(max_new_tokens):
        top, token = model(beams)[:, -1].log_softmax(-1).topk(2, dim=-1)
        scores, best = (scores[:, None] + top).flatten().topk(min(num_beams, top.numel()))
        beams = torch.cat([beams[best // 2], token.flatten()[best][:, None]], -1)
    return beams, scores


def _beam_no_repeat(model, input_ids, num_beams, max_new_tokens):
    """Never extends a beam by its own last token: true scores, the right shape, other beams."""
    beams, scores = input_ids, torch.zeros(1)
    for _ in range(max_new_tokens):
        step = model(beams)[:, -1].log_softmax(-1).scatter(-1, beams[:, -1:], -INF)
        cand = (scores[:, None] + step).flatten()
        scores, best = cand.topk(min(num_beams, int(cand.isfinite().sum())))
        beams = torch.cat([beams[best // step.shape[-1]], (best % step.shape[-1])[:, None]], -1)
    return beams, scores


@pytest.mark.parametrize("fn, message", [
    (_beam_from_copies, "(some beams are the same sequence). Likely mistake: the search starts from "
                        "num_beams copies of the prompt"),
    (_beam_two_children, "Likely mistake: each beam keeps only a few of its best children"),
    (_beam(score_update="last"), "Likely mistake: the scores are not accumulated"),
    (_beam(probabilities=True), "Likely mistake: the scores add probabilities"),
    (_beam(reverse=True), "the right beams, but return them best first"),
    (_beam(rank_by_last=True), "Likely mistake: the candidates are ranked by the new token's log-probability alone"),
    (_beam_best_child, "Likely mistake: only the best continuation is kept"),
    (_beam_best_child_after_first_loop, "Likely mistake: each beam keeps only its best child"),
    (lambda m, i, n, k: (reference.beam_search(m, i, n, k)[0], reference.beam_search(m, i, n, k)[1] / (i.shape[1] + k)),
     "Likely mistake: the score is divided by the length"),
    (lambda m, i, n, k: (reference.beam_search(m, i, n, k)[0],
                         reference.beam_search(m, i, n, k)[1] + m(i).log_softmax(-1)[0, 0, i[0, 1]]),
     "Likely mistake: the prompt's own log-probability is added to the score"),
    (lambda m, i, n, k: reference.beam_search(m, i, n, k)[0], "must return a pair"),
    (lambda m, i, n, k: (reference.beam_search(m, i, n, k)[0][:, i.shape[1]:], reference.beam_search(m, i, n, k)[1]),
     "Likely mistake: only the new tokens are returned"),
])
def test_beam_search_mistakes_fail(fn, message):
    fails_with(nb08.check_beam_search, fn, expected=message, first_line=True)


def test_beams_that_differ_unnamed_are_shown_side_by_side():
    """A search the catalog cannot name gets the first differing beam, expected and got, with
    their scores: the best scores alone can agree and read as a contradiction."""
    with pytest.raises(CheckFailed) as failure:
        nb08.check_beam_search(_beam_no_repeat)
    message = str(failure.value)
    assert "Likely mistake" not in message, message
    first = message.split("First difference in beam ")[1]
    expected, got = first.split("expected ")[1].split(" with ")[0], first.split("got ")[1].split(" with ")[0]
    assert expected.startswith("[") and got.startswith("[") and expected != got, message
