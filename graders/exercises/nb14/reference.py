"""The course's answers to notebook 14, with switches for the mistakes its checks name: a judge
runs a variant on the learner's inputs and names the mistake whose outputs the learner's match.
Sealed in a grading kernel (marked `@course_answer`, graders.marks): with every switch off each is correct."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from graders.exercises.nb13 import tasks
from graders.marks import course_answer

IM_END = "<|im_end|>"
EPS = 1e-4      # trl's epsilon in the advantage's denominator
# The RL run's recipe (the notebook states it; benchmarks/bench_rl.py sweeps its seeds).
RECIPE = dict(steps=60, prompts=8, group_size=8, temperature=1.0, max_new=4, lr=5e-4, beta=0.04, clip_eps=0.2)


@course_answer("sample_group")
@torch.no_grad()
def sample_group(model: nn.Module, prompt: Tensor, group_size: int, temperature: float, max_new: int, stop: int,
                 generator: torch.Generator, slip: str = "") -> tuple[Tensor, Tensor, Tensor]:
    """(completions, mask, logprobs) [group_size, max_new]: each step draws every row's next token
    with one torch.multinomial(softmax(logits / T), 1, generator) over [group_size, d_vocab]; a row
    stops after `stop` (its later positions hold `stop`, mask False, log-prob 0). `slip`:
    "untempered" (log-probs of softmax(logits)), "times_t" (of softmax(logits * T)), "past_end"
    (the mask True after the end too), "end_unmasked" (the end marker not in the mask), "shared" (one draw
    for the whole group)."""
    tokens = prompt.reshape(1, -1).repeat(group_size, 1)
    done = torch.zeros(group_size, dtype=torch.bool)
    completions = torch.full((group_size, max_new), stop)
    mask = torch.zeros(group_size, max_new, dtype=torch.bool)
    logprobs = torch.zeros(group_size, max_new)
    for i in range(max_new):
        logits = model(tokens)[:, -1].float()
        probs = (logits / temperature).softmax(-1)
        if slip == "shared":
            drawn = torch.multinomial(probs[:1], 1, generator=generator).expand(group_size, 1)[:, 0]
        else:
            drawn = torch.multinomial(probs, 1, generator=generator)[:, 0]
        scored = {"untempered": logits, "times_t": logits * temperature}.get(slip, logits / temperature)
        picked = scored.log_softmax(-1).gather(-1, drawn[:, None])[:, 0]
        live = ~done if slip != "past_end" else torch.ones_like(done)
        completions[:, i] = torch.where(done, stop, drawn)
        mask[:, i] = live & ~((drawn == stop) & (slip == "end_unmasked"))
        logprobs[:, i] = torch.where(live, picked, 0.0)
        done |= drawn == stop
        tokens = torch.cat([tokens, completions[:, i:i + 1]], 1)
        if done.all() and slip != "past_end":
            break
    return completions, mask, logprobs


@course_answer("reward")
def reward(completion: str, answer: str, slip: str = "") -> float:
    """1.0 when the completion is exactly the answer and the end-of-turn marker, else 0.0. `slip`:
    "end_optional" (the marker not required), "prefix" (any completion that starts with the answer)."""
    if slip == "end_optional":
        return float(completion.removesuffix(IM_END) == answer)
    if slip == "prefix":
        return float(completion.startswith(answer))
    return float(completion == answer + IM_END)


@course_answer("group_advantages")
def group_advantages(rewards: Tensor, scale: bool = True, slip: str = "") -> Tensor:
    """[n_groups, group_size]: each reward minus its group's mean, divided (scale=True, GRPO) by the
    group's standard deviation with Bessel's correction plus EPS, as trl computes it; scale=False is
    Dr. GRPO's form. `slip`: "batch" (the whole batch's mean and std), "no_eps", "population_std"
    (no Bessel's correction)."""
    dims = None if slip == "batch" else -1
    mean = rewards.mean(dims, keepdim=True) if dims is not None else rewards.mean()
    centred = rewards - mean
    if not scale:
        return centred.detach()
    std = rewards.std(dims, keepdim=True, correction=0 if slip == "population_std" else 1) if dims is not None \
        else rewards.std(correction=0 if slip == "population_std" else 1)
    return (centred / (std + (0.0 if slip == "no_eps" else EPS))).detach()


@course_answer("grpo_loss")
def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, advantages: Tensor, mask: Tensor,
              clip_eps: float, beta: float, token_level: bool = False, slip: str = "") -> Tensor:
    """The GRPO objective's negative (Shao et al. 2024, eq. 3) over completions [n, max_new]: per
    token -min(rho A, clip(rho, 1 - eps, 1 + eps) A) + beta k3, rho = pi / pi_old, k3 = pi_ref / pi -
    log(pi_ref / pi) - 1; a mean over each completion's tokens, then over the completions
    (token_level: one mean over every token of the batch). `slip`: "inverted" (pi_old / pi), "max",
    "clip_advantage", "k1" (log pi - log pi_ref), "kl_sign" (the KL subtracted), "padding" (every
    position counted), "all_tokens" (a token-level mean)."""
    old, adv, ref = old_logprobs.detach(), advantages.detach()[:, None], ref_logprobs.detach()
    ratio = torch.exp(old - logprobs) if slip == "inverted" else torch.exp(logprobs - old)
    if slip == "clip_advantage":
        clipped = ratio * adv.clamp(1 - clip_eps, 1 + clip_eps)
    else:
        clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    pick = torch.max if slip == "max" else torch.min
    surrogate = -pick(ratio * adv, clipped)
    kl = logprobs - ref if slip == "k1" else torch.exp(ref - logprobs) - (ref - logprobs) - 1
    per_token = surrogate + (-beta if slip == "kl_sign" else beta) * kl
    weight = torch.ones_like(mask, dtype=per_token.dtype) if slip == "padding" else mask.to(per_token.dtype)
    if token_level or slip == "all_tokens":
        return (per_token * weight).sum() / weight.sum().clamp(min=1)
    return ((per_token * weight).sum(-1) / weight.sum(-1).clamp(min=1)).mean()


