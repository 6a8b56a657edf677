"""Notebook 14, exercises 2 and 3: `reward(completion, answer)`, judged on completions a sampler
writes (right, unstopped, one token too long, another answer), and `group_advantages(rewards,
scale)`, judged against the equations in float64: (r - group mean) / (group std + 1e-4) with
Bessel's correction, as trl computes it, and Dr. GRPO's r - group mean. trl's own computation
(inside GRPOTrainer._generate_and_score_completions) is a test-only cross-check
(tests/catalog/test_catalog_14.py)."""
from __future__ import annotations

import torch

from graders.judging.compare import CheckFailed, with_fix
from graders.exercises.nb13 import tasks
from graders.exercises.nb14 import reference as ref
from graders.judging.cases import Case
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner

NOTEBOOK = "14_rl_verifiable_rewards"
IM_END = ref.IM_END
FORBIDDEN = Forbidden("GRPO", source_words=["trl", "GRPOTrainer"], instead="from the paper's equations",
                      library_code=("trl",), notebook_wide=False)
REWARD_SLIPS = {
    "end_optional": "the end marker is not required: an answer that runs on without <|im_end|> is rewarded, so the "
                    "model is never taught to stop",
    "prefix": "a prefix match: the completion only has to start with the answer, so '12<|im_end|>' earns the "
              "reward of '1'",
}
ADVANTAGE_SLIPS = {
    "batch": "normalised over the whole batch instead of each group: the baseline of a prompt is its own group's "
             "mean, so that an easy prompt's right answers do not count more than a hard one's",
    "population_std": "the standard deviation without Bessel's correction (a divisor G): the course follows trl, "
                      "which divides the squared deviations by G - 1",
    "no_eps": "no epsilon in the denominator: when the whole group is right (or wrong) its std is 0 and every "
              "advantage 0 / 0 = NaN; add 1e-4 to the std",
}


def completions(case: Case) -> list[tuple[str, str]]:
    """(completion, answer) pairs: each answer right, without its end, one token too long, after
    a space, and another question's answer, so that every listed mistake rewards one wrongly."""
    picked = [tasks.QUESTIONS[(5 * case.seed + k) % len(tasks.QUESTIONS)] for k in (1, 27, 40, 0)]
    pairs = []
    for k, (_, answer) in enumerate(picked):
        other = picked[(k + 1) % len(picked)][1]
        pairs += [(answer + IM_END, answer), (answer, answer), (answer + "1" + IM_END, answer),
                  (" " + answer + IM_END, answer), (other + IM_END, answer)]
    pairs.append(("1" + "2" + IM_END, "1"))
    return pairs


def produce_reward(reward, case: Case, inputs: dict) -> dict:
    if not callable(reward):
        raise CheckFailed(f"reward: expected your function, got {reward!r}.")
    got = [run_learner("reward", reward, text, answer, forbidden=FORBIDDEN) for text, answer in completions(case)]
    try:
        return {"rewards": torch.tensor([float(r) for r in got], dtype=torch.float64)}
    except (TypeError, ValueError):
        raise CheckFailed("reward should return a number (1.0 or 0.0) for each completion; it returned "
                          f"{type(got[0]).__name__}.") from None


def judge_reward(case: Case, outputs: dict) -> None:
    pairs, got = completions(case), outputs["rewards"]
    want = torch.tensor([ref.reward(t, a) for t, a in pairs], dtype=torch.float64)
    if torch.equal(got, want):
        return
    for slip, description in REWARD_SLIPS.items():
        if torch.equal(got, torch.tensor([ref.reward(t, a, slip) for t, a in pairs], dtype=torch.float64)):
            k = int((got != want).nonzero()[0])
            raise CheckFailed(f"reward({pairs[k][0]!r}, {pairs[k][1]!r}) returned {float(got[k]):g}; the completion is "
                              f"not the answer followed by <|im_end|>. Likely mistake: {description}.",
                              mistake=slip)
    k = int((got != want).nonzero()[0])
    text, answer = pairs[k]
    raise CheckFailed(with_fix(f"reward({text!r}, {answer!r}) returned {float(got[k]):g}, where the reward is "
                               f"{float(want[k]):g}: 1.0 exactly when the completion is the answer followed by the end "
                               "marker, 0.0 otherwise (no partial credit, no stripping).",
                               "return float(completion == answer + IM_END)"))


