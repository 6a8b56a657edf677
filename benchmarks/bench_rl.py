"""Notebook 14's graded RL run, over a sweep of seeds: every figure the notebook states about it
is printed here, with the minimum, median and maximum over the seeds.

    python benchmarks/bench_rl.py [--seeds 12] [--parts run collapse]

- run: the check's own run (runs.produce, one thread) of the course's train_grpo and of the
  catalog's loop in another style (tests/catalog/test_catalog_14.py), per seed: held-out sampled
  exact-match accuracy before and after, its gain, the rise of the batches' mean reward (last 10
  steps' against the first 10's), KL(policy || reference) per held-out answer token, greedy
  exact answers after, and the seconds.
- collapse: the notebook's demonstration, beta = 0 and a learning rate of 3e-3, on seeds 0-2: the
  same figures, and how many different greedy answers the policy gives the 14 held-out questions
  (the most common one named).

One thread, as the grader runs them: the figures do not depend on the machine, the seconds do.
Each run of `run` is judged by the check's own judge, so a seed below a floor prints FAILS.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from graders.exercises.nb13 import tasks  # noqa: E402
from graders.exercises.nb14 import reference as ref  # noqa: E402
from graders.exercises.nb14 import runs  # noqa: E402
from graders.judging.cases import Case  # noqa: E402
from graders.judging.compare import CheckFailed  # noqa: E402


def spread(values, digits=3) -> str:
    return (f"min {min(values):.{digits}f}, median {statistics.median(values):.{digits}f}, "
            f"max {max(values):.{digits}f}")


def figures(loop, seed: int) -> dict:
    case = Case(text=None, seed=seed)
    start = time.perf_counter()
    outputs = runs.produce(loop, case, runs.run_inputs(case))
    seconds = time.perf_counter() - start
    reference_logits = runs.held_out_logits(tasks.sft_model())
    before = runs.held_out_figures(reference_logits, reference_logits)[0]
    after, kl = runs.held_out_figures(outputs["policy_logits"], reference_logits)
    history = outputs["history"]
    try:
        runs.judge(case, outputs)
        verdict = "passes"
    except CheckFailed as failure:
        verdict = "FAILS: " + str(failure).split("\n")[0]
    return {"before": before, "after": after, "gain": after - before,
            "reward rise": float(history[-10:, 0].mean() - history[:10, 0].mean()),
            "reward last 10": float(history[-10:, 0].mean()), "kl": kl, "seconds": seconds, "verdict": verdict}


def collapse_loop(policy, reference, make_batch, n_steps, generator):
    return ref.train_grpo(policy, reference, make_batch, n_steps, generator, lr=3e-3, beta=0.0)


def greedy_answers(loop, seed: int) -> list[str]:
    """The greedy held-out answers of the policy `loop` trains, seeded as the check seeds it."""
    policy = tasks.sft_model()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        loop(policy, tasks.sft_model(), runs.make_batch_from(runs.prompt_batches(seed, ref.RECIPE["steps"],
             ref.RECIPE["prompts"])), ref.RECIPE["steps"], torch.Generator().manual_seed(seed))
    return tasks.answers(policy.eval())


def sweep(name: str, loop, seeds: int) -> None:
    print(f"\n{name}:")
    found = []
    for seed in range(seeds):
        row = figures(loop, seed)
        found.append(row)
        print(f"  seed {seed:2d}: accuracy {row['before']:.3f} -> {row['after']:.3f}, reward rise "
              f"{row['reward rise']:.3f}, KL {row['kl']:.3f}, {row['seconds']:.1f} s, {row['verdict']}", flush=True)
    for key in ("before", "after", "gain", "reward rise", "reward last 10", "kl", "seconds"):
        print(f"  {key:15} {spread([row[key] for row in found], 1 if key == 'seconds' else 3)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--parts", nargs="+", default=["run", "collapse"], choices=["run", "collapse"])
    args = parser.parse_args()
    print(f"floors: accuracy gain >= {runs.ACCURACY_GAIN}, reward rise >= {runs.REWARD_RISE}, "
          f"KL <= {runs.KL_BOUND}; recipe {ref.RECIPE}")
    if "run" in args.parts:
        tests = Path(__file__).resolve().parent.parent / "tests"
        sys.path[:0] = [str(tests), str(tests / "catalog")]     # the catalog and its helpers, as pytest's pythonpath
        from test_catalog_14 import _train

        sweep("the course's train_grpo", ref.train_grpo, args.seeds)
        sweep("the catalog's loop (its own log-probs, another layout)", _train(), args.seeds)
    if "collapse" in args.parts:
        sweep("beta = 0, learning rate 3e-3 (the notebook's demonstration)", collapse_loop, min(args.seeds, 3))
        for seed in range(min(args.seeds, 3)):
            said = greedy_answers(collapse_loop, seed)
            common = max(set(said), key=said.count)
            print(f"  seed {seed}: {len(set(said))} different greedy answers to the {len(said)} held-out questions; "
                  f"{said.count(common)} of them {common!r}")


if __name__ == "__main__":
    main()
