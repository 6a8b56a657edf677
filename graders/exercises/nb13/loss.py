"""Notebook 13, exercise 2: `sft_loss(logits, labels)`, the mean next-token loss over the labelled
tokens of a padded batch, judged against F.cross_entropy(..., ignore_index=-100) on the shifted
logits and labels. The judge names a listed mistake by recomputing it; otherwise it reads how the
learner's losses relate to the reference (one factor) and asks the learner's function about one
label at a time: which position's logits it scores that label with."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises.nb13 import reference as ref
from graders.exercises.nb12.readers import real_number
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.judging.tolerance import close
from graders.integrity.library_kernels import LOSS_KERNELS, TORCH_REFERENCES

NOTEBOOK = "13_post_training"
D_VOCAB = 40
FORBIDDEN = Forbidden(
    "the masked loss", targets=[(F, "cross_entropy"), (F, "nll_loss"), (nn.CrossEntropyLoss, "forward"),
                                (nn.NLLLoss, "forward")],
    source_words=["F.cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss"],
    instead="from log_softmax, gather and the mask labels != -100", notebook_wide=False,
    library_code=("torch.nn.functional:cross_entropy", "torch.nn.functional:nll_loss",
                  "torch.nn.modules.loss:CrossEntropyLoss", "torch.nn.modules.loss:NLLLoss", *TORCH_REFERENCES),
    kernels=LOSS_KERNELS)
SLIPS = {
    "all_positions": "the mean is over every position, the masked ones included: the sum of the labelled "
                     "tokens' losses is divided by all positions, so the loss shrinks as padding and prompts "
                     "grow. Divide by the number of labels that are not -100",
    "per_sequence": "a mean per sequence, then a mean over the batch: a token of a short answer then weighs "
                    "more than a token of a long one, and the loss is no longer the mean over the batch's "
                    "response tokens (F.cross_entropy's). Divide the sum over the whole batch by its count of "
                    "labelled tokens",
    "unshifted": "the labels are not shifted: position i's logits predict the token after it, labels[i + 1], "
                 "so the logits of positions 0 .. n-2 meet the labels of positions 1 .. n-1",
    "over_positions": "the log-softmax is taken over the positions (dim 1), not over the vocabulary: each "
                      "position's logits are a distribution over the next token, so normalise along the last "
                      "axis, d_vocab",
    "mask_before_shift": "the mask is made from the labels before the shift and not shifted with them: the flag of "
                         "position i then decides about label i + 1, so the first response token is dropped and a "
                         "padding position counted. Shift the labels first, then make the mask from the shifted ones",
}


def loss_inputs(case: Case) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits [batch, posn, d_vocab], labels [batch, posn]) pairs: each sequence is a prompt
    (labels -100), a response (labels = token ids) and padding (-100), all of different lengths,
    so that every way of averaging gives another number."""
    found = []
    for k in range(3):
        generator = torch.Generator().manual_seed(500 * case.seed + k)
        logits = torch.randn(case.batch, case.seq, D_VOCAB, generator=generator) * 2
        labels = torch.randint(0, D_VOCAB, (case.batch, case.seq), generator=generator)
        for b in range(case.batch):
            prompt = 2 + (b + k) % 3
            response = max(2, case.seq - prompt - 2 * b - k)
            labels[b, :prompt] = -100
            labels[b, prompt + response:] = -100
        found.append((logits, labels))
    return found


def produce(sft_loss, case: Case, inputs: dict) -> dict:
    if not callable(sft_loss):
        raise CheckFailed(f"sft_loss: expected your function, got {sft_loss!r}.")
    outputs = {}
    for k, (logits, labels) in enumerate(loss_inputs(case)):
        loss = run_learner("sft_loss", sft_loss, logits, labels, forbidden=FORBIDDEN)
        number = real_number(loss)
        if number is None or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise CheckFailed(f"sft_loss returned {shape} on logits {list(logits.shape)}; return the loss as a "
                              "scalar tensor (the mean over every labelled token of the batch).")
        outputs[f"loss_{k}"] = torch.tensor(number, dtype=torch.float64)
    return {**outputs, **_one_label_at_a_time(sft_loss, case)}


