"""Notebook 09, exercise 5: masked-language-modelling data (`mask_tokens`) and its loss (`mlm_loss`).

`mask_tokens(tokens, generator) -> (inputs, targets)` is judged from many positions masked with
a generator the grader seeds (so a verdict never changes between runs): exact rules first
(targets are the original token or -100; special tokens are never chosen; unchosen positions keep
their token), then distribution tests: the chosen fraction (15% of the ordinary positions, at
every position), the split of the chosen ones (80% [MASK], 10% a random ordinary token, 10%
unchanged; a random token equals the original 1 time in 100) and the random tokens' spread.
A correct function fails a test with probability P_VALUE_FLOOR (1e-6) per seed.
"""
from __future__ import annotations

import math

import torch

from graders.exercises.nb09.tasks import (IGNORE, MASK, N_ORDINARY, P_CHOOSE, P_MASK, P_RANDOM, SPECIALS,
                                          reference_mlm_loss, reversal_pairs)
from graders.exercises.nb08.samplers import chi_square_p_value
from graders.judging.cases import Case, rand_float
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, judge_generator_use, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner
from graders.judging.tolerance import P_VALUE_FLOOR

N_PAIRS, N_SCATTERED, SCATTERED_LEN = 2000, 600, 24
LOSS_ON_EVERY_POSITION = Mistake(
    "targets_at_every_position",
    "loss on every position: the targets hold the original token everywhere, so the model would "
    "be scored on copying the tokens it can see. Only the chosen positions get a target; every "
    "other one must be -100 (IGNORE), which the loss skips")


def _inputs(case: Case) -> list[torch.Tensor]:
    """Reversal pairs ([CLS] a [SEP] reversed(a) [SEP]), and ordinary tokens with special ones
    ([CLS], [SEP] and [MASK]) scattered at random positions."""
    pairs, _ = reversal_pairs(N_PAIRS, torch.Generator().manual_seed(300 + case.seed))
    generator = torch.Generator().manual_seed(400 + case.seed)
    scattered = torch.randint(0, N_ORDINARY, (N_SCATTERED, SCATTERED_LEN), generator=generator)
    special = torch.rand(scattered.shape, generator=generator) < 0.2
    pick = torch.randint(0, len(SPECIALS), scattered.shape, generator=generator)
    scattered = torch.where(special, torch.tensor(SPECIALS)[pick], scattered)
    return [pairs, scattered]


def _call(fn, tokens: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    what = f"mask_tokens(tokens of shape {list(tokens.shape)}, generator)"
    copy = tokens.clone()
    result = run_learner("mask_tokens", fn, copy, torch.Generator().manual_seed(seed))
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"{what} returned {type(result).__name__}; return a tuple (inputs, targets) "
                          "of two tensors shaped like tokens.")
    inputs, targets = result
    for name, value in (("inputs", inputs), ("targets", targets)):
        check_shape(f"{what}: {name}", value, tokens.shape, ("sequence", "position"))
        if value.dtype != torch.long:
            raise CheckFailed(f"{what}: {name} has dtype {value.dtype}; token ids are torch.long.")
    return inputs, targets, torch.tensor(not torch.equal(copy, tokens))


def produce_mask(fn, case: Case, inputs: dict) -> dict:
    pairs, scattered = _inputs(case)
    state = torch.get_rng_state()
    outputs = {}
    for key, tokens, seed in (("a", pairs, case.seed), ("a_again", pairs, case.seed),
                              ("b", pairs, case.seed + 1), ("s", scattered, case.seed + 2)):
        inputs_, targets, modified = _call(fn, tokens, seed)
        outputs.update({f"{key}.inputs": inputs_, f"{key}.targets": targets, f"{key}.modified": modified})
    outputs["global_rng_used"] = torch.tensor(not torch.equal(state, torch.get_rng_state()))
    torch.set_rng_state(state)
    return outputs


def _p_normal(count: int, n: int, p: float) -> float:
    """Two-sided p-value of `count` successes in `n` trials of probability `p` (normal approximation)."""
    z = abs(count - n * p) / math.sqrt(n * p * (1 - p))
    return float(torch.special.erfc(torch.tensor(z / math.sqrt(2), dtype=torch.float64)))


