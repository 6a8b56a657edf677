"""The course's answers to notebook 13, with switches for the mistakes its checks name: a judge
runs a variant on the learner's inputs and names the mistake whose outputs the learner's match.
Sealed in a grading kernel (marked `@course_answer`, graders.marks): with every switch off each is correct."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graders.exercises.nb13.gpt import Linear
from graders.marks import course_answer

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@course_answer("chat_tokens")
def chat_tokens(messages: list[dict], encoding, slip: str = "") -> tuple[Tensor, Tensor]:
    """(tokens, labels) of a conversation under the course's template: each message is
    <|im_start|>{role}\\n{content}<|im_end|>\\n; labels are the tokens of every assistant's content
    and its <|im_end|>, -100 elsewhere. `slip`: "unmasked" (the prompt learned too), "end_masked"
    (the assistant's <|im_end|> masked), "shifted" (labels[i] = tokens[i + 1]), "no_newline" (no
    newline after the role), "last_turn_only" (only the last assistant message learned)."""
    start, end = encoding.encode_single_token(IM_START), encoding.encode_single_token(IM_END)
    tokens, learned = [], []
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    for i, message in enumerate(messages):
        header = [start] + encoding.encode_ordinary(message["role"] + ("" if slip == "no_newline" else "\n"))
        body = encoding.encode_ordinary(message["content"])
        assistant = message["role"] == "assistant" and (slip != "last_turn_only" or i == last)
        tokens += header + body + [end] + encoding.encode_ordinary("\n")
        learned += ([False] * len(header) + [assistant] * len(body) + [assistant and slip != "end_masked"]
                    + [False])
    tokens = torch.tensor(tokens)
    keep = torch.tensor(learned) | (slip == "unmasked")
    labels = tokens.where(keep, -100)
    if slip == "shifted":
        labels = torch.cat([labels[1:], torch.tensor([-100])])
    return tokens, labels


@course_answer("sft_loss")
def sft_loss(logits: Tensor, labels: Tensor, slip: str = "") -> Tensor:
    """The mean next-token loss over the labelled positions of a padded batch: position i predicts
    labels[i + 1]. `slip`: "all_positions" (divided by every position), "per_sequence" (each
    sequence's mean, then their mean), "unshifted" (position i predicts labels[i]), "over_positions"
    (log_softmax over the positions, not the vocabulary), "mask_before_shift" (the mask of the
    unshifted labels: position i's flag kept for label i + 1)."""
    keep = labels != -100
    if slip != "unshifted":
        keep = keep[:, :-1] if slip == "mask_before_shift" else keep[:, 1:]
        logits, labels = logits[:, :-1], labels[:, 1:]
    log_probs = logits.float().log_softmax(1 if slip == "over_positions" else -1)
    picked = log_probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0] * keep
    if slip == "all_positions":
        return -picked.sum() / keep.numel()
    if slip == "per_sequence":
        return (-picked.sum(-1) / keep.sum(-1).clamp(min=1)).mean()
    return -picked.sum() / keep.sum()


@course_answer("LoRALinear")
class LoRALinear(nn.Module):
    """y = x W + b + (alpha / r) x A B around a frozen Linear: A [d_in, r] drawn like a Linear's
    weight (uniform in +-1/sqrt(d_in)), B [r, d_out] zero, so that the output is
    the base layer's until B learns. `slip`: "alpha" (scale alpha, not alpha / r), "floor_scale"
    (alpha // r), "both_random" (B drawn like A), "base_trainable", "dropout_at_eval"."""

    def __init__(self, base: Linear, r: int, alpha: float, dropout: float = 0.0, slip: str = ""):
        super().__init__()
        d_in, d_out = base.weight.shape
        self.base, self.slip = base, slip
        self.base.requires_grad_(slip == "base_trainable")
        bound = 1 / math.sqrt(d_in)
        self.A = nn.Parameter(torch.empty(d_in, r).uniform_(-bound, bound))
        self.B = nn.Parameter(torch.empty(r, d_out).uniform_(-bound, bound) if slip == "both_random"
                              else torch.zeros(r, d_out))
        self.scale = {"alpha": alpha, "floor_scale": alpha // r}.get(slip, alpha / r)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        dropped = F.dropout(x, self.dropout.p) if self.slip == "dropout_at_eval" else self.dropout(x)
        return self.base(x) + self.scale * (dropped @ self.A) @ self.B


@course_answer("add_lora")
def add_lora(model: nn.Module, r: int, alpha: float, dropout: float = 0.0, slip: str = "") -> nn.Module:
    """Freeze `model` and wrap every block's attention projections (attn.c_attn, attn.c_proj)."""
    model.requires_grad_(slip == "base_trainable")
    for block in model.transformer.h:
        block.attn.c_attn = LoRALinear(block.attn.c_attn, r, alpha, dropout, slip)
        block.attn.c_proj = LoRALinear(block.attn.c_proj, r, alpha, dropout, slip)
    return model


@course_answer("merge_lora")
def merge_lora(model: nn.Module, slip: str = "") -> nn.Module:
    """Each LoRALinear replaced by one Linear of weight W + (alpha / r) A B: the same outputs, no
    extra cost at inference. `slip`: "unscaled" (W + A B)."""
    for block in model.transformer.h:
        for name in ("c_attn", "c_proj"):
            lora = getattr(block.attn, name)
            merged = Linear(*lora.base.weight.shape)
            scale = 1.0 if slip == "unscaled" else lora.scale
            with torch.no_grad():
                merged.weight.copy_(lora.base.weight + scale * lora.A @ lora.B)
                merged.bias.copy_(lora.base.bias)
            merged.requires_grad_(False)
            setattr(block.attn, name, merged)
    return model


@course_answer("sequence_logprob")
def sequence_logprob(logits: Tensor, tokens: Tensor, response_mask: Tensor, slip: str = "") -> Tensor:
    """log p(response | prompt) of each sequence: the log-probabilities of the tokens where
    response_mask is True, summed (position i's logits predict tokens[i + 1]). `slip`: "mean"
    (their mean), "prompt" (every token counted), "unshifted"."""
    log_probs = logits.float().log_softmax(-1) if logits.dtype != torch.float64 else logits.log_softmax(-1)
    if slip == "unshifted":
        picked, keep = log_probs.gather(-1, tokens[..., None])[..., 0], response_mask
    else:
        picked, keep = log_probs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0], response_mask[:, 1:]
    if slip == "prompt":
        keep = torch.ones_like(keep)
    total = (picked * keep).sum(-1)
    return total / keep.sum(-1).clamp(min=1) if slip == "mean" else total


@course_answer("dpo_loss")
def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, reference_chosen: Tensor,
             reference_rejected: Tensor, beta: float, slip: str = "") -> Tensor:
    """The mean of -log sigmoid(beta [(log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))]),
    the reference's log-probabilities constants. `slip`: "not_frozen" (gradients reach the
    reference), "beta_outside" (-beta log sigmoid(margin)), "swapped" (chosen and rejected)."""
    if slip != "not_frozen":
        reference_chosen, reference_rejected = reference_chosen.detach(), reference_rejected.detach()
    if slip == "swapped":
        policy_chosen, policy_rejected = policy_rejected, policy_chosen
        reference_chosen, reference_rejected = reference_rejected, reference_chosen
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    if slip == "beta_outside":
        return -(beta * F.logsigmoid(margin)).mean()
    return -F.logsigmoid(beta * margin).mean()


