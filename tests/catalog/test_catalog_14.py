"""Notebook 14's graders: correct variants (in other styles) pass, each catalogued mistake fails with
its name, unlisted ones are localised, and trl's GRPO computations agree with the judges' equations
(a test-only cross-check). Marked slow: the RL run (several seconds), the sampler's mistakes (each
a sampling of every catalogued variant) and the cross-checks with trl (its import alone takes seconds)."""
import types

import pytest
import torch

from graders.exercises import nb14
from catalog_helpers import fails_with

IM_END = "<|im_end|>"


# --- sample_group --------------------------------------------------------------------------------

def _sampler(kind="right"):
    @torch.no_grad()
    def sample_group(model, prompt, group_size, temperature, max_new, stop, generator):
        tokens = prompt[None].repeat(group_size, 1)
        done = torch.zeros(group_size, dtype=torch.bool)
        out = torch.full((group_size, max_new), stop)
        mask = torch.zeros(group_size, max_new, dtype=torch.bool)
        logps = torch.zeros(group_size, max_new)
        for i in range(max_new):
            logits = model(tokens)[:, -1]
            probs = torch.softmax(logits / temperature, -1)
            if kind == "shared":
                token = torch.multinomial(probs[:1], 1, generator=generator).repeat(group_size, 1)[:, 0]
            else:
                token = torch.multinomial(probs, 1, generator=generator)[:, 0]
            scored = {"untempered": logits, "times_t": logits * temperature}.get(kind, logits / temperature)
            logp = scored.log_softmax(-1)[torch.arange(group_size), token]
            live = torch.ones_like(done) if kind == "past_end" else ~done
            out[:, i] = torch.where(done, stop, token)
            mask[:, i] = live & ~((token == stop) & (kind == "end_unmasked"))
            logps[:, i] = torch.where(live, logp, torch.zeros(()))
            done = done | (token == stop)
            tokens = torch.cat([tokens, out[:, i:i + 1]], 1)
        if kind == "with_prompt":
            return tokens, torch.ones_like(tokens, dtype=torch.bool), logps
        return out, mask, logps
    return sample_group


def _sampler_with_early_exit():
    """Stops drawing once every completion has ended (the draws after it change nothing)."""
    @torch.no_grad()
    def sample_group(model, prompt, group_size, temperature, max_new, stop, generator):
        seqs = prompt.unsqueeze(0).expand(group_size, -1).clone()
        tokens, mask, logps = [], [], []
        alive = torch.ones(group_size, dtype=torch.bool)
        for _ in range(max_new):
            if not alive.any():
                tokens.append(torch.full((group_size,), stop))
                mask.append(torch.zeros(group_size, dtype=torch.bool))
                logps.append(torch.zeros(group_size))
                continue
            log_probs = torch.log_softmax(model(seqs)[:, -1] / temperature, dim=-1)
            token = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)
            token = torch.where(alive, token, torch.full_like(token, stop))
            tokens.append(token)
            mask.append(alive.clone())
            logps.append(torch.where(alive, log_probs.gather(1, token[:, None]).squeeze(1), torch.zeros(())))
            alive &= token != stop
            seqs = torch.cat([seqs, token[:, None]], 1)
        return torch.stack(tokens, 1), torch.stack(mask, 1), torch.stack(logps, 1)
    return sample_group