@course_answer("train_grpo")
def completion_logprobs(model: nn.Module, prompt: Tensor, completions: Tensor, temperature: float) -> Tensor:
    """[group, max_new]: each completion token's log-probability under `model` at the temperature,
    from one forward pass over prompt + completion (position i's logits predict token i + 1)."""
    tokens = torch.cat([prompt.reshape(1, -1).expand(len(completions), -1), completions], 1)
    logits = model(tokens)[:, len(prompt) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, completions[..., None])[..., 0]


@course_answer("train_grpo")
def train_grpo(policy: nn.Module, reference: nn.Module, make_batch, n_steps: int, generator: torch.Generator,
               lr: float = RECIPE["lr"], beta: float = RECIPE["beta"], scale: bool = True) -> list[tuple[float, float]]:
    """GRPO with one update per sampled batch (pi_old is the policy that sampled), RECIPE's settings:
    each step, a group per prompt, rewards, group advantages, the loss, an AdamW step. Returns each
    step's (mean reward, mean per-token k3 KL to the reference)."""
    group_size, temperature, max_new = RECIPE["group_size"], RECIPE["temperature"], RECIPE["max_new"]
    stop = tasks.model_ids()[tasks.IM_END_ID]
    reference.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    history = []
    for _ in range(n_steps):
        batch = make_batch()
        policy.eval()
        groups = [(prompt, *sample_group(policy, prompt, group_size, temperature, max_new, stop, generator))
                  for prompt, _ in batch]
        rewards = torch.tensor([[reward(tasks.decode(c[m].tolist()), answer) for c, m in zip(completions, mask)]
                                for (_, answer), (_, completions, mask, _) in zip(batch, groups)])
        advantages = group_advantages(rewards, scale)
        policy.train()
        losses, kls = [], []
        for (prompt, completions, mask, old), adv in zip(groups, advantages):
            new = completion_logprobs(policy, prompt, completions, temperature)
            with torch.no_grad():
                ref = completion_logprobs(reference, prompt, completions, temperature)
            losses.append(grpo_loss(new, old, ref, adv, mask, RECIPE["clip_eps"], beta))
            kls.append(((torch.exp(ref - new) - (ref - new) - 1)[mask]).detach())
        loss = torch.stack(losses).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append((float(rewards.mean()), float(torch.cat(kls).mean())))
    return history
