"""Training grader (07), train on the reversal task (graders/exercises/nb07/train.py): catalogued
mistakes fail with their diagnosis; correct variants pass. Each check of `train` trains a small model
for the grader's step budget (a few seconds on an idle core). Like every 07 catalog, it runs in xdist
group nb07, on one worker: the grader's data and models are built once per worker."""
import math

import pytest
import torch
from tqdm.auto import tqdm

from graders.exercises import nb07
from graders.reference import components
from catalog_helpers import fails_with
from catalog_07_shared import loss_cross_entropy, loss_gather, loss_logsumexp, unshifted
from test_catalog_07_reversal import eval_batched, eval_leaves_eval_mode, eval_whole

pytestmark = pytest.mark.xdist_group("nb07")


# --- train (the reversal task) --------------------------------------------------------------------

def course_groups(model, weight_decay):
    """A learner's optimizer_groups: weight matrices decayed; biases, LayerNorm, embeddings not."""
    decay, keep = [], []
    for name, param in model.named_parameters():
        leaf = name.split(".")[-1]
        matrix = leaf.startswith("W_") and leaf not in ("W_E", "W_pos")
        (decay if matrix else keep).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def course_lr(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def make_train(loss_fn=loss_gather, zero_grad=True, step=True, backward=True, eval_on_train=False,
               optimizer_each_step=False, use_lr=True, zero_grad_first=False, clip="between",
               optimizer_every_eval=False, other_parameters=False, zero_between=False,
               model_zero_grad=False, groups=True, schedule="every_step", evaluate=eval_batched):
    """A training loop with the mistakes (or harmless variations) switched on by the arguments.
    clip: "between" (backward and step), "before_backward", "after_step", "normalize" (scale
    every gradient to max_grad_norm, not only larger ones) or "none"; schedule:
    "every_step", "none", "after_step", "first_group" or "every_eval"."""
    def train(model, make_batch, n_steps, max_lr, eval_tokens, eval_every=50, weight_decay=0.1,
              warmup_steps=10, min_lr=1e-3, max_grad_norm=1.0, progress=True):
        lr_used = max_lr if use_lr else 1e-6
        model.train()

        def new_optimizer():
            if other_parameters:
                return torch.optim.AdamW(torch.nn.Linear(4, 4).parameters(), lr=lr_used)
            params = course_groups(model, weight_decay) if groups else model.parameters()
            return torch.optim.AdamW(params, lr=lr_used, weight_decay=weight_decay)

        def set_lr(i):
            if schedule == "none" or not use_lr:
                return
            rate = course_lr(i - i % eval_every if schedule == "every_eval" else i, max_lr,
                             warmup_steps, n_steps, min_lr)
            for group in optimizer.param_groups[:1] if schedule == "first_group" else optimizer.param_groups:
                group["lr"] = rate

        def clip_now():
            if clip == "normalize":      # every gradient scaled to norm max_grad_norm, small ones too
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                total = torch.cat([g.flatten() for g in grads]).norm()
                for g in grads:
                    g.mul_(max_grad_norm / total)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)

        optimizer = new_optimizer()
        train_losses, eval_losses = [], []
        for i in tqdm(range(n_steps), disable=not progress):
            if optimizer_each_step or (optimizer_every_eval and i % eval_every == 0):
                optimizer = new_optimizer()
            if zero_grad_first:
                optimizer.zero_grad(set_to_none=False)
            tokens = make_batch()
            loss = loss_fn(model(tokens), tokens)
            if clip == "before_backward":
                clip_now()
            if backward:
                loss.backward()
            if clip in ("between", "normalize"):
                clip_now()
            if zero_between:
                optimizer.zero_grad()
            if schedule != "after_step":
                set_lr(i)
            if step:
                optimizer.step()
            if schedule == "after_step":
                set_lr(i)
            if clip == "after_step":
                clip_now()
            if model_zero_grad:
                model.zero_grad()
            elif zero_grad and not zero_grad_first and not zero_between:
                optimizer.zero_grad()
            train_losses.append(loss.item())
            if (i + 1) % eval_every == 0:
                held_out = make_batch() if eval_on_train else eval_tokens
                eval_losses.append((i + 1, evaluate(model, held_out)))
        return train_losses, eval_losses
    return train


class NoMask(components.DemoTransformer):
    """A learner model whose attention forgot the causal mask."""

    def __init__(self, cfg):
        super().__init__(cfg)
        for block in self.blocks:
            block.attn.apply_causal_mask = lambda scores: scores


class MaskOffByOne(components.DemoTransformer):
    """The mask hides only positions > i + 1: each position sees one token ahead."""

    def __init__(self, cfg):
        super().__init__(cfg)
        for block in self.blocks:
            block.attn.apply_causal_mask = self._mask

    @staticmethod
    def _mask(scores):
        q, k = scores.shape[-2:]
        future = torch.triu(torch.ones(q, k, dtype=torch.bool), diagonal=2)
        return scores.masked_fill(future, -1e5)


TRAIN_CORRECT = {
    "solution": (make_train(), None),
    "cross_entropy_zero_grad_first": (make_train(loss_fn=loss_cross_entropy, zero_grad_first=True), None),
    "logsumexp_loss": (make_train(loss_fn=loss_logsumexp), None),
    "model_zero_grad_whole_batch_eval": (make_train(model_zero_grad=True, evaluate=eval_whole), None),
}


# Each check of `train` is a graded training run (150 optimizer steps): the fast tier keeps the
# solution's round trip, the full tier runs every variant and every mistake.
@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name == "solution" else pytest.mark.slow)
                                  for name in TRAIN_CORRECT])
