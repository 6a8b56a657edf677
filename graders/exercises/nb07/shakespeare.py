"""Notebook 07, exercise 5: the learner's `train` on tiny Shakespeare, the graded run and its
short visible version, judged by the grader's own validation loss."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from graders.exercises.nb07.runs import (TRAIN_PARTS, CountingBatches, TrainingRun, judge_loop, one_thread,
                                         run_training, stuck_diagnosis)
from graders.exercises.nb07.tasks import (BELOW_UNIGRAM, MIN_CONTEXT_GAIN, N_SMOKE_VAL_WINDOWS, N_VAL_WINDOWS,
                                          SHAKESPEARE, SHAKESPEARE_BATCH, SHAKESPEARE_WINDOW, SMOKE,
                                          SMOKE_BELOW_UNIFORM, Recipe, compact_shakespeare_tokens, random_windows,
                                          shakespeare_config, unigram_entropy)
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, check_shape, mistake_key
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner


def _token_losses(model, windows: torch.Tensor, d_vocab: int) -> torch.Tensor:
    """[window, position] next-token losses of the trained model, 8 windows at a time."""
    losses = []
    with one_thread():
        for chunk in windows.split(8):
            logits = run_learner("the trained model", model, chunk)
            check_shape("the trained model's logits", logits, (*chunk.shape, d_vocab),
                        ("sequence", "position", "d_vocab"))
            losses.append(F.cross_entropy(logits[:, :-1].transpose(1, 2).double(), chunk[:, 1:],
                                          reduction="none"))
    return torch.cat(losses)


def _shuffled(windows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each window's tokens in a random order: the same tokens, their context destroyed."""
    order = torch.stack([torch.randperm(windows.shape[1], generator=generator)
                         for _ in range(len(windows))])
    return windows.gather(1, order)


def _shakespeare_producer(recipe: Recipe, n_val_windows: int):
    """`produce` for a run of `recipe`, validated on `n_val_windows` random windows (and
    on the same windows shuffled, which tells a model using context from one that does not)."""
    def produce(run: TrainingRun, case: Case, inputs: dict) -> dict:
        train_ids, val_ids = compact_shakespeare_tokens()
        cfg = shakespeare_config()
        generator = torch.Generator().manual_seed(case.seed)
        batches = CountingBatches(lambda: random_windows(train_ids, SHAKESPEARE_BATCH, generator))
        eval_tokens = random_windows(val_ids, 8, torch.Generator().manual_seed(60_000 + case.seed))
        model, _, probe = run_training(run, cfg, case.seed, batches, recipe, eval_tokens,
                                       recipe.n_steps)
        model.eval()
        windows = random_windows(val_ids, n_val_windows,
                                 torch.Generator().manual_seed(50_000 + case.seed))
        shuffled = _shuffled(windows, torch.Generator().manual_seed(70_000 + case.seed))
        return {"val_token_losses": _token_losses(model, windows, cfg.d_vocab),
                "shuffled_token_losses": _token_losses(model, shuffled, cfg.d_vocab),
                "batches_drawn": torch.tensor(batches.calls), **probe}
    return produce


