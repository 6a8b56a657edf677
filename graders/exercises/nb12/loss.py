"""Notebook 12, exercise 1: `cross_entropy(logits, targets, ignore_index)`, judged against
`F.cross_entropy` on ordinary logits, on logits spread over +-60 (where the log of a softmax
underflows) and on logits of magnitude 1e4 (where an exp without the max-shift overflows), in
float32 and in bfloat16. The judge recomputes each known mistake on the same inputs and names
the one whose losses the learner's match on every input at once.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises.nb12.readers import real_number, real_tensor
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.integrity import WATCH_PARTS, Guard, LibraryOps, refused_ops
from graders.judging.tolerance import close

NOTEBOOK = "12_training_step"
D_VOCAB = 50
LIBRARY_LOSSES = [(F, "cross_entropy"), (F, "nll_loss"), (F, "log_softmax"), (torch, "log_softmax"),
                  (torch.Tensor, "log_softmax"), (torch, "logsumexp"), (torch.Tensor, "logsumexp"),
                  (torch.special, "logsumexp"), (torch.special, "log_softmax"),
                  (nn.CrossEntropyLoss, "forward"), (nn.NLLLoss, "forward"), (nn.LogSoftmax, "forward")]
FORBIDDEN = Forbidden(
    "the cross-entropy", targets=LIBRARY_LOSSES,
    source_words=["F.cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss", "log_softmax", "LogSoftmax",
                  "torch.logsumexp", ".logsumexp("],
    instead="from max, exp, sum, log and gather", notebook_wide=False,
    library_code=("torch.nn.functional:cross_entropy", "torch.nn.functional:nll_loss",
                  "torch.nn.functional:log_softmax", "torch.nn.modules.loss:CrossEntropyLoss",
                  "torch.nn.modules.loss:NLLLoss", "torch.nn.modules.activation:LogSoftmax"))
# The kernels that compute the loss or its log-probabilities, however they are reached (F, a Tensor
# method, torch.special, torch._C._nn, torch.ops.aten): the dispatcher sees each by this name.
LIBRARY_OPS = LibraryOps(
    "the cross-entropy",
    ops=(("_log_softmax", "log-softmax"), ("log_softmax", "log-softmax"), ("_softmax", "softmax"),
         ("softmax", "softmax"), ("_safe_softmax", "softmax"), ("logsumexp", "logsumexp"),
         ("_sparse_log_softmax", "log-softmax of a sparse tensor"), ("_sparse_softmax", "softmax of a sparse tensor"),
         *((name, "the negative log-likelihood loss") for name in ("nll_loss_forward", "nll_loss", "nll_loss_nd",
                                                                    "nll_loss2d_forward")),
         ("cross_entropy_loss", "the cross-entropy loss")),
    sources=("torch.nn.functional:cross_entropy", "torch.nn.functional:nll_loss", "torch.nn.functional:log_softmax",
             "torch.nn.functional:softmax", "torch.nn.modules.loss:CrossEntropyLoss", "torch.nn.modules.loss:NLLLoss"),
    instead="from max, exp, sum, log and gather")
# The inputs each check runs on: (name, dtype, scale of the logits). "spread" stretches each row
# from -60 to +60 and puts the target at its smallest logit: exp(-120) underflows float32 to 0.
# "offset" moves each row by its own constant, from -80 to +40: no exp overflows, but a row 120
# below the tensor's largest logit underflows when shifted by that one max.
# "wide" is spread with each target at its row's largest logit: nothing underflows there, but an exp
# shifted by the row's minimum overflows.
INPUTS = (("ordinary", torch.float32, 2.0), ("spread", torch.float32, 60.0), ("wide", torch.float32, 60.0),
          ("offset", torch.float32, 2.0),
          ("large", torch.float32, 1e4),
          ("ordinary", torch.bfloat16, 2.0), ("large", torch.bfloat16, 1e4))
DESCRIBED = {"ordinary": "ordinary logits (spread about +-4)",
             "spread": "logits from -60 to +60, each target at its row's smallest logit",
             "wide": "logits from -60 to +60, each target at its row's largest logit",
             "offset": "ordinary logits moved by a constant per position, from -80 to +40",
             "large": "logits of magnitude 1e4"}


def ignore_index_of(case: Case) -> int:
    return -100 if case.seed == 0 else -1


def loss_inputs(case: Case) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(label, logits [batch, posn, d_vocab], targets [batch, posn]) for each of INPUTS. The
    sequences end in padding of different lengths (targets = ignore_index), so that a mean over
    all positions, or a mean of each sequence's mean, differs from the mean over the real ones."""
    found = []
    for i, (kind, dtype, scale) in enumerate(INPUTS):
        generator = torch.Generator().manual_seed(1000 * case.seed + i)
        logits = torch.randn(case.batch, case.seq, D_VOCAB, generator=generator)
        if kind in ("spread", "wide"):
            low, high = logits.amin(-1, keepdim=True), logits.amax(-1, keepdim=True)
            logits = (logits - low) / (high - low) * 2 * scale - scale     # each row from -60 to +60
            targets = logits.argmin(-1) if kind == "spread" else logits.argmax(-1)
        else:
            logits = logits * scale
            targets = torch.randint(0, D_VOCAB, (case.batch, case.seq), generator=generator)
        if kind == "offset":
            logits = logits + torch.linspace(-80, 40, case.batch * case.seq).reshape(case.batch, case.seq, 1)
        for b in range(1, case.batch):   # sequence b ends in 2b padding positions
            targets[b, max(1, case.seq - 2 * b):] = ignore_index_of(case)
        found.append((f"{kind}_{str(dtype).removeprefix('torch.')}", logits.to(dtype), targets))
    return found


