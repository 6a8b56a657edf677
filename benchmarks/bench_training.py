"""Benchmark of notebook 07's training runs, with the course's reference solution of `train`.

Reversal task: steps and seconds until the held-out loss first reaches floor + 0.05
(floor = 7/15 ln 100 = 2.149), and the grader's held-out loss after its budget, per seed.
Tiny Shakespeare: tokens/s of the training loop, and the grader's validation loss after the graded
budget (against the bar: the train split's unigram entropy + ABOVE_UNIGRAM) and after the visible
short run's SMOKE_STEPS (against its bar), per seed.

    python benchmarks/bench_training.py [--seeds 0 1 2] [--shakespeare-seeds 0 1 2 3]
        [--skip-reversal] [--skip-shakespeare]

Runs on one thread, as the grader does. Timings depend on the machine and its load; the losses
do not (one thread, fixed seeds: bit-for-bit reproducible).
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graders.exercises import nb07  # noqa: E402
from graders.reference.components import DemoTransformer  # noqa: E402


def lm_cross_entropy_loss(logits, tokens):
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    return -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1).mean()


@torch.no_grad()
def evaluate(model, tokens, batch_size=256):
    total = 0.0
    for chunk in tokens.split(batch_size):
        total += lm_cross_entropy_loss(model(chunk), chunk).item() * len(chunk)
    return total / len(tokens)


def train(model, make_batch, n_steps, lr, eval_tokens, eval_every=50, weight_decay=0.01,
          progress=True, on_eval=None):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    train_losses, eval_losses = [], []
    for step in range(n_steps):
        tokens = make_batch()
        loss = lm_cross_entropy_loss(model(tokens), tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        train_losses.append(loss.item())
        if (step + 1) % eval_every == 0 or step + 1 == n_steps:
            eval_losses.append((step + 1, evaluate(model, eval_tokens)))
            if on_eval:
                on_eval(*eval_losses[-1])
    return train_losses, eval_losses


def bench_reversal(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    eval_tokens = nb07.reference_reversal(200, torch.Generator().manual_seed(40_000 + seed))
    torch.manual_seed(seed)
    model = DemoTransformer(nb07.reversal_config())
    start, reached = time.perf_counter(), []

    def on_eval(step, loss):
        if not reached and loss <= nb07.FLOOR + 0.05:
            reached.append((step, time.perf_counter() - start))

    train(model, lambda: nb07.reference_reversal(nb07.REVERSAL_BATCH, generator), nb07.REVERSAL_STEPS,
          nb07.REVERSAL_LR, eval_tokens, eval_every=5, on_eval=on_eval)
    total = time.perf_counter() - start
    tokens = nb07.reference_reversal(nb07.N_TEST_SEQUENCES, torch.Generator().manual_seed(30_000 + seed))
    with torch.no_grad():
        losses, accuracy = nb07.per_position(model.eval()(tokens), tokens)
    when = f"step {reached[0][0]} after {reached[0][1]:.1f}s" if reached else "never"
    print(f"reversal seed {seed}: floor + 0.05 reached at {when}; {nb07.REVERSAL_STEPS} steps in "
          f"{total:.1f}s; grader's held-out loss {losses.mean():.4f} (floor {nb07.FLOOR:.4f}, "
          f"diff {losses.mean() - nb07.FLOOR:+.4f}); accuracy targets 1-7 "
          f"{100 * accuracy[:7].mean():.1f}%, min over targets 8-15 {100 * accuracy[7:].min():.1f}%")


def _val_loss(model, val_ids, n_windows: int, seed: int) -> float:
    """The grader's validation loss: `n_windows` random windows drawn from seed 50_000 + seed."""
    windows = nb07.random_windows(val_ids, n_windows, torch.Generator().manual_seed(50_000 + seed))
    with torch.no_grad():
        return evaluate(model.eval(), windows, batch_size=8)


