"""Notebook 13's graded runs, per seed, with the course's reference `finetune` and `train_dpo`:
how far above its floor a correct loop lands (the grader runs seeds 0 and 1).

    finetune seed S: E% exact answers (floor F%); response loss B -> A; prompt loss B -> A; T s
    train_dpo seed S: P% of held-out pairs preferred (floor F%); margin after 0/40/80/120 steps; T s

    python benchmarks/bench_post_training.py [--sft-seeds 0 1 ...] [--dpo-seeds 0 1 ...]

One thread, as the grader runs them: the figures do not depend on the machine, the seconds do.
The runs and the figures are the check's own (runs.produce_*, runs.*_figures), outside a kernel.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graders.exercises.post_training import reference as ref  # noqa: E402
from graders.exercises.post_training import runs  # noqa: E402
from graders.judging.cases import Case  # noqa: E402


def bench_finetune(seed: int) -> float:
    case = Case(text=None, seed=seed)
    start = time.perf_counter()
    outputs = runs.produce_finetune(ref.finetune, case, runs.sft_inputs(case))
    seconds = time.perf_counter() - start
    _, accuracy, before, after = runs.finetune_figures(outputs)
    print(f"finetune seed {seed}: {100 * accuracy:.0f}% exact answers (floor {100 * runs.SFT_FLOOR:.0f}%); "
          f"response loss {before[0]:.2f} -> {after[0]:.2f}; prompt loss {before[1]:.2f} -> {after[1]:.2f} "
          f"(a loop trained on the prompt ends below {runs.PROMPT_LEARNED}); {seconds:.1f} s", flush=True)
    return accuracy


def bench_dpo(seed: int) -> float:
    case = Case(text=None, seed=seed)
    inputs = runs.dpo_inputs(case)
    start = time.perf_counter()
    outputs = runs.produce_dpo(ref.train_dpo, case, inputs)
    seconds = time.perf_counter() - start
    margins, accuracy = runs.dpo_figures(inputs, runs.reference_logits(inputs), outputs)
    print(f"train_dpo seed {seed}: {100 * accuracy:.0f}% of held-out pairs preferred (floor "
          f"{100 * runs.DPO_FLOOR:.0f}%); margin after {'/'.join(map(str, runs.PROBES))} steps "
          + " / ".join(f"{m:.2f}" for m in margins) + f" (floor {runs.DPO_MARGIN}); {seconds:.1f} s", flush=True)
    return accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-seeds", type=int, nargs="*", default=list(range(12)))
    parser.add_argument("--dpo-seeds", type=int, nargs="*", default=list(range(12)))
    args = parser.parse_args()
    finetuned = [bench_finetune(seed) for seed in args.sft_seeds]
    preferred = [bench_dpo(seed) for seed in args.dpo_seeds]
    if finetuned:
        print(f"finetune: lowest {100 * min(finetuned):.0f}% over {len(finetuned)} seeds, floor "
              f"{100 * runs.SFT_FLOOR:.0f}%")
    if preferred:
        print(f"train_dpo: lowest {100 * min(preferred):.0f}% over {len(preferred)} seeds, floor "
              f"{100 * runs.DPO_FLOOR:.0f}%")


if __name__ == "__main__":
    main()
