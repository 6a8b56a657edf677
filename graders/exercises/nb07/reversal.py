"""Notebook 07, exercises 2 and 3 on the reversal task's data: `make_reversal_batch` (the data
generator) and `evaluate` (the held-out loss)."""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import torch

from graders.exercises.common.small_models import seeded_model
from graders.exercises.nb07.tasks import (D_VOCAB, HALF, SEQ_LEN, reference_reversal, reversal_config)
from graders.judging.cases import Case
from graders.exercises.common.diagnosis import judge_randomness
from graders.judging.compare import (CheckFailed, Mistake, check_shape,
                                     compare, keyed_like, mistake_key, require_tensor)
from graders.exercises.common.next_token import loss_mistakes, reference_loss
from graders.judging.tolerance import close
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner
from graders.marks import course_answer


# --- Exercise 2: the reversal data generator ---------------------------------------------------

def produce_generator(fn, case: Case, inputs: dict) -> dict:
    n = max(case.batch, 512)
    what = "make_reversal_batch"
    global_state = torch.get_rng_state()
    outputs = {
        "a": run_learner(what, fn, n, torch.Generator().manual_seed(case.seed)),
        "a_again": run_learner(what, fn, n, torch.Generator().manual_seed(case.seed)),
        "b": run_learner(what, fn, n, torch.Generator().manual_seed(case.seed + 1)),
        "one": run_learner(what, fn, 1, torch.Generator().manual_seed(case.seed + 2)),
    }
    outputs["global_rng_used"] = torch.tensor(not torch.equal(global_state, torch.get_rng_state()))
    torch.set_rng_state(global_state)
    for key in ("a", "a_again", "b", "one"):
        require_tensor(f"make_reversal_batch({n if key != 'one' else 1}, generator)", outputs[key])
    return outputs


MIRROR_OFF_BY_ONE = Mistake("mirror_off_by_one", "the mirror is off by one position: token 8 + i must equal "
                            "token 7 - i (token 8 = token 7, ..., token 15 = token 0).")


def _off_by_one(seqs: torch.Tensor) -> str | None:
    """Name a mirror that is shifted by one position, if that is what `seqs` holds."""
    first, second = seqs[:, :HALF], seqs[:, HALF:]
    mirror = first.flip(-1)
    if torch.equal(second, first):
        return Mistake("copied_not_mirrored", "the second half is a copy of the first, not its mirror: reverse it "
                       "(flip).")
    for shift in (1, -1):
        if torch.equal(second.roll(shift, dims=-1)[:, 1:-1], mirror[:, 1:-1]):
            return MIRROR_OFF_BY_ONE
    if torch.equal(seqs[:, HALF - 1:].flip(-1)[:, :HALF], seqs[:, :HALF]) or \
            torch.equal(seqs[:, HALF + 1:], first[:, 1:].flip(-1)):
        return MIRROR_OFF_BY_ONE
    if len(seqs) > 1 and torch.equal(second, first.flip(0)):
        return Mistake("flipped_along_batch", "the halves are flipped along the wrong dimension: flip(0) reverses "
                       "the order of the sequences in the batch; reverse each sequence along its positions, "
                       "half.flip(-1) (or flip(1)).")
    if len(seqs) > 1 and torch.equal(second, first.flip(0).flip(-1)):
        return Mistake("flipped_along_both", "the halves are flipped along both dimensions (flip((0, 1)), or "
                       ".flip() of every dimension): reverse each sequence along its positions only, half.flip(-1).")
    if torch.equal(second, first.sort(-1).values) or torch.equal(second, first.sort(-1, descending=True).values):
        return Mistake("sorted_not_reversed", "the second half is the first one sorted, not reversed: reverse the "
                       "order of the positions, half.flip(-1), whatever the token values.")
    return None


