"""Notebook 13, exercise 5: `sequence_logprob(logits, tokens, response_mask)` and
`dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)`, judged
against the DPO paper's equations computed independently in float64 (Rafailov et al. 2023, eq. 7):
the values, and for the loss its gradients (none may reach the reference). A mistake no catalog
lists is read from the output: a sequence's log-prob as a factor of the reference (a mean where a
sum is meant), the first sequence that differs; the loss as a factor (a sum over the pairs).

The judge's reference is the paper's equation. trl 1.16's DPO loss lives inside
DPOTrainer._compute_loss (a model's forward pass, an accelerator), not in a function of four log-prob
tensors, so it is a test-only cross-check of that equation (tests/catalog/test_catalog_13.py calls it with a
stand-in trainer); trl's code is refused while the learner's code runs."""
from __future__ import annotations

import math

import torch

from graders.exercises.nb13 import reference as ref
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.judging.tolerance import close

NOTEBOOK = "13_post_training"
D_VOCAB = 30
FORBIDDEN = Forbidden("the DPO loss", source_words=["trl", "DPOTrainer"], instead="from the paper's equation",
                      library_code=("trl",), notebook_wide=False)
LOGPROB_SLIPS = {
    "mean": "a mean over the response's tokens, not their sum: the log-probability of a sequence is the sum of its "
            "tokens' (a product of probabilities), and a mean makes a long answer cost as little as a short one",
    "prompt": "the prompt's tokens are counted: only the response's log-probability is compared, the prompt is "
              "the same for both answers (and is given, not generated)",
    "unshifted": "the tokens are not shifted: position i's logits predict tokens[i + 1]",
}
LOSS_SLIPS = {
    "beta_outside": "beta is outside the sigmoid: -beta log sigmoid(margin), where the loss is "
                    "-log sigmoid(beta margin)",
    "swapped": "chosen and rejected are swapped: the loss pushes the rejected answer up",
}


def logprob_inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits [batch, posn, d_vocab], tokens, response_mask): each sequence a prompt of its own
    length followed by its response, so that every kind of sum gives another number."""
    generator = torch.Generator().manual_seed(100 + case.seed)
    logits = torch.randn(case.batch, case.seq, D_VOCAB, generator=generator) * 2
    tokens = torch.randint(0, D_VOCAB, (case.batch, case.seq), generator=generator)
    mask = torch.zeros(case.batch, case.seq, dtype=torch.bool)
    for b in range(case.batch):
        mask[b, 2 + (3 * b) % (case.seq - 4):] = True
    return logits, tokens, mask


def expected_logprob(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sum over response positions i of log softmax(logits[i - 1])[tokens[i]], in float64."""
    log_probs = logits.double().log_softmax(-1)[:, :-1]
    picked = log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
    return (picked * mask[:, 1:]).sum(-1)


def produce_logprob(sequence_logprob, case: Case, inputs: dict) -> dict:
    if not callable(sequence_logprob):
        raise CheckFailed(f"sequence_logprob: expected your function, got {sequence_logprob!r}.")
    logits, tokens, mask = logprob_inputs(case)
    got = run_learner("sequence_logprob", sequence_logprob, logits, tokens, mask, forbidden=FORBIDDEN)
    if not isinstance(got, torch.Tensor) or got.shape != (case.batch,):
        shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailed(f"sequence_logprob returned {shape} on logits {list(logits.shape)}; return one number per "
                          f"sequence, a tensor of shape [batch] = [{case.batch}].")
    return {"logprob": got.detach().double()}


def judge_logprob(case: Case, outputs: dict) -> None:
    logits, tokens, mask = logprob_inputs(case)
    want, got = expected_logprob(logits, tokens, mask), outputs["logprob"]
    if close(got, want):
        return
    b = int((~torch.isclose(got, want, rtol=1e-4, atol=1e-4)).nonzero()[0, 0]) if got.isfinite().all() else 0
    head = (f"sequence_logprob on {case.batch} sequences (prompts of different lengths, then responses) differs from "
            f"the sum of the response's token log-probabilities: sequence {b} gets {float(got[b]):.6g}, the equation "
            f"{float(want[b]):.6g}.")
    for slip, description in LOGPROB_SLIPS.items():
        if close(got, ref.sequence_logprob(logits.double(), tokens, mask, slip)):
            raise CheckFailed(f"{head} Likely mistake: {description}.", mistake=slip)
    ratio = got / want
    counts = mask[:, 1:].sum(-1).double()
    if close(ratio, 1 / counts):
        raise CheckFailed(f"{head} Likely mistake: {LOGPROB_SLIPS['mean']}.", mistake="mean")
    if torch.isfinite(ratio).all() and float(ratio.max() - ratio.min()) < 1e-6:
        raise CheckFailed(f"{head} Likely mistake: every sequence's is {float(ratio[0]):.4g} times the equation's: the "
                          "tokens are right, the sum is scaled (a log in another base, a factor?).", mistake="scaled")
    raise CheckFailed(f"{head}\n  Hint: log_softmax of the logits, each next token's picked with gather "
                      "(logits[:, :-1] against tokens[:, 1:]), kept where response_mask[:, 1:] is True, summed.")


# --- dpo_loss ----------------------------------------------------------------------------------

def beta_of(case: Case) -> float:
    return 0.1 if case.seed == 0 else 0.5


