"""Benchmark of notebook 07's training runs, with the course's reference solution of `train`.

Reversal task: steps and seconds until the held-out loss first reaches floor + 0.05
(floor = 7/15 ln 100 = 2.149), and the grader's held-out loss after its budget, per seed.
Tiny Shakespeare (the compact vocabulary, graders.reference.vocab): per seed, one line

    shakespeare seed S: val loss L after T s on 1 thread; train-split unigram entropy H

followed by the tokens/s of the training loop, the bar (H - BELOW_UNIGRAM) and its headroom, the
loss on the same windows shuffled (the grader's context check), and the loss after the visible
short run (nb07.SMOKE, against its bar). T is the wall time of `train` alone.

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
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graders.exercises import nb07  # noqa: E402
from graders.exercises.common.small_models import seeded_model  # noqa: E402
from graders.exercises.nb07 import tasks  # noqa: E402
from graders.exercises.nb07.practice import role  # noqa: E402
from graders.exercises.nb07.shakespeare import _shuffled  # noqa: E402


def lm_cross_entropy_loss(logits, tokens):
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    return -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1).mean()


@torch.no_grad()
def evaluate(model, tokens, batch_size=256):
    total = 0.0
    for chunk in tokens.split(batch_size):
        total += lm_cross_entropy_loss(model(chunk), chunk).item() * len(chunk)
    return total / len(tokens)


def train(model, make_batch, recipe, eval_tokens, eval_every=50, on_eval=None):
    """07's solution loop: AdamW on the course's groups, warmup + cosine, clipping."""
    decay = [p for name, p in model.named_parameters() if role(name) == "matrix"]
    other = [p for name, p in model.named_parameters() if role(name) != "matrix"]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                   {"params": other, "weight_decay": 0.0}], lr=recipe.max_lr)
    model.train()
    train_losses, eval_losses = [], []
    for step in range(recipe.n_steps):
        tokens = make_batch()
        loss = lm_cross_entropy_loss(model(tokens), tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr(step)
        optimizer.step()
        optimizer.zero_grad()
        train_losses.append(loss.item())
        if (step + 1) % eval_every == 0 or step + 1 == recipe.n_steps:
            eval_losses.append((step + 1, evaluate(model, eval_tokens)))
            model.train()
            if on_eval:
                on_eval(*eval_losses[-1])
    return train_losses, eval_losses


def bench_reversal(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    eval_tokens = nb07.reference_reversal(200, torch.Generator().manual_seed(40_000 + seed))
    model = seeded_model(nb07.reversal_config(), seed)
    start, reached = time.perf_counter(), []

    def on_eval(step, loss):
        if not reached and loss <= nb07.FLOOR + 0.05:
            reached.append((step, time.perf_counter() - start))

    train(model, lambda: nb07.reference_reversal(nb07.REVERSAL_BATCH, generator), nb07.REVERSAL,
          eval_tokens, eval_every=5, on_eval=on_eval)
    total = time.perf_counter() - start
    tokens = nb07.reference_reversal(nb07.N_TEST_SEQUENCES, torch.Generator().manual_seed(30_000 + seed))
    with torch.no_grad():
        losses, accuracy = nb07.per_position(model.eval()(tokens), tokens)
    when = f"step {reached[0][0]} after {reached[0][1]:.1f}s" if reached else "never"
    print(f"reversal seed {seed}: floor + 0.05 reached at {when}; {nb07.REVERSAL.n_steps} steps in "
          f"{total:.1f}s; grader's held-out loss {losses.mean():.4f} (floor {nb07.FLOOR:.4f}, "
          f"diff {losses.mean() - nb07.FLOOR:+.4f}); accuracy targets 1-7 "
          f"{100 * accuracy[:7].mean():.1f}%, min over targets 8-15 {100 * accuracy[7:].min():.1f}%")


def _val_loss(model, val_ids, n_windows: int, seed: int, shuffled: bool = False) -> float:
    """The grader's validation loss: `n_windows` random windows drawn from seed 50_000 + seed
    (with `shuffled`, each window's tokens in the grader's random order, seed 70_000 + seed)."""
    windows = nb07.random_windows(val_ids, n_windows, torch.Generator().manual_seed(50_000 + seed))
    if shuffled:
        windows = _shuffled(windows, torch.Generator().manual_seed(70_000 + seed))
    with torch.no_grad():
        return evaluate(model.eval(), windows, batch_size=8)


def _shakespeare_run(seed: int, recipe):
    """The grader's run of `recipe`: (trained model, wall seconds, CPU seconds of `train`)."""
    train_ids, val_ids = nb07.compact_shakespeare_tokens()
    generator = torch.Generator().manual_seed(seed)
    eval_tokens = nb07.random_windows(val_ids, 8, torch.Generator().manual_seed(60_000 + seed))
    model = seeded_model(nb07.shakespeare_config(), seed)
    start, cpu = time.perf_counter(), time.process_time()
    train(model, lambda: nb07.random_windows(train_ids, nb07.SHAKESPEARE_BATCH, generator), recipe,
          eval_tokens, eval_every=recipe.n_steps)
    return model, time.perf_counter() - start, time.process_time() - cpu


