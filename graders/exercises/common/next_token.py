"""The next-token loss, written once: the reference, the catalogue of classic mistakes, and how a
learner's loss is judged. Notebook 06 grades `next_token_loss` on the reference model's logits;
notebook 07's training checks name the mistakes of a loss inside the learner's `train`."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graders.judging.compare import CheckFailed, Mistake, compare, mistake_key
from graders.judging.tolerance import tolerance
from graders.marks import course_answer

HINT = ("each position predicts the token after it, so the last position predicts nothing: the loss is "
        "minus the mean log-probability of those next tokens (look up log_softmax and gather).")


@course_answer("next_token_loss")
def reference_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (float64): position i predicts token i+1; the last has no target."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).double(),
                           tokens[:, 1:].reshape(-1))


def loss_mistakes(logits: torch.Tensor, tokens: torch.Tensor) -> dict:
    """What each classic mistake computes on (logits [batch, position, d_vocab], tokens)."""
    logits, vocab = logits.double(), logits.shape[-1]
    log_probs = logits.log_softmax(-1)
    picked = log_probs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]     # [batch, seq-1]

    def ce(lg, tk):
        return F.cross_entropy(lg.reshape(-1, vocab), tk.reshape(-1))

    return {
        Mistake("not_shifted", "the loss is not shifted: position i is scored on its own token tokens[i]; it "
                "must predict the next one, tokens[i+1] (use logits[:, :-1] with tokens[:, 1:])"):
            ce(logits, tokens),
        Mistake("shifted_the_wrong_way", "shifted the wrong way: logits[:, 1:] are scored against tokens[:, :-1]; "
                "position i predicts token i+1, so drop the LAST logits and the FIRST tokens"):
            ce(logits[:, 1:], tokens[:, :-1]),
        Mistake("last_position_scored", "the last position is scored too (torch.roll wraps the first token round "
                "as its target): it has no next token and must be left out"):
            ce(logits, tokens.roll(-1, dims=1)),
        Mistake("summed_not_averaged", "the losses are summed instead of averaged (take the mean over batch and "
                "positions)"):
            -picked.sum(),
        Mistake("summed_over_positions", "the loss is summed over positions and averaged only over the batch"):
            -picked.sum(-1).mean(),
        Mistake("no_minus_sign", "the minus sign is missing: the loss is the NEGATIVE mean log-probability"):
            picked.mean(),
        Mistake("probabilities_not_log", "probabilities are averaged instead of log-probabilities (take "
                "log_softmax, not softmax)"):
            -logits.softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean(),
        Mistake("log_softmax_wrong_dim", "log_softmax is taken over the wrong dimension (it must be over the "
                "vocabulary, dim=-1)"):
            -logits.log_softmax(1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean(),
        Mistake("raw_logits", "raw logits are used instead of log-probabilities (normalise with log_softmax "
                "first)"):
            -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean(),
    }


FLATTENED_FIX = "F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())"


def crash_mistakes(logits: torch.Tensor, tokens: torch.Tensor) -> dict:
    """What each classic F.cross_entropy call that crashes on [batch, position, d_vocab] logits
    computes: the call, by the mistake it makes."""
    vocab = logits.shape[-1]
    return {
        Mistake("class_axis_is_position", "F.cross_entropy reads the class scores from the second axis, and the "
                "second axis of [batch, position, d_vocab] logits is the position: put the vocabulary second, or "
                "flatten batch and position into one axis first (logits [batch*position, d_vocab], targets "
                "[batch*position])."):
            lambda: F.cross_entropy(logits[:, :-1], tokens[:, 1:]),
        Mistake("class_axis_is_position_not_shifted", "F.cross_entropy reads the class scores from the second "
                "axis, and the second axis of [batch, position, d_vocab] logits is the position; and the loss is "
                "not shifted: position i predicts token i+1, so drop the last logits and the first tokens."):
            lambda: F.cross_entropy(logits, tokens),
        Mistake("targets_not_flattened", "the logits are flattened to [batch*position, d_vocab] but the targets "
                "are not: flatten tokens[:, 1:] to [batch*position] too."):
            lambda: F.cross_entropy(logits[:, :-1].reshape(-1, vocab), tokens[:, 1:]),
    }


def named_crash(error: Exception, logits: torch.Tensor, tokens: torch.Tensor) -> str:
    """The mistake whose call, recomputed on the same inputs, raises the learner's error word for
    word ("" when none does)."""
    for description, call in crash_mistakes(logits, tokens).items():
        try:
            call()
        except Exception as expected:  # noqa: BLE001 (any error torch raises is compared)
            if type(expected) is type(error) and str(expected) == str(error):
                return description
    return ""


def judge_loss_value(what: str, loss, logits: torch.Tensor, tokens: torch.Tensor) -> None:
    """A learner's loss on (logits, tokens): one number (shape []), equal to the reference's
    within the course tolerance; a recognised mistake is named."""
    batch, seq = tokens.shape
    if isinstance(loss, torch.Tensor) and loss.dim() != 0:
        shape, likely, key = tuple(loss.shape), "", None
        if shape in ((batch, seq - 1), (batch, seq), (batch, seq - 1, 1)):
            likely, key = (" Likely mistake: one loss per position is returned (reduction='none'); "
                           "take the mean over batch and positions."), "one_loss_per_position"
        elif shape == (batch,):
            likely, key = (" Likely mistake: one loss per sequence is returned (a mean over positions "
                           "only); take the mean over batch and positions."), "one_loss_per_sequence"
        elif loss.numel() == 1:
            likely, key = " The value is one number but keeps a dimension: return a 0-dim tensor.", "not_0_dim"
        raise CheckFailed(f"{what}: returned shape {list(shape)}; the loss is one number (a 0-dim "
                          f"tensor, shape []).{likely}", mistake=key)
    expected, mistakes = reference_loss(logits, tokens), loss_mistakes(logits, tokens)
    if isinstance(loss, torch.Tensor) and loss.is_floating_point():
        # Judged on the scale of the right loss: a wrong value near 0 (raw logits average out)
        # is rounded like the learner's own computation, far more coarsely than its own size.
        distance = {d: float((loss.double() - w).abs()) for d, w in mistakes.items()}
        nearest = min(distance, key=distance.get)
        if distance[nearest] <= float(tolerance(expected)) and not bool(
                (loss.double() - expected).abs() <= tolerance(expected)):
            raise CheckFailed(f"{what} does not match the reference (got {loss.item():.6g}, "
                              f"expected {expected.item():.6g}). Likely mistake: {nearest}",
                              mistake=mistake_key(nearest))
    compare(what, loss, expected, (), mistakes=mistakes, hint=HINT)
