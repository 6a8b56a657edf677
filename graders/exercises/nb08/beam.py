"""Notebook 08's `beam_search(model, input_ids, num_beams, max_new_tokens)`, judged on tiny Markov
models whose best continuations are known by enumerating all of them."""
from __future__ import annotations

import itertools
import math

import torch

from graders.exercises.nb08.reference import beam_search
from graders.exercises.common.small_models import MarkovModel, markov_model
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, check_shape, require_tensor
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner
from graders.judging.tolerance import DECISION_MARGIN, close

BEAM_VOCAB = 6


def exhaustive_search(model: MarkovModel, prompt: torch.Tensor, n_new: int, top: int):
    """The `top` most likely continuations of `prompt`, by enumerating all of them."""
    log_probs = model.table.double().log_softmax(-1)
    scored = []
    for continuation in itertools.product(range(model.cfg.d_vocab), repeat=n_new):
        previous = [int(prompt[0, -1])] + list(continuation[:-1])
        score = sum(float(log_probs[a, b]) for a, b in zip(previous, continuation))
        scored.append((score, continuation))
    scored.sort(key=lambda item: -item[0])
    tokens = torch.tensor([prompt[0].tolist() + list(c) for _, c in scored[:top]])
    return tokens, torch.tensor([s for s, _ in scored[:top]], dtype=torch.float64)


BEAM_SETTINGS = {"exact": (36, 3), "narrow": (3, 5), "greedy": (1, 4)}   # (num_beams, new tokens)
# 36 = 6^2 beams hold every 2-token prefix, so beam search over 3 new tokens is exhaustive.