def loss_inputs(case: Case) -> list[torch.Tensor]:
    """Log-probs of a batch of pairs under the policy and the reference (sums of about 8 tokens'),
    float64, spread so that the sigmoid is neither flat nor saturated."""
    generator = torch.Generator().manual_seed(200 + case.seed)
    return [-(torch.rand(case.batch, generator=generator, dtype=torch.float64) * 20 + 2) for _ in range(4)]


def expected_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta) -> torch.Tensor:
    """-log sigmoid(beta [(pi_w - ref_w) - (pi_l - ref_l)]) averaged over the pairs: the paper's eq. 7, float64."""
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    return torch.log1p(torch.exp(-beta * margin)).mean()


def produce_loss(dpo_loss, case: Case, inputs: dict) -> dict:
    if not callable(dpo_loss):
        raise CheckFailed(f"dpo_loss: expected your function, got {dpo_loss!r}.")
    run_learner("dpo_loss", dpo_loss, *loss_inputs(case), beta_of(case), forbidden=FORBIDDEN)  # its own source read
    values = [x.clone().requires_grad_(True) for x in loss_inputs(case)]
    loss = run_learner("dpo_loss", _with_grad, dpo_loss, *values, beta_of(case), forbidden=FORBIDDEN)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise CheckFailed(f"dpo_loss returned {shape} for {case.batch} pairs; return the mean loss over the pairs, "
                          "a scalar tensor.")
    outputs = {"loss": loss.detach().double().reshape(())}
    if loss.requires_grad:
        with torch.enable_grad():
            loss.backward()
    for name, value in zip(("policy_chosen", "policy_rejected", "reference_chosen", "reference_rejected"), values):
        grad = value.grad if value.grad is not None else torch.zeros(case.batch)
        outputs[f"grad_{name}"] = grad.double()
    return outputs


def _with_grad(fn, *args):
    with torch.enable_grad():
        return fn(*args)


def judge_loss(case: Case, outputs: dict) -> None:
    beta, values = beta_of(case), loss_inputs(case)
    where = f"dpo_loss on {case.batch} pairs (beta={beta:g})"
    leaves = [x.clone().requires_grad_(True) for x in values]
    want = expected_loss(*leaves, beta)
    want.backward()
    got = outputs["loss"]
    if not close(got, want.detach()):
        head = f"{where} returned {float(got):.6g}; the paper's equation gives {float(want):.6g}."
        for slip, description in LOSS_SLIPS.items():
            if close(got, ref.dpo_loss(*values, beta, slip=slip)):
                raise CheckFailed(f"{head} Likely mistake: {description}.", mistake=slip)
        if math.isfinite(float(got)) and close(got, expected_loss(*values, 1.0)):
            raise CheckFailed(f"{head} Likely mistake: beta is not used (the loss is the one of beta = 1).",
                              mistake="beta_unused")
        ratio = float(got) / float(want)
        if abs(ratio - case.batch) < 1e-4 * case.batch:
            raise CheckFailed(f"{head} Likely mistake: a sum over the {case.batch} pairs, not their mean (the loss is "
                              f"{case.batch} times the equation's).", mistake="sum_over_pairs")
        if math.isfinite(ratio) and abs(ratio - 1) > 1e-3 and close(got, ratio * want.detach()):
            raise CheckFailed(f"{head} Likely mistake: your loss is {ratio:.4g} times the equation's (a log in another "
                              "base, a factor?).", mistake="scaled")
        raise CheckFailed(f"{head}\n  Hint: the margin is (log pi(y_w) - log pi_ref(y_w)) - "
                          "(log pi(y_l) - log pi_ref(y_l)); "
                          "the loss is the mean of -log sigmoid(beta margin) (F.logsigmoid is stable).")
    for name, leaf in zip(("policy_chosen", "policy_rejected"), leaves[:2]):
        if not close(outputs[f"grad_{name}"], leaf.grad):
            raise CheckFailed(f"{where}: the loss is right but its gradient with respect to {name} is not (an in-place "
                              "or detached step in the computation?). The policy's log-probs must carry the gradient.")
    for name in ("reference_chosen", "reference_rejected"):
        if outputs[f"grad_{name}"].abs().max() > 0:
            raise CheckFailed(f"{where}: the loss is right, but a gradient reaches {name}. Likely mistake: the "
                              "reference is not frozen: its log-probs are constants of the loss; detach them (or "
                              "compute them under torch.no_grad()), so that no step ever trains the reference.",
                              mistake="reference_not_frozen")


logprob_exercise = Exercise(NOTEBOOK, "sequence_logprob", produce_logprob, judge_logprob, forbidden=(FORBIDDEN,),
                            defaults={"text": None, "batch": 4, "seq": 12})
check_sequence_logprob = logprob_exercise.checker(
    "Grade `sequence_logprob(logits, tokens, response_mask)` against the sum of the response tokens' "
    "log-probabilities, in float64.")
loss_exercise = Exercise(NOTEBOOK, "dpo_loss", produce_loss, judge_loss, forbidden=(FORBIDDEN,),
                         defaults={"text": None, "batch": 6})
check_dpo_loss = loss_exercise.checker(
    "Grade `dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)` against the DPO "
    "paper's equation in float64, its value and its gradients.")
