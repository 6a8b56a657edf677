"""Notebook 08's logit transforms: `greedy_search`, `apply_temperature`, `apply_frequency_penalty`
(the filters, top-k and top-p, are in `filters`), and how every transform is judged.

A transform is judged by the exact set of tokens it keeps and, within the course tolerance, by
the distribution it leaves (softmax of its logits, so shifting every logit of a row by a
constant is not a mistake). Every input comes from a fixed seed.
"""
from __future__ import annotations

from typing import Mapping

import torch

from graders.exercises.nb08.reference import (NEG_INF, apply_frequency_penalty, apply_temperature, greedy_search,
                                              token_counts)
from graders.judging.cases import Case, rand_float
from graders.exercises.common.diagnosis import crash, is_crash
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, mistake_key, require_tensor, with_fix
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner
from graders.judging.tolerance import PROBABILITY_SUM_SLACK, close

DIMS = ("batch", "d_vocab")
VOCAB = 50                       # vocabulary of the fixed logit batches
TOP_TOKEN_REMOVED = Mistake("top_token_removed", "the most likely token is not forced to stay; a filter must "
                            "always keep at least the most likely token")


# --- Judging transformed logits ------------------------------------------------------------------

def as_probs(logits: torch.Tensor) -> torch.Tensor:
    return logits.double().softmax(dim=-1)


def _looks_like_probabilities(x: torch.Tensor) -> bool:
    x = x.double()
    return bool(torch.isfinite(x).all() and (x >= 0).all() and (x <= 1).all()
                and (x.sum(-1) <= 1 + PROBABILITY_SUM_SLACK).all())


def token_list(ids: torch.Tensor) -> str:
    shown = ids.tolist()[:10]
    return ", ".join(map(str, shown)) + (" ..." if len(ids) > 10 else "")


def judge_logits(what: str, actual, expected: torch.Tensor, mistakes: dict, hint: str = "",
                 rule=None, fix: str = "", fixes: Mapping[str, str] = {}) -> None:
    """The tokens kept must be exactly the reference's; their probabilities must match.
    `rule(row, kept_row)`, when given, says in words which rule the learner's kept tokens follow.
    `hint` is printed only when no mistake is named; the message ends with the corrected code:
    `fixes[description]` for a named mistake (TOP_TOKEN_REMOVED among them), else `fix`."""
    check_shape(what, actual, expected.shape, DIMS)
    if not actual.is_floating_point():
        raise CheckFailed(f"{what}: dtype {actual.dtype}; return floating-point logits.")
    actual = actual.double()
    if torch.isnan(actual).any():
        raise CheckFailed(f"{what}: contains NaN (e.g. inf - inf, or 0 * inf). Removed tokens "
                          "should be set to -inf with masked_fill, not computed arithmetically.")
    if (actual == NEG_INF).all(-1).any():
        row = int((actual == NEG_INF).all(-1).nonzero()[0])
        alive = ~(actual == NEG_INF).all(-1)
        for description, wrong in mistakes.items():
            if bool(alive.any()) and torch.equal((actual > NEG_INF)[alive], (wrong > NEG_INF)[alive]):
                raise CheckFailed(with_fix(f"{what}: row {row} has every token removed (all -inf). Likely "
                                           f"mistake: {description} (and the most likely token must always "
                                           "stay)", fixes.get(description, fix)), mistake=mistake_key(description))
        raise CheckFailed(with_fix(f"{what}: row {row} has every token removed (all -inf), so nothing can "
                                   f"be sampled. Likely mistake: {TOP_TOKEN_REMOVED}.",
                                   fixes.get(TOP_TOKEN_REMOVED, fix)), mistake=TOP_TOKEN_REMOVED.key)
    kept, kept_expected = as_probs(actual) > 0, as_probs(expected) > 0

    def same(x, kept_x, y, kept_y):
        return torch.equal(kept_x, kept_y) and close(as_probs(x).float(), as_probs(y))

    if same(actual, kept, expected, kept_expected):
        return
    for description, wrong in mistakes.items():
        if same(actual, kept, wrong, as_probs(wrong) > 0):
            raise CheckFailed(with_fix(f"{what} does not match the reference.\n  Likely mistake: {description}",
                                       fixes.get(description, fix)), mistake=mistake_key(description))
    if _looks_like_probabilities(actual) and not _looks_like_probabilities(expected):
        raise CheckFailed(with_fix(f"{what}: returned what looks like probabilities (values in [0, 1] "
                                   "summing to at most 1). Return logits: leave the kept logits as they "
                                   "are and set removed tokens to -inf; the sampler applies the softmax.", fix))
    if not torch.equal(kept, kept_expected):
        row = int((kept != kept_expected).any(-1).nonzero()[0])
        extra = (kept[row] & ~kept_expected[row]).nonzero().flatten()
        missing = (~kept[row] & kept_expected[row]).nonzero().flatten()
        lines = [f"{what}: keeps the wrong tokens. In row {row} it keeps {int(kept[row].sum())} "
                 f"tokens, the reference keeps {int(kept_expected[row].sum())}."]
        if len(extra):
            lines.append(f"  kept but should be removed (-inf): token ids {token_list(extra)}")
        if len(missing):
            lines.append(f"  removed but should be kept: token ids {token_list(missing)}")
        named = next((description for description, wrong in mistakes.items()
                      if torch.equal(kept, as_probs(wrong) > 0)), None)
        said = named      # the mistake the message names: a listed one, or the rule's (a Mistake when it names one)
        if named is not None:
            lines.append(f"  Likely mistake: {named}")
        else:
            if rule is not None:
                said = rule(row, kept[row])
                lines.append("  " + said)
            if hint:
                lines.append(f"  Hint: {hint}")
        raise CheckFailed(with_fix("\n".join(lines), fixes.get(named, fix)), mistake=mistake_key(said))
    compare(f"{what} (compared as probabilities: the softmax of your logits)",
            as_probs(actual).float(), as_probs(expected), DIMS, hint=hint, fix=fix)


