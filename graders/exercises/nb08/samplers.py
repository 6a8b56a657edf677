"""Notebook 08's samplers: `sample_basic` and `sample_next_token` (the whole pipeline).

A sampler is judged from many draws made with a generator the grader seeds, so the same code
gets the same verdict on every run: never flaky.
"""
from __future__ import annotations

import torch

from graders.exercises.nb08.reference import (NEG_INF, SAMPLING_PARTS, apply_frequency_penalty, apply_temperature,
                                              apply_top_k, apply_top_p, greedy_search, next_token_logits)
from graders.exercises.nb08.transforms import as_probs, logit_batch, token_list
from graders.judging.cases import Case
from graders.exercises.common.diagnosis import crash, is_crash, judge_randomness
from graders.judging.compare import CheckFailed, Mistake, check_shape, keyed_like, mistake_key, require_tensor
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner
from graders.judging.tolerance import DECISION_MARGIN, P_VALUE_FLOOR


# --- Judging samples by their distribution -------------------------------------------------------

DRAWS = 6000              # draws per distribution
# A correct sampler fails the chi-square test with probability P_VALUE_FLOOR (1e-6) per seed; the
# seed is fixed, so a given sampler passes or fails on every run alike.


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of observed `counts` under `probs` (Pearson's chi-square over possible tokens)."""
    possible = probs > 0
    expected = probs[possible].double() * counts.sum()
    statistic = ((counts[possible].double() - expected) ** 2 / expected).sum()
    dof = int(possible.sum()) - 1
    if dof == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


def judge_draws(what: str, draws: torch.Tensor, probs: torch.Tensor, mistakes: dict) -> None:
    """`draws` [n_rows, DRAWS] against each row's distribution `probs` [n_rows, d_vocab]."""
    d_vocab = probs.shape[-1]
    if draws.dtype != torch.long:
        raise CheckFailed(f"{what}: dtype {draws.dtype}; return token ids as torch.long.")
    if int(draws.min()) < 0 or int(draws.max()) >= d_vocab:
        raise CheckFailed(f"{what}: token ids range over [{int(draws.min())}, {int(draws.max())}]; "
                          f"they must be in [0, {d_vocab - 1}].")
    counts = torch.stack([torch.bincount(row, minlength=d_vocab) for row in draws])
    for row, impossible in enumerate((counts > 0) & (probs == 0)):
        if impossible.any():
            likely = _likely_mistake(counts[row], row, mistakes)
            raise CheckFailed(f"{what}: drew token ids {token_list(impossible.nonzero().flatten())} "
                              f"which have probability 0 (they were filtered out) in distribution "
                              f"{row}. A -inf logit must never be drawn."
                              + likely, mistake=mistake_key(likely))
    for row, (row_counts, row_probs) in enumerate(zip(counts, probs)):
        p_value = chi_square_p_value(row_counts, row_probs)
        if p_value < P_VALUE_FLOOR:
            top = row_probs.argsort(descending=True)[:5].tolist()
            likely = _likely_mistake(row_counts, row, mistakes)
            raise CheckFailed(
                f"{what}: {DRAWS} draws (fixed seed) do not follow distribution {row} (chi-square "
                f"p-value {p_value:.2g} < {P_VALUE_FLOOR:g}). Most likely tokens {top}: expected "
                f"frequencies {[round(float(row_probs[t]), 3) for t in top]}, drawn "
                f"{[round(int(row_counts[t]) / DRAWS, 3) for t in top]}."
                + likely, mistake=mistake_key(likely))


def _likely_mistake(counts: torch.Tensor, row: int, mistakes: dict) -> str:
    """The first named mistake whose distribution the draws do follow, as a message line (a
    Mistake that carries its key)."""
    for description, wrong in mistakes.items():
        if not ((counts > 0) & (wrong[row] == 0)).any() and \
                chi_square_p_value(counts, wrong[row]) >= P_VALUE_FLOOR:
            return keyed_like(description, f"\n  Likely mistake: {description}")
    return ""


def _repeat_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """Each row of `x` repeated n times in a row: [rows * n, ...]."""
    return x.repeat_interleave(n, dim=0)


# --- Exercise: the basic sampler -------------------------------------------------------------------

def _sampler_logits(case: Case) -> torch.Tensor:
    logits = logit_batch(case.seed + 50, 3, scale=1.5, vocab=8)
    logits[1, [2, 5]] = NEG_INF                  # filtered-out tokens: never to be drawn
    return logits


def produce_sampler(fn, case: Case, inputs: dict) -> dict:
    logits = _repeat_rows(_sampler_logits(case), DRAWS)
    what = "sample_basic"
    state = torch.get_rng_state()
    outputs = {"a": run_learner(what, fn, logits.clone(), torch.Generator().manual_seed(case.seed)),
               "a_again": run_learner(what, fn, logits.clone(), torch.Generator().manual_seed(case.seed)),
               "b": run_learner(what, fn, logits.clone(), torch.Generator().manual_seed(case.seed + 1)),
               "one": run_learner(what, fn, logits[:1].clone(), torch.Generator().manual_seed(case.seed))}
    outputs["global_rng_used"] = torch.tensor(not torch.equal(state, torch.get_rng_state()))
    torch.set_rng_state(state)
    for key in ("a", "a_again", "b", "one"):
        require_tensor(f"sample_basic(logits of shape {list(logits.shape)}, generator)", outputs[key])
    return outputs


def sampler_mistakes(logits: torch.Tensor) -> dict:
    possible = logits > NEG_INF
    # The softmax over the batch: the grader's batch is each row repeated DRAWS times, so each
    # column is normalised over DRAWS copies of every row.
    column = logits.double().exp() / (DRAWS * logits.double().exp().sum(0, keepdim=True))
    return {
        Mistake("softmax_over_batch", "softmax over the batch dimension (dim=0): each row's probabilities come "
                "from softmax over the vocabulary, dim=-1"): column / column.sum(-1, keepdim=True),
        Mistake("uniform_over_possible", "sampling uniformly among the possible tokens: draw proportionally to "
                "softmax(logits)"):
            possible.double() / possible.sum(-1, keepdim=True),
        Mistake("logits_ignored", "the logits are ignored: every token, filtered ones too, is drawn equally "
                "often; draw proportionally to softmax(logits)"):
            torch.full_like(logits.double(), 1 / logits.shape[-1]),
        Mistake("softmax_twice", "the softmax is taken twice (the sampler must apply it once, to the logits)"):
            logits.double().softmax(-1).softmax(-1) * possible,
        Mistake("logits_doubled", "the logits are doubled (a temperature of 0.5 is applied)"):
            (2 * logits.double()).softmax(-1),
    }


def judge_sampler(case: Case, outputs: dict) -> None:
    logits = _sampler_logits(case)
    n = logits.shape[0] * DRAWS
    where = f"sample_basic(logits of shape [{n}, {logits.shape[1]}], generator)"
    for key, rows in (("a", n), ("one", 1)):
        if tuple(outputs[key].shape) == (rows, 1):
            raise CheckFailed(f"{where}: shape {list(outputs[key].shape)}, expected [batch={rows}]. "
                              "Likely mistake: the [batch, 1] result of torch.multinomial is "
                              "returned as it is: take [:, 0] (or squeeze(-1)).",
                              mistake="multinomial_not_squeezed")
        check_shape(where, outputs[key], (rows,), ("batch",))
    judge_randomness("sample_basic", outputs, "tokens",
                     "torch.multinomial(probs, 1, generator=generator)",
                     {Mistake("always_argmax", "always takes the most likely token (argmax)"):
                      _repeat_rows(logits, DRAWS).argmax(-1)})
    judge_draws(where, outputs["a"].reshape(logits.shape[0], DRAWS), as_probs(logits),
                sampler_mistakes(logits))


sampler_exercise = Exercise("08_sampling", "sample_basic", produce_sampler, judge_sampler,
                            defaults={"text": None})
check_sampler = sampler_exercise.checker(
    "Grade `sample_basic(logits, generator)` from many seeded draws.")


# --- Exercise: sample_next_token (the whole pipeline) ----------------------------------------------

PIPELINE_VOCAB = 12
PIPELINES = {"all": dict(temperature=0.7, top_k=6, top_p=0.8, freq_penalty=0.8),
             "penalty": dict(temperature=1.3, freq_penalty=1.5),
             "top_p": dict(temperature=2.0, top_p=0.6),
             "top_k": dict(temperature=1.5, top_k=3)}


def _pipeline_inputs(case: Case):
    batch = max(case.batch, 2)
    generator = torch.Generator().manual_seed(case.seed + 60)
    input_ids = torch.randint(0, 4, (batch, 10), generator=generator)
    return input_ids, logit_batch(case.seed + 61, batch, scale=2.0, vocab=PIPELINE_VOCAB)


TEMPERATURE_MULTIPLIES = "temperature_multiplies"       # its key, whichever check names it
ZERO_TEMPERATURE_NOT_GREEDY = "zero_temperature_not_greedy"


def pipeline_mistakes(input_ids, logits, settings) -> dict:
    t, k, p, a = (settings.get("temperature", 1.0), settings.get("top_k", 0),
                  settings.get("top_p", 1.0), settings.get("freq_penalty", 0.0))
    penalised = apply_frequency_penalty(input_ids, logits, a)
    wrong = {
        Mistake("temperature_after_filters", "the temperature is applied after top-k/top-p filtering (apply it "
                "before: filtering must see the tempered distribution)"):
            apply_temperature(apply_top_p(apply_top_k(penalised, k) if k else penalised, p)
                              if p < 1 else (apply_top_k(penalised, k) if k else penalised), t),
        Mistake("penalty_after_temperature", "the frequency penalty is applied after the temperature (penalise "
                "the raw logits first)"):
            next_token_logits(input_ids, apply_temperature(logits, t), 1.0, k, p, a),
        Mistake("penalty_ignored", "the frequency penalty is ignored"):
            next_token_logits(input_ids, logits, t, k, p, 0.0),
        Mistake("temperature_ignored", "the temperature is ignored"):
            next_token_logits(input_ids, logits, 1.0, k, p, a),
        Mistake("top_k_ignored", "top_k is ignored (apply_top_k when top_k > 0)"):
            next_token_logits(input_ids, logits, t, 0, p, a),
        Mistake("top_p_ignored", "top_p is ignored (apply_top_p when top_p < 1)"):
            next_token_logits(input_ids, logits, t, k, 1.0, a),
        Mistake(TEMPERATURE_MULTIPLIES, "the temperature multiplies the logits instead of dividing them"):
            next_token_logits(input_ids, logits, 1 / t, k, p, a),
    }
    return {d: as_probs(w) for d, w in wrong.items()}


def produce_pipeline(fn, case: Case, inputs: dict) -> dict:
    input_ids, logits = _pipeline_inputs(case)
    what = "sample_next_token"
    outputs = {}
    for key, settings in PIPELINES.items():
        outputs[key] = run_learner(what, fn, _repeat_rows(input_ids, DRAWS), _repeat_rows(logits, DRAWS),
                                   torch.Generator().manual_seed(case.seed), **settings)
    penalty_ids = _penalty_probe(input_ids, logits)
    for key, ids, settings in (("greedy", input_ids, dict(temperature=0.0)),
                               ("greedy_penalty", penalty_ids, dict(temperature=0.0, freq_penalty=PROBE_PENALTY))):
        try:
            outputs[key] = run_learner(what, fn, ids.clone(), logits.clone(),
                                       torch.Generator().manual_seed(case.seed), **settings)
        except CheckFailed as failure:
            if not is_crash(failure):
                raise
            greedy = Mistake(ZERO_TEMPERATURE_NOT_GREEDY, "temperature 0 means greedy decoding: return the argmax "
                             "of the penalised logits (dividing the logits by 0 gives inf and NaN)")
            raise crash(what, failure, ", ".join(f"{k}={v}" for k, v in settings.items()),
                        greedy) from failure.__cause__
    outputs["cold"] = run_learner(what, fn, input_ids.clone(), logits.clone(),
                                  torch.Generator().manual_seed(case.seed), temperature=1e-4)
    for key, value in outputs.items():
        require_tensor(f"sample_next_token ({key})", value)
    return outputs


PROBE_PENALTY = 1.0


def _penalty_probe(input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """input_ids in which each row repeats its most likely token enough times that, with
    freq_penalty PROBE_PENALTY, the penalised argmax is another token (by a clear margin)."""
    ids = input_ids.clone()
    top2 = logits.topk(2, -1).values
    repeats = ((top2[:, 0] - top2[:, 1]) / PROBE_PENALTY).ceil().long() + 2
    for row in range(ids.shape[0]):
        for n in range(int(repeats[row]), ids.shape[1] + 1):
            ids[row, :n] = logits[row].argmax()
            penalised = apply_frequency_penalty(ids[row:row + 1], logits[row:row + 1], PROBE_PENALTY)
            best = penalised.topk(2, -1).values[0]
            if float(best[0] - best[1]) > DECISION_MARGIN:     # no near-tie decides the probe
                break
    return ids


def judge_pipeline(case: Case, outputs: dict) -> None:
    input_ids, logits = _pipeline_inputs(case)
    batch = logits.shape[0]
    expected = greedy_search(logits)
    for key, temperature in (("greedy", 0.0), ("cold", 1e-4)):
        where = f"sample_next_token(..., temperature={temperature})"
        check_shape(where, outputs[key], (batch,), ("batch",))
        if not torch.equal(outputs[key], expected):
            raise CheckFailed(f"{where} returned {outputs[key].tolist()}, expected the most likely "
                              f"tokens {expected.tolist()}. " + (
                                  "Temperature 0 means greedy decoding: return the argmax of the "
                                  "(penalised) logits; dividing by 0 gives inf/nan." if temperature == 0 else
                                  "Likely mistake: the temperature multiplies the logits instead of "
                                  "dividing them (a temperature near 0 must make sampling greedy)."),
                              mistake=ZERO_TEMPERATURE_NOT_GREEDY if temperature == 0 else TEMPERATURE_MULTIPLIES)
    ids = _penalty_probe(input_ids, logits)
    where = f"sample_next_token(..., temperature=0.0, freq_penalty={PROBE_PENALTY})"
    penalised = greedy_search(apply_frequency_penalty(ids, logits, PROBE_PENALTY))
    check_shape(where, outputs["greedy_penalty"], (batch,), ("batch",))
    if not torch.equal(outputs["greedy_penalty"], penalised):
        ignored = torch.equal(outputs["greedy_penalty"], greedy_search(logits))
        why = (" Likely mistake: at temperature 0 the frequency penalty is ignored (greedy on the raw "
               "logits): penalise first, then take the argmax of the penalised logits."
               if ignored else "")
        raise CheckFailed(f"{where} on tokens that repeat each row's most likely token returned "
                          f"{outputs['greedy_penalty'].tolist()}, expected {penalised.tolist()} (the "
                          f"most likely tokens after the penalty).{why}",
                          mistake="greedy_ignores_penalty" if ignored else None)
    for key, settings in PIPELINES.items():
        where = f"sample_next_token(..., {', '.join(f'{k}={v}' for k, v in settings.items())})"
        check_shape(where, outputs[key], (batch * DRAWS,), ("batch",))
        probs = as_probs(next_token_logits(input_ids, logits, **settings))
        judge_draws(where, outputs[key].reshape(batch, DRAWS), probs,
                    pipeline_mistakes(input_ids, logits, settings))


# sample_next_token runs with the course's greedy search, temperature, penalty, filters and basic
# sampler in place of the learner's, which have checks of their own: a mistake in one costs that
# check only.
pipeline_exercise = Exercise("08_sampling", "sample_next_token",
                             produce_pipeline,
                             judge_pipeline, defaults={"text": None}, course_parts=SAMPLING_PARTS)
check_sample_next_token = pipeline_exercise.checker(
    """Grade `sample_next_token(input_ids, logits, generator, temperature, top_k, top_p,
    freq_penalty)`: greedy at temperature 0, and the sampled distribution otherwise.""")