@course_answer("finetune")
def finetune(model: nn.Module, make_batch, n_steps: int) -> nn.Module:
    """Supervised finetuning with LoRA (r 8, alpha 16, AdamW at 3e-3) on the masked loss; the
    adapters merged into the model at the end."""
    model = add_lora(model, 8, 16.0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(n_steps):
        tokens, labels = make_batch()
        loss = sft_loss(model(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return merge_lora(model).eval()


@course_answer("train_dpo")
def train_dpo(policy: nn.Module, reference: nn.Module, make_batch, n_steps: int,
              beta: float) -> list[tuple[float, float]]:
    """DPO on every weight of the policy (AdamW at 5e-4), the reference frozen; the batch's mean
    implicit rewards beta (log pi - log pi_ref) of the chosen and the rejected answers, per step."""
    reference.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=5e-4, weight_decay=0.0)
    policy.train()
    history = []
    for _ in range(n_steps):
        batch = make_batch()
        tokens = torch.cat([batch["chosen_tokens"], batch["rejected_tokens"]])      # one forward for both
        mask = torch.cat([batch["chosen_mask"], batch["rejected_mask"]])
        with torch.no_grad():
            reference_chosen, reference_rejected = sequence_logprob(reference(tokens), tokens, mask).chunk(2)
        policy_chosen, policy_rejected = sequence_logprob(policy(tokens), tokens, mask).chunk(2)
        loss = dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append((beta * (policy_chosen - reference_chosen).mean().item(),
                        beta * (policy_rejected - reference_rejected).mean().item()))
    return history