def _run_transform(what: str, fn, cases: list[tuple[str, tuple]], signature=None,
                   crash_cause=None, fix: str = "") -> dict:
    """Run `fn(*args)` on each case, recording its output and whether it changed its inputs.
    A crash is reported with the input that triggered it (`signature(*args)`) and, when
    `crash_cause(failure, *args)` knows it, the likely cause, then the corrected code `fix`."""
    outputs = {}
    for key, args in cases:
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            outputs[key] = run_learner(what, fn, *copies)
        except CheckFailed as failure:
            if not is_crash(failure) or signature is None:
                raise
            shapes = ", ".join(f"{['input_ids', 'logits'][i] if len(args) == 3 else 'logits'} of shape "
                               f"{list(a.shape)}" for i, a in enumerate(args) if isinstance(a, torch.Tensor))
            cause = crash_cause(failure, *args) if crash_cause else ""
            reported = crash(what, failure, f"{what}({signature(*args)}) with {shapes}", cause)
            raise CheckFailed(with_fix(str(reported), fix if cause else ""),
                              mistake=reported.mistake) from failure.__cause__
        require_tensor(f"{what} on case {key}", outputs[key])
        outputs[f"{key}_modified"] = torch.tensor(any(
            isinstance(a, torch.Tensor) and not torch.equal(a, c) for a, c in zip(args, copies)))
    return outputs


def _no_in_place(what: str, outputs: dict, cases) -> None:
    for key, _ in cases:
        if bool(outputs[f"{key}_modified"]):
            raise CheckFailed(f"{what}: modified the tensor it was given in place (e.g. "
                              "masked_fill_ or -=). Return a new tensor; callers reuse their logits.")