SPLITS = {  # (MASK, unchanged, another ordinary token) among chosen positions
    Mistake("all_chosen_masked", "every chosen token is replaced by [MASK]: only 80% are; 10% get a random "
            "token and 10% stay"):
        (1.0, 0.0, 0.0),
    Mistake("no_random_branch", "the random branch is missing (80% [MASK], 20% unchanged): 10% of the chosen "
            "tokens get a random ordinary token"): (0.8, 0.2, 0.0),
    Mistake("no_unchanged_branch", "the unchanged branch is missing (80% [MASK], 20% random): 10% of the "
            "chosen tokens stay as they are"): (0.8, 0.002, 0.198),
    Mistake("random_branch_too_small", "the random branch takes 10% of the remaining 20% (2% overall): of the "
            "chosen positions that are not [MASK]ed, half get a random token"): (0.8, 0.18 + 0.0002, 0.0198),
    Mistake("split_reversed", "the proportions are reversed (10% [MASK], 80% unchanged): 80% of the chosen "
            "tokens become [MASK]"): (0.1, 0.8 + 0.001, 0.099),
}
EXPECTED_SPLIT = (P_MASK, 1 - P_MASK - P_RANDOM + P_RANDOM / N_ORDINARY, P_RANDOM * (1 - 1 / N_ORDINARY))


def judge_mask(case: Case, outputs: dict) -> None:
    what = "mask_tokens"
    if any(bool(outputs[f"{k}.modified"]) for k in ("a", "a_again", "b", "s")):
        raise CheckFailed(f"{what} changed the tokens tensor it was given in place; build new "
                          "tensors (e.g. tokens.clone() or torch.where).")
    judge_generator_use(what, {"a": torch.cat([outputs["a.inputs"], outputs["a.targets"]]),
                               "a_again": torch.cat([outputs["a_again.inputs"], outputs["a_again.targets"]]),
                               "b": torch.cat([outputs["b.inputs"], outputs["b.targets"]]),
                               "global_rng_used": outputs["global_rng_used"]},
                        "masks", "torch.rand(..., generator=generator)")
    pairs, scattered = _inputs(case)
    tokens = torch.cat([pairs.flatten(), scattered.flatten()])
    inputs = torch.cat([outputs["a.inputs"].flatten(), outputs["s.inputs"].flatten()])
    targets = torch.cat([outputs["a.targets"].flatten(), outputs["s.targets"].flatten()])
    special, chosen = tokens >= N_ORDINARY, targets != IGNORE
    if bool((chosen & (targets != tokens)).any()):
        wrong = chosen & (targets != tokens)
        masked = bool((targets[wrong] == inputs[wrong]).all())
        raise CheckFailed(f"{what}: at {int(wrong.sum())} chosen positions the target is not the "
                          "original token."
                          + ("\n  Likely mistake: the targets are the corrupted inputs; the model must "
                             "predict what was there before masking (the original token)." if masked else
                             "\n  A target is the original token at a chosen position, -100 (IGNORE) "
                             "elsewhere."),
                          mistake="targets_are_corrupted_inputs" if masked else None)
    if bool(chosen.all()) or bool((chosen.double().mean() > 0.9)):
        raise CheckFailed(f"{what}: {100 * chosen.double().mean():.0f}% of the positions have a target.\n"
                          f"  Likely mistake: {LOSS_ON_EVERY_POSITION}.", mistake=LOSS_ON_EVERY_POSITION.key)
    altered = (inputs != tokens) & ~chosen & ~special
    if bool(altered.any()):
        share = altered.sum() / (~chosen & ~special).sum()
        raise CheckFailed(f"{what}: {100 * share:.1f}% of the positions that have no target were changed "
                          "anyway.\n  Likely mistake: 80/10/10 is applied to all tokens: only the chosen "
                          "15% are replaced ([MASK] 80%, random 10%, unchanged 10%); every other position "
                          "keeps its token (its target is -100).", mistake="unchosen_tokens_altered")
    if bool((chosen & special).any()) or bool(((inputs != tokens) & special).any()):
        raise CheckFailed(f"{what}: special tokens ([CLS] = 100, [SEP] = 101, [MASK] = 102) were chosen or "
                          f"replaced at {int(((inputs != tokens) | chosen)[special].sum())} of "
                          f"{int(special.sum())} special positions.\n  Likely mistake: masking special "
                          "tokens: only ordinary tokens (ids < 100) may be chosen; specials always stay.",
                          mistake="special_tokens_masked")
    _judge_split(what, tokens[chosen], inputs[chosen])
    _judge_rate(what, pairs, outputs["a.targets"], scattered, outputs["s.targets"])