def _judge_run(outputs: dict, recipe: Recipe, n_val_windows: int, required: float, bar: str,
               context_gain: float | None = None) -> None:
    """Fail unless `train` drew one batch a step and the validation loss is at most `required`
    (and, if `context_gain` is given, at least that much lower than on the shuffled windows)."""
    n_steps, drawn = recipe.n_steps, int(outputs["batches_drawn"])
    if drawn != n_steps:
        raise CheckFailed(f"train drew {drawn} batches for n_steps={n_steps}; it should draw "
                          "exactly one per step (evaluation uses eval_tokens, never make_batch)."
                          + (" Likely mistake: evaluation uses training batches (make_batch())."
                             if drawn > n_steps else ""),
                          mistake="eval_on_training_batches" if drawn > n_steps else None)
    cfg = shakespeare_config()
    judge_loop(outputs, recipe, cfg)
    token_losses = outputs["val_token_losses"]
    check_shape("validation losses", token_losses, (n_val_windows, SHAKESPEARE_WINDOW - 1),
                ("window", "position"))
    val = token_losses.mean().item()
    d_vocab = cfg.d_vocab
    uniform = math.log(d_vocab)
    message = (f"After {n_steps} steps of {SHAKESPEARE_BATCH}x{SHAKESPEARE_WINDOW} tokens the "
               f"validation loss is {val:.3f} nats; uniform guessing over the {d_vocab:,} ids "
               f"scores {uniform:.3f}, the train split's unigram entropy (the best a model that "
               f"ignores context can do on the training text) is {unigram_entropy():.3f}, and the "
               f"grader requires at most {required:.3f} ({bar}).")
    shuffled = outputs["shuffled_token_losses"].mean().item()
    uses_context = context_gain is None or shuffled - val >= context_gain
    if math.isfinite(val) and val <= required and uses_context:
        return
    if not math.isfinite(val) or val > uniform + 1:
        raise CheckFailed("train (tiny Shakespeare): worse than guessing uniformly over the "
                          "vocabulary. Likely mistake: optimizer.zero_grad() is missing, so "
                          f"gradients pile up across steps.\n  {message}", mistake="no_zero_grad")
    if val > uniform - 0.5:
        diagnosis = stuck_diagnosis(outputs)
        raise CheckFailed(f"train (tiny Shakespeare): the model has hardly learned. "
                          f"{diagnosis}\n  {message}", mistake=mistake_key(diagnosis))
    if not uses_context:
        raise CheckFailed(
            f"train (tiny Shakespeare): the model learned token frequencies only; it does not use "
            f"the context. On the same windows with their tokens shuffled (context destroyed) "
            f"its loss is {shuffled:.3f}, {shuffled - val:+.3f} nats from the real windows (a "
            f"model that reads the previous tokens loses at least {MIN_CONTEXT_GAIN}); the train "
            f"split's frequencies alone score about the unigram entropy. Check what the model "
            f"is given: the tokens of each batch, in order, through model(tokens).\n  {message}",
            mistake="context_ignored")
    diagnosis = stuck_diagnosis(outputs)
    raise CheckFailed(f"train (tiny Shakespeare): it learned, but too slowly. "
                      f"{diagnosis}\n  {message}\n  Other causes: "
                      "the loss is not the mean next-token loss; too few updates.", mistake=mistake_key(diagnosis))


