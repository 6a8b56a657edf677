"""Notebook 13's models and graded runs, over a sweep of seeds: every figure the notebook states
about them is printed here, with the minimum, median and maximum over the seeds.

    python benchmarks/bench_post_training.py [--seeds 12] [--parts base finetune dpo]

- base: the course's base model (built once per machine, then read from the course cache): how
  many of the 55 questions it answers asked as plain text, and for how many, asked in a
  conversation, it writes <|im_end|> within its first 16 tokens.
- finetune: the check's own run of the course's `finetune` (runs.produce_finetune, one thread),
  per seed: exact answers to the 14 held-out questions, the held-out losses, the seconds.
- dpo: the check's own run of train_dpo from the course's finetuned model, per seed, for the
  solution's loop and for a loop in another style (four forward passes a step, the catalog's):
  preference accuracy on the 42 held-out pairs, the reward margin after each probe, and for the
  solution the figures of the notebook's demonstration: KL(policy || reference) per held-out
  answer token after 40 and 120 steps, the chosen and rejected rewards over the last 10 steps'
  batches, and the exact answers of the reference and of the policy.

One thread, as the grader runs them: the figures do not depend on the machine, the seconds do.
Each run is judged by the check's own judge, so a seed below a floor prints FAILS.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from graders.exercises.nb13 import reference as ref  # noqa: E402
from graders.exercises.nb13 import runs, tasks  # noqa: E402
from graders.exercises.nb13.gpt import greedy  # noqa: E402
from graders.judging.cases import Case  # noqa: E402
from graders.judging.compare import CheckFailed  # noqa: E402


def spread(values, unit="", scale=1.0, digits=2) -> str:
    low, mid, high = (scale * v for v in (min(values), statistics.median(values), max(values)))
    return f"min {low:.{digits}f}{unit}, median {mid:.{digits}f}{unit}, max {high:.{digits}f}{unit}"


def verdict(judge, case, outputs) -> str:
    try:
        judge(case, outputs)
    except CheckFailed as failed:
        return "FAILS: " + str(failed).splitlines()[0]
    return "passes"


def bench_base() -> None:
    start = time.perf_counter()
    model = tasks.base_model()
    seconds = time.perf_counter() - start
    table, encoding = tasks.model_ids(), tasks.chat_encoding()
    newline = table[encoding.encode_ordinary("\n")[0]]
    plain = [[table[t] for t in encoding.encode_ordinary(q + "\n")] for q, _ in tasks.QUESTIONS]
    said = [tasks.decode(found).split("\n")[0] for found in greedy(model, plain, newline, 3)]
    right = sum(s == a for s, (_, a) in zip(said, tasks.QUESTIONS))
    held = sum(s == a for s, (q, a) in zip(said, tasks.QUESTIONS) if (q, a) in tasks.HELD_OUT)
    end = table[tasks.IM_END_ID]
    prompts = [tasks.example(q, a)[0] for q, a in tasks.QUESTIONS]
    stopped = sum(end in found for found in greedy(model, prompts, -1, 16))
    print(f"base model: asked as plain text it answers {right} of {len(tasks.QUESTIONS)} questions ({held} of the "
          f"{len(tasks.HELD_OUT)} held-out ones); in a conversation it writes <|im_end|> within 16 tokens for "
          f"{stopped} of {len(tasks.QUESTIONS)}; {seconds:.1f} s to build or read", flush=True)


def bench_finetune(seeds) -> None:
    accuracies, seconds = [], []
    for seed in seeds:
        case = Case(text=None, seed=seed)
        inputs = runs.sft_inputs(case)
        start = time.perf_counter()
        outputs = runs.produce_finetune(ref.finetune, case, inputs)
        seconds.append(time.perf_counter() - start)
        _, accuracy, before, after = runs.finetune_figures(outputs)
        accuracies.append(accuracy)
        print(f"finetune seed {seed}: {100 * accuracy:.0f}% exact answers; response loss {before[0]:.2f} -> "
              f"{after[0]:.2f}; prompt loss {before[1]:.2f} -> {after[1]:.2f}; {seconds[-1]:.1f} s; "
              f"{verdict(runs.judge_finetune, case, outputs)}", flush=True)
    print(f"finetune over {len(seeds)} seeds: exact answers {spread(accuracies, '%', 100, 0)} (floor "
          f"{100 * runs.SFT_FLOOR:.0f}%); {spread(seconds, ' s', digits=1)}", flush=True)


def four_passes(policy, reference, make_batch, n_steps, beta):
    """The catalog's other style: chosen and rejected through each model apart."""
    reference.requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=5e-4, weight_decay=0.0)
    history = []
    for _ in range(n_steps):
        batch = make_batch()
        logps = {}
        for name, model in (("policy", policy), ("reference", reference)):
            with torch.set_grad_enabled(name == "policy"):
                logps[name] = [ref.sequence_logprob(model(batch[f"{k}_tokens"]), batch[f"{k}_tokens"],
                                                    batch[f"{k}_mask"]) for k in ("chosen", "rejected")]
        loss = ref.dpo_loss(*logps["policy"], *logps["reference"], beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(tuple(beta * float((p - r).mean()) for p, r in zip(logps["policy"], logps["reference"])))
    return history


def response_kl(policy_logits: torch.Tensor, reference_logits: torch.Tensor) -> float:
    """Mean KL(policy || reference) of next-token distributions, as the notebook's demonstration computes it."""
    log_p, log_q = policy_logits.double().log_softmax(-1), reference_logits.double().log_softmax(-1)
    return float((log_p.exp() * (log_p - log_q)).sum(-1).mean())


def bench_dpo(seeds) -> None:
    figures = {key: [] for key in ("accuracy", "other style", "kl_40", "kl_end", "chosen", "rejected",
                                   "reference exact", "policy exact", "seconds")}
    for seed in seeds:
        case = Case(text=None, seed=seed)
        inputs = runs.dpo_inputs(case)
        trained = {}

        def solution(policy, reference, make_batch, n_steps, beta):
            trained["policy"], trained["reference"] = policy, reference
            return ref.train_dpo(policy, reference, make_batch, n_steps, beta)

        start = time.perf_counter()
        outputs = runs.produce_dpo(solution, case, inputs)
        figures["seconds"].append(time.perf_counter() - start)
        reference_logits = runs.reference_logits(inputs)
        margins, accuracy = runs.dpo_figures(inputs, reference_logits, outputs)
        other = runs.produce_dpo(four_passes, case, inputs)
        other_margins, other_accuracy = runs.dpo_figures(inputs, reference_logits, other)
        history = outputs["history"][-10:]
        probes = (runs.PROBES[1], runs.PROBES[-1])
        kls = [response_kl(outputs[f"policy_chosen_{s}"], reference_logits["chosen"]) for s in probes]
        exact = [tasks.exact_match(tasks.answers(trained[k].eval())) for k in ("reference", "policy")]
        for key, value in zip(figures, (accuracy, other_accuracy, *kls, float(history[:, 0].mean()),
                                        float(history[:, 1].mean()), *exact)):
            figures[key].append(value)
        print(f"train_dpo seed {seed}: {100 * accuracy:.1f}% of held-out pairs preferred, margin after "
              f"{'/'.join(map(str, runs.PROBES))} steps " + " / ".join(f"{m:.2f}" for m in margins)
              + f", {verdict(runs.judge_dpo, case, outputs)}; other style {100 * other_accuracy:.1f}%, margin "
              f"{other_margins[-1]:.2f}, {verdict(runs.judge_dpo, case, other)}; KL after {probes[0]} / {probes[1]} "
              f"steps {kls[0]:.3f} / {kls[1]:.3f}; last 10 steps' rewards chosen {figures['chosen'][-1]:.2f}, "
              f"rejected {figures['rejected'][-1]:.2f}; exact answers reference {100 * exact[0]:.0f}%, policy "
              f"{100 * exact[1]:.0f}%; {figures['seconds'][-1]:.1f} s", flush=True)
    n = len(seeds)
    print(f"train_dpo over {n} seeds: preference accuracy {spread(figures['accuracy'], '%', 100, 1)} (floor "
          f"{100 * runs.DPO_FLOOR:.0f}%); the other style {spread(figures['other style'], '%', 100, 1)}", flush=True)
    print(f"train_dpo over {n} seeds: KL per held-out answer token after {runs.PROBES[1]} steps "
          f"{spread(figures['kl_40'], digits=3)}, after {runs.PROBES[-1]} {spread(figures['kl_end'], digits=3)}")
    print(f"train_dpo over {n} seeds: last 10 steps' rewards, chosen {spread(figures['chosen'])}; rejected "
          f"{spread(figures['rejected'])}")
    print(f"train_dpo over {n} seeds: held-out exact answers, reference "
          f"{spread(figures['reference exact'], '%', 100, 0)}; policy {spread(figures['policy exact'], '%', 100, 0)}; "
          f"{spread(figures['seconds'], ' s', digits=1)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=12, help="how many seeds (0, 1, ...) each run is swept over")
    parser.add_argument("--parts", nargs="*", choices=("base", "finetune", "dpo"), default=["base", "finetune", "dpo"])
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    if "base" in args.parts:
        bench_base()
    if "finetune" in args.parts:
        bench_finetune(seeds)
    if "dpo" in args.parts:
        bench_dpo(seeds)


if __name__ == "__main__":
    main()