def describe_input(label: str) -> str:
    kind, dtype = label.split("_")
    return f"{DESCRIBED[kind]}, {dtype}"


def produce(cross_entropy, case: Case, inputs: dict) -> dict:
    if not callable(cross_entropy):
        raise CheckFailed(f"cross_entropy: expected your function, got {cross_entropy!r}.")
    outputs = {}
    for label, logits, targets in loss_inputs(case):
        try:
            with refused_ops(LIBRARY_OPS, "cross_entropy"):
                loss = run_learner("cross_entropy", cross_entropy, logits, targets, ignore_index_of(case),
                                   forbidden=FORBIDDEN)
        except CheckFailed as failure:
            raise _crash_named(failure, label, case) from failure.__cause__
        if real_tensor(loss) is None:
            raise CheckFailed(f"cross_entropy returned {_kind(loss)} on {describe_input(label)}; "
                              "return the loss as a real torch tensor (a scalar, like F.cross_entropy's).")
        if loss.numel() != 1:
            raise CheckFailed(
                f"cross_entropy returned a tensor of shape {list(loss.shape)} on logits "
                f"{list(logits.shape)}, not a scalar. Likely mistake: the mean is taken over one axis "
                "only; the loss is the mean over every position whose target is not ignore_index.",
                mistake="mean_one_axis")
        outputs[label] = loss.detach().reshape(()).double()
        outputs[f"{label}_is_float32"] = torch.tensor(loss.dtype == torch.float32)
    return {**outputs, **_one_position_at_a_time(cross_entropy, case)}


def _one_position_at_a_time(cross_entropy, case: Case) -> dict:
    """The learner's loss of each real position of the first input alone ([1, 1, d_vocab] logits),
    NaN at padding: where a wrong loss starts, for the judge. Nothing when the function does not
    take one position (a mistake the whole inputs already show)."""
    label, logits, targets = loss_inputs(case)[0]
    found = torch.full(targets.shape, float("nan"), dtype=torch.float64)
    try:
        with refused_ops(LIBRARY_OPS, "cross_entropy"):
            for b, p in (targets != ignore_index_of(case)).nonzero().tolist():
                loss = run_learner("cross_entropy", cross_entropy, logits[b:b + 1, p:p + 1],
                                   targets[b:b + 1, p:p + 1], ignore_index_of(case), forbidden=FORBIDDEN)
                number = real_number(loss)
                if number is None:
                    return {}
                found[b, p] = number
    except CheckFailed:
        return {}
    return {"one_position": found}


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor on {value.device.type}"
    return type(value).__name__


def _crash_named(failure: CheckFailed, label: str, case: Case) -> CheckFailed:
    """A crash that indexing with the padding's target causes, named."""
    text = str(failure)
    if "index" in text.lower() and ("out of bounds" in text or "out of range" in text):
        return CheckFailed(
            f"cross_entropy crashed on {describe_input(label)} whose padding positions have target "
            f"ignore_index={ignore_index_of(case)}. Likely mistake: the ignore index is not honoured: "
            f"those targets are not token ids, so mask them out (targets != ignore_index) and pick the "
            f"target logits with a valid index there (e.g. targets.clamp(min=0)); use the ignore_index "
            f"argument, not a fixed -100.\n  {text.splitlines()[0]}", mistake="ignore_index_unused")
    return failure


def expected_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """F.cross_entropy of the logits' values in float32. (Given bfloat16 logits, F.cross_entropy
    returns a bfloat16 loss rounded along the way, off by up to about 1% on these inputs; autocast
    runs the loss in float32, and so does the course.)"""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=ignore_index)