def _shape_diagnosis(seqs: torch.Tensor, rows: int) -> str | None:
    """Name a wrong shape that a known mistake produces."""
    shape = tuple(seqs.shape)
    if shape == (2 * rows, HALF):
        return Mistake("joined_along_batch", "the halves are joined along the batch dimension (torch.cat(..., "
                       "dim=0)): join them along the positions, torch.cat([half, half.flip(-1)], dim=-1).")
    if shape == (rows, HALF):
        return Mistake("first_half_only", "only the first half is returned: append its mirror, "
                       "torch.cat([half, half.flip(-1)], dim=-1).")
    if shape == (HALF, 2 * rows) or shape == (SEQ_LEN, rows):
        return Mistake("transposed", "the result is transposed: return [batch_size, 16], one sequence per row.")
    return None


def judge_generator(case: Case, outputs: dict) -> None:
    n = max(case.batch, 512)
    dims = ("sequence", "position")
    for key, rows in (("a", n), ("one", 1)):
        seqs = outputs[key]
        where = f"make_reversal_batch({rows}, generator)"
        if tuple(seqs.shape) != (rows, SEQ_LEN) and _shape_diagnosis(seqs, rows):
            raise CheckFailed(f"{where}: shape {list(seqs.shape)}, expected [{rows}, {SEQ_LEN}]. "
                              f"Likely mistake: {_shape_diagnosis(seqs, rows)}",
                              mistake=mistake_key(_shape_diagnosis(seqs, rows)))
        check_shape(where, seqs, (rows, SEQ_LEN), dims)
        if seqs.dtype != torch.long:
            raise CheckFailed(f"{where}: dtype {seqs.dtype}; token ids must be torch.long (int64) "
                              "so that they can index the embedding.")
    seqs = outputs["a"]
    where = f"make_reversal_batch({n}, generator)"
    low, high = int(seqs.min()), int(seqs.max())
    if low < 0 or high >= D_VOCAB:
        raise CheckFailed(f"{where}: token ids range over [{low}, {high}]; they must lie in "
                          f"[0, {D_VOCAB - 1}] (torch.randint's upper bound is exclusive: "
                          f"randint(0, {D_VOCAB}, ...)).")
    if n > 1 and torch.equal(seqs, seqs[:1].expand(n, -1)):
        raise CheckFailed(f"{where}: every sequence is the same. Likely mistake: one random half is "
                          "drawn and repeated over the batch; draw [batch_size, 8] random tokens, "
                          "one half per sequence.", mistake="one_half_repeated")
    seen = torch.bincount(seqs[:, :HALF].flatten(), minlength=D_VOCAB)
    if (seen == 0).any():
        missing = (seen == 0).nonzero().flatten().tolist()
        raise CheckFailed(f"{where}: token ids {missing[:10]} never appear among {n * HALF} random "
                          f"tokens; every id in [0, {D_VOCAB - 1}] should (torch.randint's upper "
                          f"bound is exclusive: randint(0, {D_VOCAB}, ...)).")
    mirror = seqs[:, :HALF].flip(-1)
    if not torch.equal(seqs[:, HALF:], mirror):
        diagnosis = _off_by_one(seqs)
        wrong = (seqs[:, HALF:] != mirror).any(0).nonzero().flatten() + HALF
        raise CheckFailed(f"{where}: the second half is not the mirror of the first (wrong at "
                          f"positions {wrong.tolist()}). "
                          + (f"Likely mistake: {diagnosis}" if diagnosis else
                             "Token 8 + i must equal token 7 - i: torch.cat([half, half.flip(-1)], -1)."),
                          mistake=mistake_key(diagnosis))
    if len(torch.unique(seqs[:, :HALF], dim=0)) < 0.95 * n:
        raise CheckFailed(f"{where}: the first halves repeat across sequences; each sequence needs "
                          "its own random tokens.", mistake="halves_repeat")
    judge_randomness("make_reversal_batch", outputs, "sequences",
                     "torch.randint(..., generator=generator)")


generator_exercise = Exercise("07_training", "make_reversal_batch", produce_generator,
                              judge_generator, defaults={"text": None})
check_reversal_generator = generator_exercise.checker(
    "Grade `make_reversal_batch(batch_size, generator)`.")


# --- Exercise 3: evaluate -----------------------------------------------------------------------