def bench_shakespeare(seed: int) -> None:
    """One graded run; its first SMOKE_STEPS steps are exactly the visible short run's."""
    train_ids, val_ids = nb07.shakespeare_tokens()
    generator = torch.Generator().manual_seed(seed)
    eval_tokens = nb07.random_windows(val_ids, 8, torch.Generator().manual_seed(60_000 + seed))
    torch.manual_seed(seed)
    model = DemoTransformer(nb07.shakespeare_config())
    smoke, paused = [], [0.0, 0.0]

    def make_batch():
        if make_batch.calls == nb07.SMOKE_STEPS:     # the model has taken SMOKE_STEPS steps
            wall, cpu = time.perf_counter(), time.process_time()
            smoke.append(_val_loss(model, val_ids, nb07.N_SMOKE_VAL_WINDOWS, seed))
            model.train()
            paused[0] += time.perf_counter() - wall
            paused[1] += time.process_time() - cpu
        make_batch.calls += 1
        return nb07.random_windows(train_ids, nb07.SHAKESPEARE_BATCH, generator)
    make_batch.calls = 0

    start, cpu = time.perf_counter(), time.process_time()
    train(model, make_batch, nb07.SHAKESPEARE_STEPS, nb07.SHAKESPEARE_LR, eval_tokens,
          eval_every=nb07.SHAKESPEARE_STEPS)
    seconds = time.perf_counter() - start - paused[0]
    cpu = time.process_time() - cpu - paused[1]
    n_tokens = nb07.SHAKESPEARE_STEPS * nb07.SHAKESPEARE_BATCH * nb07.SHAKESPEARE_WINDOW
    val = _val_loss(model, val_ids, nb07.N_VAL_WINDOWS, seed)
    baseline = nb07.unigram_entropy()
    bar = baseline + nb07.ABOVE_UNIGRAM
    smoke_bar = math.log(50257) - nb07.SMOKE_BELOW_UNIFORM
    print(f"shakespeare seed {seed}: {nb07.SHAKESPEARE_STEPS} steps of {nb07.SHAKESPEARE_BATCH}x"
          f"{nb07.SHAKESPEARE_WINDOW} tokens in {seconds:.1f}s ({n_tokens / seconds:,.0f} tokens/s, "
          f"{seconds / nb07.SHAKESPEARE_STEPS:.2f} s/step, CPU time {cpu:.1f}s); validation loss "
          f"{val:.4f} = unigram entropy {baseline:.4f} {val - baseline:+.4f} (graded: at most "
          f"{bar:.4f}, headroom {bar - val:.4f}); after the visible run's {nb07.SMOKE_STEPS} steps {smoke[0]:.4f} "
          f"(at most {smoke_bar:.4f}, headroom {smoke_bar - smoke[0]:.4f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--shakespeare-seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--skip-reversal", action="store_true")
    parser.add_argument("--skip-shakespeare", action="store_true")
    parser.add_argument("--reversal-lr", type=float, help="override the graded lr (to measure)")
    parser.add_argument("--reversal-steps", type=int, help="override the graded steps (to measure)")
    parser.add_argument("--shakespeare-lr", type=float, help="override the graded lr (to measure)")
    parser.add_argument("--shakespeare-steps", type=int, help="override the graded steps (to measure)")
    args = parser.parse_args()
    nb07.REVERSAL_LR = args.reversal_lr or nb07.REVERSAL_LR
    nb07.REVERSAL_STEPS = args.reversal_steps or nb07.REVERSAL_STEPS
    nb07.SHAKESPEARE_LR = args.shakespeare_lr or nb07.SHAKESPEARE_LR
    nb07.SHAKESPEARE_STEPS = args.shakespeare_steps or nb07.SHAKESPEARE_STEPS
    torch.set_num_threads(1)
    print(f"one thread; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; reversal: "
          f"{nb07.REVERSAL_STEPS} steps at lr {nb07.REVERSAL_LR}; shakespeare: "
          f"{nb07.SHAKESPEARE_STEPS} steps at lr {nb07.SHAKESPEARE_LR}")
    for seed in [] if args.skip_reversal else args.seeds:
        bench_reversal(seed)
    if not args.skip_shakespeare:
        for seed in args.shakespeare_seeds:
            bench_shakespeare(seed)


if __name__ == "__main__":
    main()