def _judge_split(what: str, original: torch.Tensor, replaced: torch.Tensor) -> None:
    if bool(((replaced >= N_ORDINARY) & (replaced != MASK)).any()):
        raise CheckFailed(f"{what}: chosen positions were replaced by special tokens other than [MASK].\n  "
                          "Likely mistake: the random token is drawn from the whole vocabulary; draw it "
                          f"from the ordinary tokens, torch.randint(0, {N_ORDINARY}, ..., "
                          "generator=generator).", mistake="random_token_from_whole_vocabulary")
    counts = torch.tensor([int((replaced == MASK).sum()), int((replaced == original).sum()),
                           int(((replaced != MASK) & (replaced != original)).sum())])
    p_value = chi_square_p_value(counts, torch.tensor(EXPECTED_SPLIT, dtype=torch.float64))
    if p_value < P_VALUE_FLOOR:
        shares = ", ".join(f"{name} {100 * c / counts.sum():.1f}%" for name, c in
                           zip(("[MASK]", "unchanged", "another token"), counts.tolist()))
        likely = next((d for d, probs in SPLITS.items()
                       if not ((counts > 0) & (torch.tensor(probs) == 0)).any()
                       and chi_square_p_value(counts, torch.tensor(probs, dtype=torch.float64))
                       >= P_VALUE_FLOOR), None)
        raise CheckFailed(f"{what}: of {int(counts.sum())} chosen positions: {shares}; expected 80%, "
                          f"10.1% (10% kept, plus random draws that hit the same token) and 9.9% "
                          f"(chi-square p-value {p_value:.2g} < {P_VALUE_FLOOR:g})."
                          + (f"\n  Likely mistake: {likely}" if likely else ""), mistake=mistake_key(likely))
    others = replaced[(replaced != MASK) & (replaced != original)]
    groups = torch.bincount(others // 10, minlength=N_ORDINARY // 10).double()
    p_value = chi_square_p_value(groups, torch.full((N_ORDINARY // 10,), 0.1, dtype=torch.float64))
    if p_value < P_VALUE_FLOOR:
        raise CheckFailed(f"{what}: the random replacement tokens are not uniform over the ordinary tokens "
                          f"0..{N_ORDINARY - 1} (counts by tens {groups.long().tolist()}; chi-square p-value "
                          f"{p_value:.2g}). Draw them with torch.randint(0, {N_ORDINARY}, ..., "
                          "generator=generator).")


def _judge_rate(what: str, pairs, pair_targets, scattered, scattered_targets) -> None:
    for name, tokens, targets in (("the reversal pairs", pairs, pair_targets),
                                  ("sequences with scattered special tokens", scattered, scattered_targets)):
        ordinary = tokens < N_ORDINARY
        n, count = int(ordinary.sum()), int((targets != IGNORE).sum())
        if _p_normal(count, n, P_CHOOSE) < P_VALUE_FLOOR:
            rate = count / n
            likely = (Mistake("choice_comparison_reversed", "the comparison is reversed: a position is chosen "
                              "when rand < 0.15")
                      if abs(rate - 0.85) < 0.02 else "")
            raise CheckFailed(f"{what}: on {name}, {100 * rate:.2f}% of the {n} ordinary positions were "
                              f"chosen; expected 15%." + (f"\n  Likely mistake: {likely}" if likely else ""),
                              mistake=mistake_key(likely))
        per_position = (targets != IGNORE).double().sum(0) / ordinary.double().sum(0).clamp(min=1)
        for position in range(tokens.shape[1]):
            m = int(ordinary[:, position].sum())
            count = int((targets[:, position] != IGNORE).sum())
            if m > 200 and _p_normal(count, m, P_CHOOSE) < P_VALUE_FLOOR:
                raise CheckFailed(f"{what}: on {name}, position {position} was chosen "
                                  f"{100 * float(per_position[position]):.1f}% of the time; every ordinary "
                                  "position must be chosen with probability 0.15, independently.")


mask_exercise = Exercise("09_transformer_family", "mask_tokens", produce_mask, judge_mask,
                         defaults={"text": None})
check_mask_tokens = mask_exercise.checker(
    "Grade `mask_tokens(tokens, generator) -> (inputs, targets)` with distribution tests on many "
    "positions masked with seeded generators.")


# --- mlm_loss --------------------------------------------------------------------------------

def _loss_inputs(case: Case, i: int):
    batch, seq = (case.batch, case.seq) if i == 0 else (2, 7)
    generator = torch.Generator().manual_seed(100 + case.seed + i)
    logits = rand_float(case.seed + 10 * i, batch, seq, 103) * 2
    targets = torch.randint(0, 103, (batch, seq), generator=generator)
    keep = torch.rand(batch, seq, generator=generator) < 0.15 + 0.2 * torch.arange(batch)[:, None] / batch
    keep[:, i] = True                                    # every sequence has at least one target
    return logits, torch.where(keep, targets, IGNORE)


def loss_mistakes(logits: torch.Tensor, targets: torch.Tensor) -> dict:
    lp = logits.double().log_softmax(-1)
    chosen = targets != IGNORE
    picked = lp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    per_seq = (picked * chosen).sum(1) / chosen.sum(1)
    return {
        Mistake("mean_over_every_position", "the loss is averaged over every position (the ignored ones count "
                "as 0): divide by the number of chosen positions only"): -(picked * chosen).sum() / chosen.numel(),
        Mistake("ignored_positions_scored", "loss on every position: positions whose target is -100 are scored "
                "too (here against token 0): the loss only counts the chosen positions"): -picked.mean(),
        Mistake("mean_of_sequence_means", "each sequence's mean is averaged: every chosen position counts once, "
                "whichever sequence it is in"):
            -per_seq.mean(),
        Mistake("sum_not_mean", "a sum instead of a mean over the chosen positions"): -(picked * chosen).sum(),
        Mistake("no_log_softmax", "raw logits used as log-probabilities: apply log_softmax first"):
            -(logits.double().gather(-1, targets.clamp(min=0)[..., None])[..., 0] * chosen).sum()
            / chosen.sum(),
        Mistake("sign_flipped", "the sign: the loss is the NEGATIVE mean log-probability"):
            (picked * chosen).sum() / chosen.sum(),
    }


def produce_loss(fn, case: Case, inputs: dict) -> dict:
    outputs = {}
    for i in range(2):
        logits, targets = _loss_inputs(case, i)
        value = run_learner("mlm_loss", fn, logits, targets)
        outputs[f"loss_{i}"] = value
    return outputs


def judge_loss(case: Case, outputs: dict) -> None:
    for i in range(2):
        logits, targets = _loss_inputs(case, i)
        loss = outputs.get(f"loss_{i}")
        if isinstance(loss, torch.Tensor) and loss.ndim > 0 and loss.numel() == 1:
            loss = loss.reshape(())
        compare(f"mlm_loss on logits of shape {list(logits.shape)}", loss,
                reference_mlm_loss(logits, targets).float(), (), mistakes=lambda: loss_mistakes(logits, targets),
                hint="the mean cross-entropy over the positions that have a target only; the others hold "
                     "-100 (look up F.cross_entropy's ignore_index).",
                fix="return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)")


loss_exercise = Exercise("09_transformer_family", "mlm_loss", produce_loss, judge_loss,
                         defaults={"text": None, "batch": 4, "seq": 19})
check_mlm_loss = loss_exercise.checker(
    "Grade `mlm_loss(logits, targets) -> scalar`: cross-entropy over the positions whose target is not -100.")