def _as_loss_number(what: str, value) -> torch.Tensor:
    """A learner's loss value (float or 0-dim tensor) as a float64 0-dim tensor."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise CheckFailed(f"{what} returned a tensor of shape {list(value.shape)}; return one "
                              "number, the mean loss (a float, or a 0-dim tensor).")
        return value.detach().double().reshape(())
    if isinstance(value, (float, int)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64)
    raise CheckFailed(f"{what} returned {type(value).__name__}; return the mean loss as a float.")


def _evaluated_model(case: Case):
    """The model `evaluate` is checked on: the reversal model, its logits spread (init_range
    0.3) so that the usual wrong losses land far from the right one."""
    return seeded_model(dataclasses.replace(reversal_config(), init_range=0.3), case.seed)


def _model_with_dropout(case: Case):
    """The evaluated model with dropout (p = 0.5) on its embeddings, in training mode: its loss
    is the plain model's only in eval mode, where dropout passes activations through."""
    model = _evaluated_model(case)
    model.embed_dropout = torch.nn.Dropout(0.5)
    model.embed.register_forward_hook(lambda module, args, out: model.embed_dropout(out))
    return model


def _eval_sets(case: Case) -> list[torch.Tensor]:
    return [tokens.clone() for tokens in _cached_eval_sets(case)]


@lru_cache(maxsize=4)
def _cached_eval_sets(case: Case) -> tuple[torch.Tensor, ...]:
    """Two held-out sets: 300 sequences (more than one batch of 256), hardest first for the
    evaluated model, so that chunk means differ and an unweighted mean of them shows; then 7."""
    tokens = reference_reversal(300, torch.Generator().manual_seed(10_000 + case.seed))
    with torch.no_grad():
        logits = _evaluated_model(case)(tokens)[:, :-1]
        per_sequence = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:],
                                                         reduction="none").mean(-1)
    return (tokens[per_sequence.argsort(descending=True)],
            reference_reversal(7, torch.Generator().manual_seed(20_000 + case.seed)))


@course_answer("evaluate")
@torch.no_grad()
def reference_evaluate(model, tokens: torch.Tensor, batch_size: int = 256) -> float:
    """07's `evaluate` as the course writes it: the mean next-token loss in eval mode, the
    model's mode restored."""
    was_training = model.training
    model.eval()
    total = sum(float(reference_loss(model(chunk), chunk)) * len(chunk) for chunk in tokens.split(batch_size))
    model.train(was_training)
    return total / len(tokens)


def produce_evaluate(fn, case: Case, inputs: dict) -> dict:
    model = _evaluated_model(case)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    outputs = {}
    for i, tokens in enumerate(_eval_sets(case)):
        copy = tokens.clone()
        value = run_learner("evaluate", fn, model, tokens)
        outputs[f"loss_{i}"] = _as_loss_number(f"evaluate(model, tokens of shape {list(tokens.shape)})",
                                               value)
        outputs[f"modified_{i}"] = torch.tensor(not torch.equal(copy, tokens))
    outputs["weights_changed"] = torch.tensor(any(not torch.equal(before[k], v)
                                                  for k, v in model.state_dict().items()))
    dropout_model, tokens = _model_with_dropout(case), _eval_sets(case)[1]
    with torch.random.fork_rng():
        torch.manual_seed(case.seed)
        outputs["dropout_losses"] = torch.stack([
            _as_loss_number("evaluate", run_learner("evaluate", fn, dropout_model, tokens))
            for _ in range(2)])
    outputs["training_after"] = torch.tensor(dropout_model.training)
    return outputs