def _beam_margin(model: MarkovModel, prompt: torch.Tensor, num_beams: int, n_new: int) -> float:
    """The smallest score gap that decides the search: at every step between the last kept
    candidate and the first dropped one, and between consecutive final beams."""
    log_probs = model.table.double().log_softmax(-1)
    beams, scores, margin = prompt, torch.zeros(1, dtype=torch.float64), math.inf
    for _ in range(n_new):
        ranked, flat = (scores[:, None] + log_probs[beams[:, -1]]).flatten().sort(descending=True)
        if len(ranked) > num_beams:
            margin = min(margin, float(ranked[num_beams - 1] - ranked[num_beams]))
        scores, flat = ranked[:num_beams], flat[:num_beams]
        beams = torch.cat([beams[flat // BEAM_VOCAB], (flat % BEAM_VOCAB)[:, None]], dim=-1)
    return min([margin] + (scores[:-1] - scores[1:]).tolist())


def _beam_cases(case: Case):
    """A Markov model whose searches are decided by gaps above DECISION_MARGIN (1e-3, far above
    fp32 rounding), so that every correct implementation finds the same beams in the same order."""
    prompt = torch.tensor([[case.seed % BEAM_VOCAB, 4]])
    for attempt in itertools.count():
        model = markov_model(case.seed + 80 + 1000 * attempt, BEAM_VOCAB)
        if all(_beam_margin(model, prompt, *setting) > DECISION_MARGIN
               for setting in BEAM_SETTINGS.values()):
            return model, prompt, BEAM_SETTINGS


def sequence_log_prob(model: MarkovModel, tokens: torch.Tensor, n_prompt: int) -> torch.Tensor:
    """Total log-probability of each row's new tokens given everything before them."""
    log_probs = model.table.double().log_softmax(-1)
    return log_probs[tokens[:, n_prompt - 1:-1], tokens[:, n_prompt:]].sum(-1)


def beam_variant(model: MarkovModel, prompt: torch.Tensor, num_beams: int, n_new: int,
                 rule: str) -> torch.Tensor:
    """The beams a known wrong search keeps (for diagnosis): "best_child" extends each beam by its
    own best token after the first step; "last_step" ranks candidates by the new token's
    log-probability alone; "copies" starts from num_beams copies of the prompt, each scored 0."""
    log_probs = model.table.double().log_softmax(-1)
    beams, scores = prompt, torch.zeros(1, dtype=torch.float64)
    if rule == "copies":
        beams, scores = prompt.expand(num_beams, -1), torch.zeros(num_beams, dtype=torch.float64)
    for _ in range(n_new):
        step = log_probs[beams[:, -1]]                                     # [beams, d_vocab]
        if rule == "best_child" and beams.shape[0] > 1:
            best, token = step.max(-1)
            beams, scores = torch.cat([beams, token[:, None]], dim=-1), scores + best
            continue
        ranking = step if rule == "last_step" else scores[:, None] + step
        flat = ranking.flatten().topk(min(num_beams, ranking.numel())).indices
        scores = (scores[:, None] + step).flatten()[flat]
        beams = torch.cat([beams[flat // BEAM_VOCAB], (flat % BEAM_VOCAB)[:, None]], dim=-1)
    return beams


BEAM_MISTAKES = {
    "best_child": Mistake("best_child_only", "each beam is extended only by its own best token (the best child "
                          "of each beam): keep the num_beams best candidates overall (topk on the flattened "
                          "[num_beams, d_vocab] scores); a beam may have several children or none"),
    "last_step": Mistake("ranked_by_last_token", "the candidates are ranked by the new token's log-probability "
                         "alone: rank them by the beam's score PLUS it, the total log-probability of the whole "
                         "continuation"),
    "copies": Mistake("prompt_copies", "the search starts from num_beams copies of the prompt, so every first-step "
                      "candidate comes num_beams times and the same beams are kept several times: start from the "
                      "prompt alone, one beam with score 0"),
}


def _rows(tokens: torch.Tensor) -> list[tuple]:
    """The beams as a sorted list of token tuples: the same beams in any order, repeats counted."""
    return sorted(map(tuple, tokens.tolist()))


def produce_beam(fn, case: Case, inputs: dict) -> dict:
    model, prompt, settings = _beam_cases(case)
    outputs = {}
    for key, (beams, new) in settings.items():
        result = run_learner("beam_search", fn, model, prompt.clone(), beams, new)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise CheckFailed("beam_search must return a pair (tokens, log_probs): tokens "
                              "[num_beams, prompt + new], log-probabilities [num_beams].")
        for part, value in zip(("tokens", "log_probs"), result):
            require_tensor(f"beam_search(...) {part}", value)
            outputs[f"{key}_{part}"] = value
    return outputs


def judge_beam(case: Case, outputs: dict) -> None:
    model, prompt, settings = _beam_cases(case)
    n_prompt = prompt.shape[1]
    for key, (beams, new) in settings.items():
        where = f"beam_search(model, prompt, num_beams={beams}, max_new_tokens={new})"
        tokens, scores = outputs[f"{key}_tokens"], outputs[f"{key}_log_probs"]
        if tokens.ndim == 2 and tokens.shape[1] == n_prompt + new and tokens.shape[0] < beams:
            few = (Mistake("only_best_kept", "only the best continuation is kept") if tokens.shape[0] == 1 else
                   Mistake("best_child_only", "each beam keeps only its best child")
                   if tokens.shape[0] == min(beams, BEAM_VOCAB)
                   else Mistake("few_children_kept", "each beam keeps only a few of its best children"))
            raise CheckFailed(
                f"{where} tokens: {tokens.shape[0]} beams, expected {beams}. Likely mistake: "
                + few
                + ", so there are fewer beams than num_beams: extend every beam by every token and "
                "keep the num_beams best candidates overall; a beam may have many children or none.",
                mistake=few.key)
        if tokens.ndim == 2 and tokens.shape == (beams, new):
            raise CheckFailed(f"{where} tokens: shape {list(tokens.shape)}, expected "
                              f"{[beams, n_prompt + new]}. Likely mistake: only the new tokens are "
                              "returned; every beam starts with the prompt.", mistake="prompt_not_returned")
        check_shape(f"{where} tokens", tokens, (beams, n_prompt + new), ("beam", "position"))
        check_shape(f"{where} log_probs", scores, (beams,), ("beam",))
        if not torch.equal(tokens[:, :n_prompt], prompt.expand(beams, -1)):
            raise CheckFailed(f"{where}: every beam must start with the prompt.")
        true_scores = sequence_log_prob(model, tokens, n_prompt)
        if not close(scores, true_scores.float()):
            row = int((scores.double() - true_scores).abs().argmax())
            last = model.table.double().log_softmax(-1)[tokens[:, -2], tokens[:, -1]]
            named = None
            if close(scores, last.float()):
                named = "scores_not_summed"
                why = ("Likely mistake: the scores are not accumulated: a beam's score is the SUM "
                       "of the log-probabilities of all its new tokens, not the last one's.")
            elif close(scores, (true_scores + model.table.double().log_softmax(-1)[
                    prompt[0, :-1], prompt[0, 1:]].sum()).float()):
                named = "prompt_scored"
                why = ("Likely mistake: the prompt's own log-probability is added to the score: "
                       "score the new tokens only.")
            elif close(scores, model.table.double().softmax(-1)[
                    tokens[:, n_prompt - 1:-1], tokens[:, n_prompt:]].sum(-1).float()):
                named = "probabilities_added"
                why = ("Likely mistake: the scores add probabilities (softmax); add "
                       "log-probabilities (log_softmax): a sequence's log-probability is the sum of "
                       "its tokens' log-probabilities.")
            elif close(scores, true_scores.exp().float()):
                named = "probabilities_reported"
                why = ("Likely mistake: probabilities are reported instead of log-probabilities "
                       "(return the total log-probability, the sum of log_softmax values).")
            elif any(close(scores, (true_scores / n).float()) for n in (new, n_prompt + new)):
                named = "length_normalised"
                why = ("Likely mistake: the score is divided by the length. Return the plain total "
                       "log-probability of the new tokens, the same measure for every beam.")
            else:
                why = ("A beam's score must be the sum of log_softmax(logits) of each new token "
                       "given the tokens before it (log-probabilities, not probabilities or raw "
                       "logits), over the new tokens only.")
            raise CheckFailed(f"{where}: beam {row} has log-probability {float(scores[row]):.5f}, "
                              f"but its tokens {tokens[row].tolist()} have total log-probability "
                              f"{float(true_scores[row]):.5f}. {why}", mistake=named)
        expected_tokens, expected_scores = (exhaustive_search(model, prompt, new, beams)
                                            if key == "exact" else beam_search(model, prompt, beams, new))
        if torch.equal(tokens, expected_tokens):
            continue
        if _rows(tokens) == _rows(expected_tokens):
            raise CheckFailed(f"{where}: the right beams, but return them best first "
                              "(log-probabilities in decreasing order).", mistake="beams_not_sorted")
        versus = "exhaustive search" if key == "exact" else "the reference beam search"
        repeated = len(set(_rows(tokens))) < beams
        for rule, description in BEAM_MISTAKES.items():
            if _rows(tokens) == _rows(beam_variant(model, prompt, beams, new, rule)):
                raise CheckFailed(f"{where}: the beams differ from {versus}"
                                  + (" (some beams are the same sequence)" if repeated else "")
                                  + f". Likely mistake: {description}.", mistake=description.key)
        row = int((tokens != expected_tokens).any(-1).nonzero()[0])
        raise CheckFailed(
            f"{where}: the beams differ from {versus}"
            + (" (some beams are the same sequence, which a search never keeps twice)" if repeated else "")
            + f". First difference in beam {row}: expected {expected_tokens[row].tolist()} with "
            f"log-probability {float(expected_scores[row]):.5f}, got {tokens[row].tolist()} with "
            f"{float(scores[row]):.5f}. At every step, extend each beam by every token, score each "
            "candidate by its total log-probability, and keep the num_beams best candidates overall.")


beam_exercise = Exercise("08_sampling", "beam_search", produce_beam, judge_beam,
                         defaults={"text": None})
check_beam_search = beam_exercise.checker(
    "Grade `beam_search(model, input_ids, num_beams, max_new_tokens)` on a tiny Markov model.")