def judge_shakespeare(case: Case, outputs: dict) -> None:
    """The graded run: after SHAKESPEARE.n_steps steps the validation loss must be below the
    train split's unigram entropy H = 6.315 (the best loss without context) by BELOW_UNIGRAM.

    The model is 2 layers, d_model 128, over the compact vocabulary (11,266 ids instead of
    50,257: see graders.reference.vocab), batches of 32 windows of 64 tokens, with 07's habits
    (tasks.SHAKESPEARE: 80 steps, max_lr 1e-2 after 10 warmup steps, cosine to 1e-3, weight
    decay 0.1 on the matrices, clipping at 0.5). Measured with the solution on one thread, 128
    validation windows (benchmarks/bench_training.py): seeds 0 / 1 / 2 / 3: 6.1582 / 6.0427 /
    5.9437 / 6.0459, i.e. H - 0.157 / 0.272 / 0.371 / 0.269; on the same windows shuffled
    7.2782 / 7.1483 / 7.2642 / 7.1984 (a context gain of 1.11-1.32 nats against
    MIN_CONTEXT_GAIN = 0.1). The worst seed (0) is 0.157 below H, so the bar H - 0.05 keeps
    0.107 of headroom for it (two thirds of its gap).
    One run on one thread: seed 0 alone on a quiet machine (load 0.2) took 83.9 s wall, 83.7 s
    CPU, 1,954 tokens/s, inside the course's goal of 2 minutes; the four runs above, two at a
    time beside other work (load 2.4-6), took 95.5-101.7 s of CPU. The schedule is what made
    it: the same model at a constant lr of 5e-3 without clipping needed 125 steps (150.9 s of
    CPU) to reach H - 0.117 on its worst seed (3), where 80 scheduled steps reach H - 0.269 on
    that seed. 70 steps were measured too short
    (seed 0: H - 0.065).
    Choosing the size (constant lr, seed 0, validation loss at steps 25/50/75/100): d_model 256,
    batch 16, lr 3e-3: 6.747/6.569/6.316/6.212 but ~2.4x the FLOPs per token of d_model 128;
    d_model 128, batch 16, lr 5e-3: 6.756/6.628/6.594/6.517; d_model 128, batch 32, lr 5e-3:
    6.630/6.572/6.450/6.211, the fewest FLOPs to pass H of these.
    Frequencies alone: the train split's frequencies score 6.50-6.65 on the graded windows of
    seeds 0-5 when unknown gets almost no probability (as a model trained on the train split
    learns), but 6.20-6.31 for seeds 0-3 if granted the validation's 2.1% share of unknown
    tokens, which is below the bar for seed 2. So the bar alone does not fail every model that
    ignores context; the context check does: such a model's loss hardly changes when each
    window's tokens are shuffled, while the solution's rises by more than a nat (above).
    tests/catalog/test_catalog_07_shakespeare.py trains a model blind to its input with the correct `train`.
    """
    _judge_run(outputs, SHAKESPEARE, N_VAL_WINDOWS, unigram_entropy() - BELOW_UNIGRAM,
               f"the unigram entropy - {BELOW_UNIGRAM}", context_gain=MIN_CONTEXT_GAIN)


def judge_shakespeare_smoke(case: Case, outputs: dict) -> None:
    """The visible check: a run of tasks.SMOKE (5 steps, warmup 2, then the cosine) must reach
    ln 11266 - SMOKE_BELOW_UNIFORM = 7.330 (uniform guessing over the compact vocabulary scores
    ln 11266 = 9.330), with every optimizer step watched as in the graded runs.

    It costs seconds where the graded run costs a minute and a half of CPU time, so that run can
    be the hidden test (with another seed). Measured with the solution (32 windows): 6.9408 /
    6.9747 / 6.7981 / 7.0202 for seeds 0-3, >= 0.31 nats of headroom; a loop that never steps,
    or ignores max_lr, stays at ~9.3.
    """
    _judge_run(outputs, SMOKE, N_SMOKE_VAL_WINDOWS,
               math.log(shakespeare_config().d_vocab) - SMOKE_BELOW_UNIFORM,
               f"{SMOKE_BELOW_UNIFORM} below uniform guessing, for this short visible run; the "
               f"graded run trains {SHAKESPEARE.n_steps} steps and requires the unigram entropy "
               f"- {BELOW_UNIGRAM}")


shakespeare_exercise = Exercise("07_training", "train (tiny Shakespeare)",
                                _shakespeare_producer(SHAKESPEARE, N_VAL_WINDOWS),
                                judge_shakespeare, defaults={"text": None},
                                guard=Guard(supplies=(*TRAIN_PARTS.values(), CountingBatches)))
smoke_exercise = Exercise("07_training", "train (tiny Shakespeare, short run)",
                          _shakespeare_producer(SMOKE, N_SMOKE_VAL_WINDOWS),
                          judge_shakespeare_smoke, defaults={"text": None},
                          guard=Guard(supplies=(*TRAIN_PARTS.values(), CountingBatches)))
check_shakespeare_training = shakespeare_exercise.checker(
    "The graded run: train the 2-layer d_model-128 compact-vocabulary model on tiny Shakespeare "
    "with `train`.",
    learner=TrainingRun)
check_shakespeare_smoke = smoke_exercise.checker(
    "A short run of the same training, cheap enough to be the visible check.",
    learner=TrainingRun)