@pytest.mark.parametrize("learner", [_sampler(), _sampler_with_early_exit()])
def test_sample_group_correct_variants_pass(learner):
    nb14.check_sample_group(learner)
    nb14.check_sample_group(learner, seed=1)
    nb14.check_sample_group(learner, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("kind, expected", [
    ("untempered", "before the temperature is applied"),
    ("times_t", "multiplied by the temperature"),
    ("past_end", "tokens after <|im_end|> are left in the mask"),
    ("end_unmasked", "the end marker itself is not in the mask"),
    ("shared", "one draw is shared by the whole group"),
    ("with_prompt", "the prompt's tokens are counted"),
])
def test_sample_group_mistakes_are_named(kind, expected):
    fails_with(nb14.check_sample_group, _sampler(kind), expected=["Likely mistake", expected], seed=2)


@pytest.mark.slow
def test_a_sampler_with_another_draw_order_is_located_at_its_first_differing_token():
    @torch.no_grad()
    def row_by_row(model, prompt, group_size, temperature, max_new, stop, generator):
        rows = [_sampler()(model, prompt, 1, temperature, max_new, stop, generator) for _ in range(group_size)]
        return tuple(torch.cat(parts) for parts in zip(*rows))
    fails_with(nb14.check_sample_group, row_by_row, expected=["differs at position", "one torch.multinomial call"])


# --- reward ------------------------------------------------------------------------------------

def _reward(kind="right"):
    def reward(completion, answer):
        if kind == "end_optional":
            return 1.0 if completion.replace(IM_END, "") == answer else 0.0
        if kind == "prefix":
            return float(completion.startswith(answer))
        if kind == "stripped":
            return float(completion.strip() == answer + IM_END)
        if kind == "bool":
            return completion == f"{answer}{IM_END}"
        return 1.0 if completion.endswith(IM_END) and completion[:-len(IM_END)] == answer else 0.0
    return reward


@pytest.mark.parametrize("kind", ["right", "bool"])
def test_reward_correct_variants_pass(kind):
    nb14.check_reward(_reward(kind))
    nb14.check_reward(_reward(kind), seed=1)


@pytest.mark.parametrize("kind, expected", [
    ("end_optional", "the model is never taught to stop"),
    ("prefix", "a prefix match"),
    ("stripped", "no stripping"),
])
def test_reward_mistakes_are_named(kind, expected):
    fails_with(nb14.check_reward, _reward(kind), expected=expected)


# --- group_advantages ------------------------------------------------------------------------------

def _advantages(kind="right"):
    def group_advantages(rewards, scale=True):
        if kind == "loops":
            out = torch.empty_like(rewards)
            for g, row in enumerate(rewards):
                mean = sum(row.tolist()) / len(row)
                std = (sum((x - mean) ** 2 for x in row.tolist()) / (len(row) - 1)) ** 0.5
                out[g] = (row - mean) / (std + 1e-4) if scale else row - mean
            return out
        axis = None if kind == "batch" else 1
        mean = rewards.mean() if axis is None else rewards.mean(axis, keepdim=True)
        centred = rewards - mean
        if not scale:
            return centred
        unbiased = kind != "population_std"
        std = rewards.std(unbiased=unbiased) if axis is None else rewards.std(axis, keepdim=True, unbiased=unbiased)
        return centred / (std + (0 if kind == "no_eps" else 1e-4))
    return group_advantages


@pytest.mark.parametrize("kind", ["right", "loops"])
def test_group_advantages_correct_variants_pass(kind):
    nb14.check_group_advantages(_advantages(kind))
    nb14.check_group_advantages(_advantages(kind), seed=1, batch=4)


@pytest.mark.parametrize("kind, expected", [
    ("batch", "normalised over the whole batch"),
    ("no_eps", "no epsilon in the denominator"),
    ("population_std", "without Bessel's correction"),
])
def test_group_advantages_mistakes_are_named(kind, expected):
    fails_with(nb14.check_group_advantages, _advantages(kind), expected=["Likely mistake", expected])


@pytest.mark.slow
def test_the_advantages_follow_trl_in_both_scalings():
    """trl 1.16's group advantage (GRPOTrainer._generate_and_score_completions, its nanstd helper),
    on a flattened batch of groups: the judge's equation, Bessel's correction and 1e-4 included."""
    from trl.trainer.utils import nanstd

    from graders.exercises.nb14 import reference as ref

    rewards = torch.tensor([[1.0, 0, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0]], dtype=torch.float64)
    flat, g = rewards.flatten(), rewards.shape[1]
    mean = flat.view(-1, g).nanmean(1).repeat_interleave(g)
    std = nanstd(flat.view(-1, g), dim=1).repeat_interleave(g)
    trl_group, trl_none = (flat - mean) / (std + 1e-4), flat - mean
    torch.testing.assert_close(ref.group_advantages(rewards, True).flatten(), trl_group)
    torch.testing.assert_close(ref.group_advantages(rewards, False).flatten(), trl_none)


# --- grpo_loss ---------------------------------------------------------------------------------------

def _loss(kind="right"):
    def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta, token_level=False):
        old = old_logprobs if kind == "old_attached" else old_logprobs.detach()
        adv = advantages if kind == "advantage_attached" else advantages.detach()
        ref = ref_logprobs.detach()
        ratio = torch.exp(old - logprobs) if kind == "inverted" else torch.exp(logprobs - old)
        a = adv.unsqueeze(-1)
        if kind == "clip_advantage":
            second = ratio * a.clamp(1 - clip_eps, 1 + clip_eps)
        else:
            second = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a
        surrogate = torch.maximum(ratio * a, second) if kind == "max" else torch.minimum(ratio * a, second)
        d = ref - logprobs
        kl = -d if kind == "k1" else d.exp() - d - 1
        per_token = -surrogate + (-beta if kind == "kl_sign" else beta) * kl
        m = torch.ones_like(mask, dtype=per_token.dtype) if kind == "padding" else mask.to(per_token.dtype)
        if token_level or kind == "all_tokens":
            return (per_token * m).sum() / m.sum()
        return ((per_token * m).sum(-1) / m.sum(-1)).mean()
    return grpo_loss