def transform_exercise(name: str, cases, reference, mistakes, signature, hint: str,
                       crash_cause=None, rule=None, fix: str = "", fixes: Mapping[str, str] = {}) -> Exercise:
    """An exercise for a logit transform `name(*args)`: the learner's function runs on each of
    `cases(case)` ((key, args) pairs), and each output is judged against `reference(*args)`
    with `mistakes(*args)` named; `signature(*args)` describes the call in messages,
    `crash_cause(failure, *args)` the likely cause of a crash, `rule(*args)` (a function of
    (row, kept row)) which rule the tokens a learner kept follow; `fixes` holds the corrected
    code of a named mistake, `fix` the code of any other (judge_logits)."""
    def produce(fn, case: Case, inputs: dict) -> dict:
        return _run_transform(name, fn, cases(case), signature, crash_cause, fix)

    def judge(case: Case, outputs: dict) -> None:
        chosen = cases(case)
        _no_in_place(name, outputs, chosen)
        for key, args in chosen:
            judge_logits(f"{name}({signature(*args)})", outputs[key], reference(*args),
                         mistakes(*args), hint=hint, rule=rule(*args) if rule else None, fix=fix, fixes=fixes)

    return Exercise("08_sampling", name, produce, judge, defaults={"text": None})


def logit_batch(seed: int, batch: int, scale: float = 3.0, vocab: int = VOCAB) -> torch.Tensor:
    return scale * rand_float(seed, batch, vocab)


# --- Exercise: greedy search --------------------------------------------------------------------

def _greedy_cases(case: Case):
    return [("main", (logit_batch(case.seed, max(case.batch, 4)),)),
            ("one", (logit_batch(case.seed + 1, 1),))]


def produce_greedy(fn, case: Case, inputs: dict) -> dict:
    return _run_transform("greedy_search", fn, _greedy_cases(case))


def judge_greedy(case: Case, outputs: dict) -> None:
    cases = _greedy_cases(case)
    _no_in_place("greedy_search", outputs, cases)
    for key, (logits,) in cases:
        out, where = outputs[key], f"greedy_search(logits of shape {list(logits.shape)})"
        shape = tuple(out.shape)
        if shape == (logits.shape[1],) and torch.equal(out, logits.argmax(0)):
            raise CheckFailed(f"{where}: shape {list(shape)}, expected [batch={logits.shape[0]}]. "
                              "Likely mistake: argmax over the batch dimension (dim=0); take it over "
                              "the vocabulary, dim=-1.", mistake="argmax_over_batch")
        if shape == (logits.shape[0], 1):
            raise CheckFailed(f"{where}: shape {list(shape)}, expected [batch={logits.shape[0]}]. "
                              "Likely mistake: keepdim=True (or topk's [batch, 1] indices) keeps a "
                              "trailing dimension; return one token id per row, shape [batch].",
                              mistake="keepdim_true")
        if shape == () and logits.shape[0] > 1:
            raise CheckFailed(f"{where}: a single number, expected [batch={logits.shape[0]}]. Likely "
                              "mistake: argmax without dim flattens the whole batch; use dim=-1.",
                              mistake="argmax_without_dim")
        check_shape(where, out, (logits.shape[0],), ("batch",))
        if out.dtype != torch.long:
            raise CheckFailed(f"{where}: dtype {out.dtype}; return token ids (torch.long): the "
                              "index of the largest logit, not its value.")
        expected = greedy_search(logits)
        if not torch.equal(out, expected):
            why, key = "", None
            if torch.equal(out, logits.argmin(-1)):
                why, key = " Likely mistake: argmin instead of argmax.", "argmin"
            elif logits.shape[0] > 1 and torch.equal(out[:1], logits.argmax(0)[:1]):
                why, key = (" Likely mistake: argmax over the batch dimension (use dim=-1, the vocabulary).",
                            "argmax_over_batch")
            raise CheckFailed(f"{where}: returned {out.tolist()}, expected the most likely token "
                              f"of each row, {expected.tolist()}.{why}", mistake=key)


greedy_exercise = Exercise("08_sampling", "greedy_search", produce_greedy, judge_greedy,
                           defaults={"text": None})