def judge_evaluate(case: Case, outputs: dict) -> None:
    if bool(outputs["weights_changed"]):
        raise CheckFailed("evaluate changed the model's weights. Evaluation only measures: no "
                          "optimizer step, no backward (wrap it in torch.no_grad()).")
    model = _evaluated_model(case)
    if torch.equal(outputs["loss_0"], outputs["loss_1"]):
        raise CheckFailed("evaluate returned the same loss, "
                          f"{outputs['loss_0'].item():.6g}, for two different sets of held-out "
                          "sequences: it ignores its `tokens` argument. Likely mistake: it "
                          "evaluates other data (a training batch?) instead of exactly the tokens "
                          "it is given.", mistake=OTHER_DATA)
    with torch.no_grad():
        for i, tokens in enumerate(_eval_sets(case)):
            if bool(outputs[f"modified_{i}"]):
                raise CheckFailed("evaluate modified the tokens it was given in place.")
            logits = model(tokens)
            expected = reference_loss(logits, tokens)
            if close(outputs[f"loss_{i}"].reshape(1), expected.reshape(1)):
                continue
            compare(f"evaluate(model, tokens) on {len(tokens)} held-out sequences",
                    outputs[f"loss_{i}"].reshape(1), expected.reshape(1), ("loss",),
                    mistakes={k: v.reshape(1) for k, v in evaluate_mistakes(model, tokens, logits,
                                                                            _eval_sets(case)[1 - i]).items()},
                    hint="the mean next-token loss of `model` on exactly the `tokens` it is given, in "
                         "evaluation mode (its mode put back after) and without gradients (look up "
                         "torch.no_grad and model.eval).")
        tokens = _eval_sets(case)[1]          # the set produce_evaluate gave the dropout model
        _judge_modes(outputs, reference_loss(model(tokens), tokens))


def _judge_modes(outputs: dict, expected: torch.Tensor) -> None:
    """evaluate on a model with dropout, in training mode: dropout off while measuring, and the
    training mode given back afterwards."""
    losses = outputs["dropout_losses"]
    if not close(losses, expected.reshape(1).expand(2)):
        raise CheckFailed(
            f"evaluate measured a model with dropout while the dropout was on: two calls gave "
            f"{losses[0].item():.4f} and {losses[1].item():.4f}, where the model itself (dropout "
            f"off) scores {expected.item():.4f}. Likely mistake: the model stays in training mode; "
            "call model.eval() before measuring (dropout then passes every activation through).",
            mistake="no_eval_mode")
    if not bool(outputs["training_after"]):
        raise CheckFailed(
            "evaluate left the model in eval mode: the training steps after the first evaluation "
            "would run without dropout. Give the mode back before returning: was_training = "
            "model.training at the start, model.train(was_training) at the end.", mistake="mode_not_restored")


CHUNK_SIZES = (256, 128, 64, 32, 100, 200, 50, 16)   # batch sizes learners evaluate in
OTHER_DATA = "other_data_evaluated"     # its key, whichever check names it


def evaluate_mistakes(model, tokens: torch.Tensor, logits: torch.Tensor, other: torch.Tensor) -> dict:
    """What the usual wrong `evaluate`s return on `tokens`, by description."""
    mistakes = {Mistake(OTHER_DATA, "the loss is computed on other sequences than the `tokens` passed in (a "
                        "training batch?): evaluate exactly the tokens it is given"):
                reference_loss(model(other), other),
                Mistake("first_batch_only", "only the first batch of the held-out tokens is evaluated"):
                reference_loss(model(tokens[:256]), tokens[:256])}
    for size in CHUNK_SIZES:
        chunks = tokens.split(size)
        if len(chunks) > 1 and len(chunks[-1]) != size:
            mistakes[Mistake("unweighted_chunk_means", f"the chunk means are averaged without weighting by "
                             f"chunk size (the last chunk of {len(chunks[-1])} sequences counts as much as a full "
                             f"one of {size}): sum each chunk's loss times its length, then divide by the number "
                             "of sequences")] = torch.stack([reference_loss(model(c), c) for c in chunks]).mean()
    for description, value in loss_mistakes(logits, tokens).items():
        mistakes[keyed_like(description, f"evaluate's loss: {description}")] = value
    return mistakes


evaluate_exercise = Exercise("07_training", "evaluate", produce_evaluate, judge_evaluate,
                             defaults={"text": None})
check_evaluate = evaluate_exercise.checker(
    "Grade `evaluate(model, tokens) -> float` on held-out reversal sequences.")