def test_train_correct_variants(name):
    train, model_class = TRAIN_CORRECT[name]
    nb07.check_train(train, model_class)


TRAIN_BUGS = {
    "no_causal_mask": (make_train(), NoMask, "information is leaking from the future"),
    "mask_off_by_one": (make_train(), MaskOffByOne, "check your causal mask"),
    "loss_not_shifted": (make_train(loss_fn=unshifted), None, "the training loss is not shifted"),
    "zero_grad_missing": (make_train(zero_grad=False), None, "Likely mistake: optimizer.zero_grad() is missing"),
    "no_optimizer_step": (make_train(step=False), None, "Likely mistake: optimizer.step() is never called"),
    "no_backward": (make_train(backward=False), None, "Likely mistake: loss.backward() is missing"),
    "zero_grad_between_backward_and_step": (make_train(zero_between=True), None,
                                            "or zero_grad() runs between backward() and step()"),
    "eval_on_training_data": (make_train(eval_on_train=True), None,
                              "Likely mistake: evaluation uses training batches"),
    "lr_ignored": (make_train(use_lr=False), None, "the max_lr argument and the schedule are not used"),
    "decay_on_every_parameter": (make_train(groups=False), None,
                                 "Likely mistake: decay is applied to every parameter"),
    "no_schedule": (make_train(schedule="none"), None, "the rate never changes from max_lr"),
    "lr_set_after_step": (make_train(schedule="after_step"), None,
                          "the rate is set after optimizer.step()"),
    "schedule_in_first_group_only": (make_train(schedule="first_group"), None,
                                     "the param groups got different rates"),
    "schedule_stepped_per_evaluation": (make_train(schedule="every_eval"), None,
                                        "not at every step"),
    "clip_before_backward": (make_train(clip="before_backward"), None,
                             "Likely mistake: clip_grad_norm_ is called before loss.backward()"),
    "clip_after_step": (make_train(clip="after_step"), None, "train does not clip the gradients"),
    "no_clipping": (make_train(clip="none"), None, "train does not clip the gradients"),
    "gradients_always_rescaled": (make_train(clip="normalize"), None,
                                  "train changes the gradients other than clipping does"),
    "evaluate_leaves_eval_mode": (make_train(evaluate=eval_leaves_eval_mode), None,
                                  "the model was in eval mode at"),
    "optimizer_every_step": (make_train(optimizer_each_step=True), None,
                             "Likely mistake: the optimizer is re-created every step"),
    "optimizer_every_eval": (make_train(optimizer_every_eval=True), None,
                             "Likely mistake: the optimizer is re-created during training"),
    "optimizer_on_other_parameters": (make_train(other_parameters=True), None,
                                      "Likely mistake: the optimizer was built on other parameters"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TRAIN_BUGS))
def test_train_mistakes(name):
    train, model_class, expected = TRAIN_BUGS[name]
    fails_with(nb07.check_train, train, expected=expected, first_line=True, model_class=model_class)


def test_train_not_implemented():
    def train(model, make_batch, n_steps, max_lr, eval_tokens, **settings):
        raise NotImplementedError
    fails_with(nb07.check_train, train, expected="not written yet", first_line=True)


WRONG_PARTS = """
def optimizer_groups(model, weight_decay):      # every parameter decayed
    return [{"params": list(model.parameters()), "weight_decay": weight_decay}]


def lr_at(step, max_lr, warmup_steps, total_steps, min_lr):   # no schedule
    return max_lr


@torch.no_grad()
def evaluate(model, tokens, batch_size=256):    # leaves the model in eval mode
    model.eval()
    return lm_cross_entropy_loss(model(tokens), tokens).item()
"""

SOLUTION_TRAIN = """
def train(model, make_batch, n_steps, max_lr, eval_tokens, eval_every=50, weight_decay=0.1,
          warmup_steps=10, min_lr=1e-3, max_grad_norm=1.0, progress=True):
    model.train()
    optimizer = torch.optim.AdamW(optimizer_groups(model, weight_decay), lr=max_lr)
    train_losses, eval_losses = [], []
    for step in range(n_steps):
        tokens = make_batch()
        loss = lm_cross_entropy_loss(model(tokens), tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, max_lr, warmup_steps, n_steps, min_lr)
        optimizer.step()
        optimizer.zero_grad()
        train_losses.append(loss.item())
        if (step + 1) % eval_every == 0 or step + 1 == n_steps:
            eval_losses.append((step + 1, evaluate(model, eval_tokens)))
    return train_losses, eval_losses
"""


@pytest.mark.slow   # a graded training run, as the tiers define slow (the solution's train stays in test-fast)
def test_a_wrong_part_costs_only_its_own_check():
    """A notebook whose optimizer_groups, lr_at and evaluate are wrong and whose train is right:
    each part fails its own check, and train passes its, which runs the course's parts under the
    notebook's names (07 charged each of them to train and Shakespeare as well), and
    gives the learner's back afterwards."""
    notebook = {"torch": torch, "lm_cross_entropy_loss": loss_cross_entropy}
    exec(WRONG_PARTS + SOLUTION_TRAIN, notebook)
    parts = {name: notebook[name] for name in ("optimizer_groups", "lr_at", "evaluate")}
    fails_with(nb07.check_optimizer_groups, parts["optimizer_groups"], expected="optimizer_groups", first_line=True)
    fails_with(nb07.check_lr_at, parts["lr_at"], expected="lr_at", first_line=True)
    fails_with(nb07.check_evaluate, parts["evaluate"], expected="evaluate left the model in eval mode", first_line=True)
    nb07.check_train(notebook["train"])
    assert all(notebook[name] is part for name, part in parts.items())