check_greedy = greedy_exercise.checker("Grade `greedy_search(logits) -> token ids`.")


# --- Exercise: temperature ------------------------------------------------------------------------

def _temperature_cases(case: Case):
    logits = logit_batch(case.seed + 10, max(case.batch, 3))
    return [(f"t{i}", (logits, t)) for i, t in enumerate((2.0, 0.5, 1e-3))]


def temperature_mistakes(logits, t) -> dict:
    return {
        Mistake("multiplied_by_temperature",
                "multiplying by the temperature: divide, so that a low temperature sharpens"): logits * t,
        Mistake("temperature_after_softmax", "temperature applied after softmax: divide the LOGITS by the "
                "temperature, then let the sampler take the softmax"): logits.softmax(-1) / t,
        Mistake("temperature_subtracted", "the temperature is subtracted: divide the logits by it"): logits - t,
    }


temperature_exercise = transform_exercise(
    "apply_temperature", _temperature_cases, apply_temperature, temperature_mistakes,
    lambda logits, t: f"logits, temperature={t}",
    hint="the temperature scales the logits, before the sampler's softmax: below 1 it sharpens the "
         "distribution, above 1 it flattens it.",
    fix="return logits / temperature")
check_temperature = temperature_exercise.checker(
    "Grade `apply_temperature(logits, temperature)`.")


# --- Exercise: frequency penalty ------------------------------------------------------------------

def _penalty_cases(case: Case):
    batch = max(case.batch, 2)
    generator = torch.Generator().manual_seed(case.seed + 20)
    # Few distinct tokens per row, so that most are repeated and many vocabulary ids unseen.
    input_ids = torch.randint(0, 12, (batch, 15), generator=generator) + 5 * torch.arange(batch)[:, None]
    logits = logit_batch(case.seed + 21, batch)
    return [(f"p{i}", (input_ids, logits, penalty)) for i, penalty in enumerate((1.0, 0.35))]


def penalty_mistakes(input_ids, logits, penalty) -> dict:
    counts = token_counts(input_ids, logits.shape[-1]).to(logits.dtype)
    whole_batch = counts.sum(0, keepdim=True).expand_as(counts)
    return {
        Mistake("presence_penalty", "each token seen is penalised once (a presence penalty): subtract the "
                "penalty times the NUMBER of times the token occurs"): logits - penalty * (counts > 0).to(logits.dtype),
        Mistake("counted_over_batch", "tokens are counted over the whole batch: count each row's own tokens"):
            logits - penalty * whole_batch,
        Mistake("penalty_added", "the penalty is added: subtract it, to make repeated tokens less likely"):
            logits + penalty * counts,
        Mistake("logits_divided", "the logits are divided by the counts: subtract penalty * count"):
            logits / (1 + penalty * counts),
        Mistake("only_last_token", "only the last token of each row is penalised: count every token of input_ids"):
            logits - penalty * torch.nn.functional.one_hot(input_ids[:, -1], logits.shape[-1]).to(logits.dtype),
        Mistake("presence_over_batch", "the penalty is subtracted from the probabilities' log only once per "
                "distinct token per batch (a presence penalty over the whole batch): count each row's own tokens"):
            logits - penalty * (whole_batch > 0).to(logits.dtype),
    }


penalty_exercise = transform_exercise(
    "apply_frequency_penalty", _penalty_cases, apply_frequency_penalty, penalty_mistakes,
    lambda input_ids, logits, penalty: f"input_ids, logits, freq_penalty={penalty}",
    hint="a token's logit goes down by freq_penalty for every time the token already occurs in its own "
         "row of input_ids (look up scatter_add or torch.bincount).",
    fix="counts = torch.zeros_like(logits).scatter_add(1, input_ids, torch.ones_like(input_ids, "
        "dtype=logits.dtype)); return logits - freq_penalty * counts")
check_frequency_penalty = penalty_exercise.checker(
    "Grade `apply_frequency_penalty(input_ids, logits, freq_penalty)`.")