def loss_mistakes(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> dict[str, torch.Tensor]:
    """What each known mistake returns on these inputs, computed in float32 as a learner would."""
    x = logits.float()
    keep = targets != ignore_index
    picked = x.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    shift = x.amax(-1, keepdim=True)
    lse = shift[..., 0] + (x - shift).exp().sum(-1).log()
    per_position = (lse - picked) * keep

    def mean(losses):
        return losses.sum() / keep.sum()
    probs = (x - shift).exp() / (x - shift).exp().sum(-1, keepdim=True)
    return {
        Mistake("no_max_shift", "exp without the max-shift: exp(1e4) overflows to inf. Subtract each row's max "
                "before exp, and add it back after the log: logsumexp(x) = m + log(sum(exp(x - m)))"):
            mean((x.exp().sum(-1).log() - picked) * keep),
        Mistake("log_of_softmax", "the log of a softmax: a probability below ~1e-45 underflows to 0 and its log "
                "is -inf. Work in log space: log p = x - logsumexp(x), never log(softmax(x))"):
            mean(-probs.gather(-1, targets.clamp(min=0)[..., None])[..., 0].log() * keep),
        Mistake("min_shift", "the shift is each row's minimum, not its maximum: exp(x - min) is at least 1 and "
                "overflows once a row spans more than about 88. Subtract the row's max, so that every exponent "
                "is at most 0"):
            mean((x.amin(-1) + (x - x.amin(-1, keepdim=True)).exp().sum(-1).log() - picked) * keep),
        Mistake("global_max_shift", "the shift is the max of the whole tensor, not of each row: a row far below "
                "it has every exp(x - m) underflow to 0. Take m per position: x.amax(dim=-1, keepdim=True)"):
            mean((x.amax() + (x - x.amax()).exp().sum(-1).log() - picked) * keep),
        Mistake("max_not_added_back", "the max is subtracted but not added back: logsumexp(x) = m + "
                "log(sum(exp(x - m)))"):
            mean(((x - shift).exp().sum(-1).log() - picked) * keep),
        Mistake("padding_counted", "the padding positions are counted: their losses are left out of the sum but "
                "the mean divides by every position; divide by the number of positions whose target is not "
                "ignore_index"):
            per_position.sum() / keep.numel(),
        Mistake("ignore_index_unused", "the ignore index is not honoured: the padding positions' losses (with "
                "target 0 in place of ignore_index) are in the mean"): ((lse - picked)).mean(),
        Mistake("mean_of_means", "a mean of each sequence's mean: a sequence with padding then weighs more per "
                "token; the loss is the mean over all the batch's real positions at once"):
            (per_position.sum(-1) / keep.sum(-1)).mean(),
        Mistake("batch_mean_only", "the mean is over the batch only (the positions' losses are summed): take the "
                "mean over every real position"): per_position.sum() / x.shape[0],
        Mistake("vocab_mean", "the mean over the vocabulary axis: every token's log-probability is averaged, not "
                "only the target's; pick the target's with gather"): mean(-((x - lse[..., None]).mean(-1)) * keep),
    }


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal under the course tolerance, where any two non-finite values count as the same."""
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return not torch.isfinite(a).any() and not torch.isfinite(b).any()
    return close(a, b)


def judge(case: Case, outputs: dict) -> None:
    ignore_index = ignore_index_of(case)
    inputs = loss_inputs(case)
    expected = {label: expected_loss(logits, targets, ignore_index).double() for label, logits, targets in inputs}
    wrong = [label for label, _, _ in inputs if not _same(outputs[label], expected[label])]
    if not wrong:
        return
    first = wrong[0]
    got, want = float(outputs[first]), float(expected[first])
    head = (f"cross_entropy on {describe_input(first)} (ignore_index={ignore_index}) returned {got:.6g}; "
            f"F.cross_entropy gives {want:.6g}.")
    right = [describe_input(label) for label, _, _ in inputs if label not in wrong]
    where = f"\n  Right on: {'; '.join(right)}." if right else ""
    mistakes = {label: loss_mistakes(logits, targets, ignore_index) for label, logits, targets in inputs}
    for description in mistakes[first]:
        if all(_same(outputs[label], mistakes[label][description]) for label, _, _ in inputs):
            raise CheckFailed(f"{head} Likely mistake: {description}.{where}", mistake=mistake_key(description))
    if all(label.endswith("bfloat16") for label in wrong):
        lower = [label for label in wrong if not bool(outputs[f"{label}_is_float32"])]
        how = ("it returned a bfloat16 loss" if lower else
               "it is off by about bfloat16's rounding (2 to 3 decimal digits)")
        raise CheckFailed(
            f"{head} Likely mistake: the loss is computed in bfloat16 ({how}): bfloat16 keeps 8 "
            "significant bits, so a sum of exps and a log lose precision. Convert the logits to float32 "
            f"first (logits.float()) and return a float32 loss, as autocast runs F.cross_entropy.{where}",
            mistake="bfloat16_loss")
    if not math.isfinite(got):
        raise CheckFailed(f"{head} Likely mistake: something overflows or underflows: look for an exp "
                          f"of a large number, or a log of a number that rounds to 0.{where}", mistake="overflow")
    relation = _constant_relation(outputs, expected, [label for label, _, _ in inputs])
    if relation:
        raise CheckFailed(f"{head} Likely mistake: {relation}.{where}", mistake=mistake_key(relation))
    raise CheckFailed(f"{head}{where}{_first_position(outputs, case)}\n  Hint: the loss of a position is "
                      "logsumexp(logits) - "
                      "logits[target], with logsumexp(x) = m + log(sum(exp(x - m))) and m the row's "
                      "max; the result is the mean over the positions whose target is not ignore_index.")


def _first_position(outputs: dict, case: Case) -> str:
    """Where the learner's loss of one position alone first differs from F.cross_entropy's, or that
    none does (then the mistake is in how the positions' losses are combined)."""
    if "one_position" not in outputs:
        return ""
    label, logits, targets = loss_inputs(case)[0]
    want = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=ignore_index_of(case),
                           reduction="none").reshape(targets.shape).double()
    real = targets != ignore_index_of(case)
    got = outputs["one_position"]
    for b, p in real.nonzero().tolist():
        if not _same(got[b, p], want[b, p]):
            return (f"\n  Where it starts: on {describe_input(label)}, position {p} of sequence {b} alone (target "
                    f"{int(targets[b, p])}) gives {float(got[b, p]):.6g}, where F.cross_entropy gives "
                    f"{float(want[b, p]):.6g}: the first position whose own loss is wrong.")
    return (f"\n  Where it starts: on {describe_input(label)}, every real position alone gives F.cross_entropy's "
            "loss: the positions' losses are right, and the mistake is in how they are combined (the mask of "
            "ignore_index, the sum, the count).")


def _constant_relation(outputs: dict, expected: dict, labels: list[str]) -> str | None:
    """A mistake no list holds, named from how the learner's losses relate to F.cross_entropy's on
    every float32 input at once: one factor (a logarithm in another base, a normalisation) or one
    offset."""
    pairs = [(float(outputs[label]), float(expected[label])) for label in labels if label.endswith("float32")]
    if len(pairs) < 2 or not all(math.isfinite(got) and want > 0 for got, want in pairs):
        return None
    factors = [got / want for got, want in pairs]
    if max(factors) - min(factors) <= 1e-4 * abs(factors[0]):
        factor = factors[0]
        for base, name in ((2, "log2"), (10, "log10")):
            if abs(factor - 1 / math.log(base)) <= 1e-3:
                return Mistake("log_base", f"the loss is {factor:.4g} times F.cross_entropy's on every input, "
                               f"1 / ln {base}: a logarithm in base {base} ({name}); the loss uses the natural log "
                               "(torch.log)")
        return Mistake("scaled", f"the loss is {factor:.4g} times F.cross_entropy's on every input: the "
                       "per-position losses are right, and their sum is divided by the wrong count (the number of "
                       "positions whose target is not ignore_index), or scaled")
    offsets = [got - want for got, want in pairs]
    rounding = 1e-5 * max(abs(want) for _, want in pairs)      # float32's, on losses up to about 2e4
    if max(offsets) - min(offsets) <= 1e-4 * max(1.0, abs(offsets[0])) + rounding:
        return Mistake("constant_offset", f"the loss is F.cross_entropy's plus {offsets[0]:.4g} on every input: a "
                       "constant term, one that does not depend on the logits (a log of the vocabulary size, a +1 "
                       "inside a log?)")
    return None


exercise = Exercise(NOTEBOOK, "cross_entropy", produce, judge, forbidden=(FORBIDDEN,),
                    defaults={"text": None, "batch": 3, "seq": 8},
                    guard=Guard(supplies=WATCH_PARTS, library_ops=(LIBRARY_OPS,)))
check_cross_entropy = exercise.checker(
    "Grade `cross_entropy(logits, targets, ignore_index)` against F.cross_entropy, ordinary and huge "
    "logits, float32 and bfloat16.")