def _loss_einsum_loop(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta, token_level=False):
    """Another style: a loop over completions, boolean indexing of each one's tokens."""
    per_completion, tokens = [], []
    for lp, old, ref, a, m in zip(logprobs, old_logprobs.detach(), ref_logprobs.detach(), advantages.detach(), mask):
        lp, old, ref = lp[m], old[m], ref[m]
        rho = (lp - old).exp()
        term = -torch.min(rho * a, rho.clamp(1 - clip_eps, 1 + clip_eps) * a)
        term = term + beta * (torch.exp(ref - lp) - (ref - lp) - 1)
        per_completion.append(term.mean())
        tokens.append(term)
    return torch.cat(tokens).mean() if token_level else torch.stack(per_completion).mean()


@pytest.mark.parametrize("learner", [_loss(), _loss_einsum_loop])
def test_grpo_loss_correct_variants_pass(learner):
    nb14.check_grpo_loss(learner)
    nb14.check_grpo_loss(learner, seed=1, batch=4, seq=7)


@pytest.mark.parametrize("kind, expected", [
    ("inverted", "the ratio is inverted"),
    ("max", "max where the objective takes the min"),
    ("clip_advantage", "the advantage is clipped instead of the ratio"),
    ("k1", "the KL term is k1"),
    ("kl_sign", "the KL penalty is subtracted"),
    ("padding", "the padding is counted"),
    ("all_tokens", "a mean over all the batch's tokens"),
    ("old_attached", "the old policy's log-probs are not detached"),
    ("advantage_attached", "the advantage is not detached"),
])
def test_grpo_loss_mistakes_are_named(kind, expected):
    fails_with(nb14.check_grpo_loss, _loss(kind), expected=["Likely mistake", expected])


class _StandInGRPO:
    """What trl's GRPOTrainer._compute_loss reads of its trainer, the policy's log-probs handed in."""

    def __init__(self, logprobs, loss_type, beta, clip_eps):
        from collections import defaultdict

        self.logprobs, self.loss_type, self.beta = logprobs, loss_type, beta
        self.epsilon_low = self.epsilon_high = clip_eps
        self.args = types.SimpleNamespace(use_bias_correction_kl=False, delta=None)
        self.top_entropy_quantile, self.off_policy_mask_threshold = 1.0, None
        self.importance_sampling_level, self.use_vllm, self.aux_loss_enabled = "token", False, False
        self._entropy_bonus_enabled, self.current_gradient_accumulation_steps = False, 1
        self.model = types.SimpleNamespace(training=True)
        self._metrics = {"train": defaultdict(list)}
        self.accelerator = types.SimpleNamespace(
            reduce=lambda t, reduction: t, gather=lambda t: t, gather_for_metrics=lambda t: t)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return self.logprobs, torch.zeros_like(self.logprobs), None