def bench_shakespeare(seed: int) -> None:
    """The graded run and the visible short run (its own recipe, nb07.SMOKE) of one seed."""
    _, val_ids = nb07.compact_shakespeare_tokens()
    recipe = nb07.SHAKESPEARE
    model, seconds, cpu = _shakespeare_run(seed, recipe)
    n_tokens = recipe.n_steps * nb07.SHAKESPEARE_BATCH * nb07.SHAKESPEARE_WINDOW
    val = _val_loss(model, val_ids, nb07.N_VAL_WINDOWS, seed)
    shuffled = _val_loss(model, val_ids, nb07.N_VAL_WINDOWS, seed, shuffled=True)
    smoke = _val_loss(_shakespeare_run(seed, nb07.SMOKE)[0], val_ids, nb07.N_SMOKE_VAL_WINDOWS, seed)
    baseline = nb07.unigram_entropy()
    bar = baseline - nb07.BELOW_UNIGRAM
    smoke_bar = math.log(nb07.shakespeare_config().d_vocab) - nb07.SMOKE_BELOW_UNIFORM
    print(f"shakespeare seed {seed}: val loss {val:.4f} after {seconds:.1f} s on 1 thread; "
          f"train-split unigram entropy {baseline:.4f}; {n_tokens / seconds:,.0f} tokens/s "
          f"({recipe.n_steps} steps of {nb07.SHAKESPEARE_BATCH}x{nb07.SHAKESPEARE_WINDOW}, "
          f"CPU time {cpu:.1f} s); graded: at most {bar:.4f}, headroom {bar - val:.4f}; shuffled "
          f"windows {shuffled:.4f} ({shuffled - val:+.4f}); the visible run ({nb07.SMOKE.n_steps} "
          f"steps) {smoke:.4f} (at most {smoke_bar:.4f}, headroom {smoke_bar - smoke:.4f})",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--shakespeare-seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--skip-reversal", action="store_true")
    parser.add_argument("--skip-shakespeare", action="store_true")
    parser.add_argument("--reversal-max-lr", type=float, help="override the graded max_lr (to measure)")
    parser.add_argument("--shakespeare-max-lr", type=float, help="override the graded max_lr (to measure)")
    parser.add_argument("--shakespeare-steps", type=int, help="override the graded steps (to measure)")
    parser.add_argument("--shakespeare-d-model", type=int, help="override the graded d_model (to measure)")
    args = parser.parse_args()
    nb07.REVERSAL = replace(nb07.REVERSAL, max_lr=args.reversal_max_lr or nb07.REVERSAL.max_lr)
    nb07.SHAKESPEARE = replace(nb07.SHAKESPEARE, max_lr=args.shakespeare_max_lr or nb07.SHAKESPEARE.max_lr,
                               n_steps=args.shakespeare_steps or nb07.SHAKESPEARE.n_steps)
    if args.shakespeare_d_model:
        tasks.SHAKESPEARE_D_MODEL = args.shakespeare_d_model     # read by shakespeare_config()
    torch.set_num_threads(1)
    print(f"one thread; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; reversal: "
          f"{nb07.REVERSAL}; shakespeare: {nb07.SHAKESPEARE}, d_model {tasks.SHAKESPEARE_D_MODEL}; "
          f"visible run: {nb07.SMOKE}")
    for seed in [] if args.skip_reversal else args.seeds:
        bench_reversal(seed)
    if not args.skip_shakespeare:
        for seed in args.shakespeare_seeds:
            bench_shakespeare(seed)


if __name__ == "__main__":
    main()