def _one_label_at_a_time(sft_loss, case: Case) -> dict:
    """The learner's loss of the first input's first sequence with one label kept at a time (NaN
    where none is kept): which logits score that label, for the judge."""
    logits, labels = loss_inputs(case)[0]
    found = torch.full((case.seq,), float("nan"), dtype=torch.float64)
    try:
        for p in (labels[0] != -100).nonzero()[:, 0].tolist():
            one = torch.full_like(labels[:1], -100)
            one[0, p] = labels[0, p]
            number = real_number(run_learner("sft_loss", sft_loss, logits[:1], one, forbidden=FORBIDDEN))
            if number is None:
                return {}
            found[p] = number
    except CheckFailed:
        return {}
    return {"one_label": found}


def expected_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), labels[:, 1:].flatten(), ignore_index=-100)


def judge(case: Case, outputs: dict) -> None:
    inputs = loss_inputs(case)
    expected = [expected_loss(logits, labels) for logits, labels in inputs]
    got = [outputs[f"loss_{k}"] for k in range(len(inputs))]
    if all(close(g, e) for g, e in zip(got, expected)):
        return
    k = next(k for k, (g, e) in enumerate(zip(got, expected)) if not close(g, e))
    head = (f"sft_loss on batch {k} (logits {list(inputs[k][0].shape)}, prompts and padding labelled -100) "
            f"returned {float(got[k]):.6g}; F.cross_entropy(logits[:, :-1], labels[:, 1:], ignore_index=-100) "
            f"gives {float(expected[k]):.6g}.")
    for slip, description in SLIPS.items():
        if all(close(g, ref.sft_loss(logits.double(), labels, slip)) for g, (logits, labels) in zip(got, inputs)):
            raise CheckFailed(f"{head} Likely mistake: {description}.", mistake=slip)
    factors = [float(g) / float(e) for g, e in zip(got, expected)]
    if all(math.isfinite(f) for f in factors) and max(abs(f + 1) for f in factors) < 1e-4:
        raise CheckFailed(f"{head} Likely mistake: the sign: your loss is minus the reference on every batch, the "
                          "mean log-probability of the labels. The loss is the negative log-likelihood, -log p of each "
                          "label: minimising the mean of log p would make the answers less likely.",
                          mistake="sign")
    if all(math.isfinite(f) for f in factors) and max(factors) - min(factors) < 1e-4 * abs(factors[0]):
        raise CheckFailed(f"{head} Likely mistake: your loss is {factors[0]:.4g} times the reference on every batch: "
                          "each token's loss is right and the mean is scaled (a sum divided by another count, or a "
                          "factor).", mistake="scaled")
    raise CheckFailed(f"{head}{_which_logits(outputs, case)}\n  Hint: log-probabilities from log_softmax of the "
                      "logits, the label's picked with gather (at a masked position any index will do, the mask "
                      "then zeroes it), summed over the labelled positions and divided by their count.")


def _which_logits(outputs: dict, case: Case) -> str:
    """Which position's logits the learner scores a lone label with: the one before it (right),
    its own (unshifted), or neither (the per-token loss itself is wrong)."""
    if "one_label" not in outputs:
        return ""
    logits, labels = loss_inputs(case)[0]
    log_probs = logits[0].double().log_softmax(-1)
    for p in (labels[0] != -100).nonzero()[:, 0].tolist():
        got = outputs["one_label"][p]
        if p > 0 and close(got, -log_probs[p - 1, labels[0, p]]):
            continue
        if close(got, -log_probs[p, labels[0, p]]):
            return (f"\n  Where it starts: with only the label at position {p} kept, your loss is "
                    f"{float(got):.6g}, the loss of that label under position {p}'s own logits: the label is not "
                    f"shifted (position {p - 1}'s logits predict it).")
        return (f"\n  Where it starts: with only the label at position {p} kept, your loss is {float(got):.6g}, "
                f"where -log_softmax(logits[{p - 1}])[label] is {float(-log_probs[p - 1, labels[0, p]]):.6g}: the "
                "loss of a single token is already wrong.")
    return ("\n  Where it starts: with one label kept at a time, every loss is right: the tokens' losses are right, "
            "and the mistake is in how they are combined over the batch (the mask, the sum, the count).")


exercise = Exercise(NOTEBOOK, "sft_loss", produce, judge, forbidden=(FORBIDDEN,),
                    defaults={"text": None, "batch": 3, "seq": 12})
check_sft_loss = exercise.checker(
    "Grade `sft_loss(logits, labels)` against F.cross_entropy over the shifted, masked labels of padded batches.")