@pytest.mark.slow
@pytest.mark.parametrize("loss_type, token_level", [("grpo", False), ("bnpo", True)])
def test_the_loss_is_trls_grpo_loss(loss_type, token_level):
    """trl 1.16's GRPOTrainer._compute_loss, loss_type "grpo" (each completion's mean, then theirs)
    and "bnpo" (one mean over the batch's tokens), is the judge's equation."""
    from trl import GRPOTrainer

    from graders.exercises.nb14 import loss, reference as ref

    case = nb14.check_grpo_loss.__self__.case() if hasattr(nb14.check_grpo_loss, "__self__") else None
    case = case or loss.exercise.case()
    new, old, reference, advantages, mask = loss.loss_inputs(case)
    stand_in = _StandInGRPO(new, loss_type, beta=0.04, clip_eps=0.2)
    inputs = {"prompt_ids": torch.zeros(len(new), 1, dtype=torch.long), "prompt_mask": torch.ones(len(new), 1),
              "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask.double(),
              "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": reference}
    theirs = GRPOTrainer._compute_loss(stand_in, None, inputs)
    torch.testing.assert_close(ref.grpo_loss(new, old, reference, advantages, mask, 0.2, 0.04, token_level), theirs)


# --- train_grpo (slow: a run of 60 steps) -------------------------------------------------------------

def _train(kind="right"):
    def train_grpo(policy, reference, make_batch, n_steps, generator, lr=5e-4, beta=0.04):
        from graders.exercises.nb13 import tasks

        stop = tasks.model_ids()[tasks.IM_END_ID]
        reference.requires_grad_(False)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
        history = []
        for _ in range(n_steps):
            batch = make_batch()
            policy.eval()
            groups = [sample_group(policy, prompt, 8, 1.0, 4, stop, generator) for prompt, _ in batch]  # noqa: F821 (the course's)
            rewards = torch.tensor([[reward(tasks.decode(c[m].tolist()), answer) for c, m in zip(comp, mask)]  # noqa: F821
                                    for (_, answer), (comp, mask, _) in zip(batch, groups)])
            advantages = group_advantages(rewards, True)  # noqa: F821 (the course's)
            policy.train()
            losses, kls = [], []
            for (prompt, _), (comp, mask, old), adv in zip(batch, groups, advantages):
                tokens = torch.cat([prompt.expand(len(comp), -1), comp], 1)
                logits = policy(tokens)[:, len(prompt) - 1:-1]
                new = logits.log_softmax(-1).gather(-1, comp[..., None])[..., 0]
                with torch.no_grad():
                    ref = reference(tokens)[:, len(prompt) - 1:-1].log_softmax(-1).gather(-1, comp[..., None])[..., 0]
                losses.append(grpo_loss(new, old, ref, adv, mask, 0.2, beta))  # noqa: F821 (the course's)
                kls.append((torch.exp(ref - new) - (ref - new) - 1)[mask].detach())
            loss = torch.stack(losses).mean()
            optimizer.zero_grad()
            loss.backward()
            if kind == "gradients_dropped":
                optimizer.zero_grad()
            optimizer.step()
            history.append((rewards.mean().item(), torch.cat(kls).mean().item()))
        return history
    return train_grpo


@pytest.mark.slow
def test_train_grpo_solution_passes():
    nb14.check_train_grpo(_train())


@pytest.mark.slow
def test_a_run_that_never_steps_fails_on_held_out_accuracy():
    fails_with(nb14.check_train_grpo, _train("gradients_dropped"), expected="held-out accuracy did not rise enough")