def reward_inputs_description(case: Case) -> str:
    return f"{len(completions(case))} completions (seed {case.seed})"


reward_exercise = Exercise(NOTEBOOK, "reward", produce_reward, judge_reward, forbidden=(FORBIDDEN,),
                           defaults={"text": None}, describe=reward_inputs_description)
check_reward = reward_exercise.checker(
    "Grade `reward(completion, answer)` on completions a sampler writes: 1.0 exactly for the answer and <|im_end|>.")


# --- group_advantages ------------------------------------------------------------------------------

def reward_table(case: Case) -> torch.Tensor:
    """[n_groups, group_size] of 0/1 rewards: one group all right, one all wrong, the others mixed,
    of different means, so that a batch-wide baseline or a missing epsilon shows."""
    generator = torch.Generator().manual_seed(300 + case.seed)
    groups, size = case.batch, 4 + 2 * (case.seed % 3)
    table = (torch.rand(groups, size, generator=generator) < torch.linspace(0.2, 0.8, groups)[:, None]).double()
    table[0], table[1] = 1.0, 0.0
    table[2, :2], table[2, 2:] = 1.0, 0.0
    return table


def produce_advantages(group_advantages, case: Case, inputs: dict) -> dict:
    if not callable(group_advantages):
        raise CheckFailed(f"group_advantages: expected your function, got {group_advantages!r}.")
    outputs = {}
    for scale in (True, False):
        got = run_learner("group_advantages", group_advantages, reward_table(case), scale, forbidden=FORBIDDEN)
        if not isinstance(got, torch.Tensor):
            raise CheckFailed(f"group_advantages returned {type(got).__name__}; return a tensor of the rewards' shape.")
        outputs[f"scale_{scale}"] = got.detach().double()
    return outputs


def judge_advantages(case: Case, outputs: dict) -> None:
    rewards = reward_table(case)
    groups, size = rewards.shape
    for scale in (True, False):
        got, want = outputs[f"scale_{scale}"], ref.group_advantages(rewards, scale)
        where = (f"group_advantages on {groups} groups of {size} rewards, scale={scale} "
                 f"({'GRPO' if scale else 'Dr. GRPO: no std'})")
        if got.shape != want.shape:
            raise CheckFailed(f"{where} returned {list(got.shape)}; return one advantage per reward, "
                              f"{list(want.shape)}.")
        if torch.allclose(got, want, atol=1e-9, equal_nan=False):
            continue
        for slip, description in ADVANTAGE_SLIPS.items():
            if torch.allclose(got, ref.group_advantages(rewards, scale, slip), atol=1e-9, equal_nan=True):
                raise CheckFailed(f"{where} differs from the equation. Likely mistake: {description}.", mistake=slip)
        nan_rows = got.isnan().any(-1)
        if nan_rows.any():
            g = int(nan_rows.nonzero()[0])
            raise CheckFailed(f"{where}: group {g} (rewards {rewards[g].tolist()}) gets NaN advantages. Likely "
                              f"mistake: {ADVANTAGE_SLIPS['no_eps']}.", mistake="no_eps")
        group_means = got.mean(-1)
        if float(group_means.abs().max()) > 1e-6:
            g = int(group_means.abs().argmax())
            raise CheckFailed(f"{where}: group {g}'s advantages average {float(group_means[g]):.4g}, not 0: each "
                              "group's own mean is the baseline subtracted from its rewards (mean over dim -1, "
                              "keepdim=True).", mistake="baseline_not_group_mean")
        g, i = (int(x) for x in (~torch.isclose(got, want, atol=1e-9)).nonzero()[0])
        raise CheckFailed(f"{where}: group {g}, completion {i} gets {float(got[g, i]):.6g}, the equation "
                          f"{float(want[g, i]):.6g}.\n  Hint: the mean and the std are taken over each group (the last "
                          "dimension); the std is Bessel-corrected (torch's default) and 1e-4 is added to it.")


advantages_exercise = Exercise(NOTEBOOK, "group_advantages", produce_advantages, judge_advantages,
                               forbidden=(FORBIDDEN,), defaults={"text": None, "batch": 5},
                               describe=lambda case: f"{case.batch} groups of random rewards (seed {case.seed})")
check_group_advantages = advantages_exercise.checker(
    "Grade `group_advantages(rewards, scale)` against GRPO's group-normalised advantage and Dr. GRPO's, in float64.")
