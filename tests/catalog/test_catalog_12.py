"""Notebook 12's graders: correct variants (in other styles) pass, each catalogued mistake fails with
its name, an unlisted one is localised, and the library versions are refused."""
import functools
import queue
import threading

import nbformat
import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb12
from graders.layout import SOLUTIONS
from graders.judging.compare import CheckFailed
from catalog_helpers import fails_with


# --- cross_entropy -----------------------------------------------------------------------------

def _loss(kind="right"):
    def cross_entropy(logits, targets, ignore_index=-100):
        x = logits.double() if kind == "float64" else logits if kind == "bf16" else logits.float()
        keep = targets != ignore_index
        safe = targets if kind == "no_mask" else targets.where(keep, 0)
        m = x.max() if kind == "global_max" else x.amin(-1, keepdim=True) if kind == "min_shift" \
            else x.max(dim=-1, keepdim=True).values
        lse = (x.exp().sum(-1).log() if kind == "no_shift" else (x - m).exp().sum(-1).log() if kind == "not_back"
               else m.squeeze(-1) + (x - m).exp().sum(-1).log())
        if kind == "log_of_softmax":     # a softmax written out (torch's softmax is refused)
            e = (x - x.amax(-1, keepdim=True)).exp()
            losses = -(e / e.sum(-1, keepdim=True)).gather(-1, safe[..., None])[..., 0].log()
        elif kind == "vocab_mean":
            losses = -(x - lse[..., None]).mean(-1)
        else:
            losses = lse - x.gather(-1, safe[..., None])[..., 0]
        if kind == "boolean_index":
            return losses[keep].mean()
        losses = losses * keep
        found = {"padding_counted": losses.mean(), "mean_of_means": (losses.sum(-1) / keep.sum(-1)).mean(),
                 "batch_mean": losses.sum(-1).mean(), "per_position": losses.sum(0) / keep.sum()}
        return found.get(kind, losses.sum() / keep.sum()).float() if kind != "bf16" else losses.sum() / keep.sum()
    return cross_entropy


@pytest.mark.parametrize("kind", ["right", "float64", "boolean_index"])
def test_cross_entropy_correct_variants_pass(kind):
    nb12.check_cross_entropy(_loss(kind))
    nb12.check_cross_entropy(_loss(kind), seed=1, batch=2, seq=11)


@pytest.mark.parametrize("kind, expected", [
    ("no_shift", "Likely mistake: exp without the max-shift"),
    ("log_of_softmax", "Likely mistake: the log of a softmax"),
    ("global_max", "Likely mistake: the shift is the max of the whole tensor"),
    ("min_shift", "Likely mistake: the shift is each row's minimum"),
    ("not_back", "Likely mistake: the max is subtracted but not added back"),
    ("padding_counted", "Likely mistake: the padding positions are counted"),
    ("mean_of_means", "Likely mistake: a mean of each sequence's mean"),
    ("batch_mean", "Likely mistake: the mean is over the batch only"),
    ("vocab_mean", "Likely mistake: the mean over the vocabulary axis"),
    ("per_position", "Likely mistake: the mean is taken over one axis only"),
    ("no_mask", "Likely mistake: the ignore index is not honoured"),
    ("bf16", "Likely mistake: the loss is computed in bfloat16"),
])
def test_cross_entropy_mistakes_are_named(kind, expected):
    fails_with(nb12.check_cross_entropy, _loss(kind), expected=expected)


def test_cross_entropy_unlisted_mistakes_are_named_from_how_the_losses_relate():
    def base_two(logits, targets, ignore_index=-100):
        return _loss()(logits, targets, ignore_index) / torch.log(torch.tensor(2.0))

    def halved(logits, targets, ignore_index=-100):
        return _loss()(logits, targets, ignore_index) / 2

    def plus_log_vocab(logits, targets, ignore_index=-100):
        return _loss()(logits, targets, ignore_index) + torch.log(torch.tensor(float(logits.shape[-1])))
    fails_with(nb12.check_cross_entropy, base_two, expected="a logarithm in base 2")
    fails_with(nb12.check_cross_entropy, halved, expected="0.5 times F.cross_entropy's on every input")
    fails_with(nb12.check_cross_entropy, plus_log_vocab, expected="plus 3.912 on every input")


def test_cross_entropy_unlisted_mistakes_are_localised_to_a_position():
    def target_shifted(logits, targets, ignore_index=-100):      # the next token's logit picked
        x, keep = logits.float(), targets != ignore_index
        m = x.amax(-1, keepdim=True)
        picked = x.gather(-1, ((targets + 1) % x.shape[-1]).where(keep, 0)[..., None])[..., 0]
        return ((m[..., 0] + (x - m).exp().sum(-1).log() - picked) * keep).sum() / keep.sum()

    def weighted(logits, targets, ignore_index=-100):           # later positions weigh more
        x, keep = logits.float(), targets != ignore_index
        m = x.amax(-1, keepdim=True)
        losses = m[..., 0] + (x - m).exp().sum(-1).log() - x.gather(-1, targets.where(keep, 0)[..., None])[..., 0]
        weights = 1 + torch.arange(targets.shape[1]) / 10
        return (losses * keep * weights).sum() / keep.sum()
    fails_with(nb12.check_cross_entropy, target_shifted,
               expected=["position 0 of sequence 0 alone", "the first position whose own loss is wrong"])
    fails_with(nb12.check_cross_entropy, weighted,
               expected="every real position alone gives F.cross_entropy's loss")


def test_a_hard_coded_ignore_index_fails_the_hidden_case():
    def cross_entropy(logits, targets, ignore_index=-100):
        return _loss()(logits, targets)          # ignore_index not passed on: always -100
    nb12.check_cross_entropy(cross_entropy)
    fails_with(nb12.check_cross_entropy, cross_entropy, seed=1, expected="ignore_index=-1")


@pytest.mark.parametrize("body, word", [
    (lambda x, t, i: F.cross_entropy(x.flatten(0, 1).float(), t.flatten(), ignore_index=i), "cross_entropy"),
    (lambda x, t, i: (torch.logsumexp(x.float(), -1) - x.float().gather(-1, t.clamp(min=0)[..., None])[..., 0])
     [t != i].mean(), "logsumexp"),
    (lambda x, t, i: -x.float().log_softmax(-1).gather(-1, t.clamp(min=0)[..., None])[..., 0][t != i].mean(),
     "log_softmax"),
])
def test_cross_entropy_library_versions_are_refused(body, word):
    fails_with(nb12.check_cross_entropy, body, expected=word)


# --- AdamW -------------------------------------------------------------------------------------

def _adamw(mistake=None, style="inplace"):
    class AdamW(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=None, eps=1e-8, weight_decay=1e-2):
            betas = betas or ((0.9, 0.99) if mistake == "defaults" else (0.9, 0.999))
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
            self.count = 0

        def step(self, closure=None):
            if mistake == "grad_mode":
                return self._step()
            with torch.no_grad():
                return self._step()

        def _step(self):
            self.count += 1
            for group in self.param_groups:
                beta1, beta2 = group["betas"]
                if mistake == "betas_swapped":
                    beta1, beta2 = beta2, beta1
                lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
                if mistake == "default_decay":
                    wd = self.defaults["weight_decay"]
                for p in group["params"]:
                    if mistake == "counts_skipped" and p.grad is None:   # counted, then skipped
                        self.state[p]["step"] = self.state[p].get("step", 0) + 1
                    if p.grad is None and mistake != "none_grads":
                        continue
                    g = p.grad + wd * p if mistake == "l2" else p.grad
                    state = self.state[p]
                    if "exp_avg" not in state:
                        state.update(step=torch.tensor(float(state.get("step", 0))), exp_avg=torch.zeros_like(p),
                                     exp_avg_sq=torch.zeros_like(p))
                    t = float(state["step"]) if mistake == "from_zero" else None
                    state["step"] += 1
                    t = self.count if mistake == "optimizer_step" else t if t is not None else float(state["step"])
                    if style == "float64":
                        m = beta1 * state["exp_avg"].double() + (1 - beta1) * g.double()
                        v = beta2 * state["exp_avg_sq"].double() + (1 - beta2) * g.double() ** 2
                        state["exp_avg"].copy_(m)
                        state["exp_avg_sq"].copy_(v)
                        update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps)
                        p.data = (p.double() * (1 - lr * wd) - lr * update).float()
                        continue
                    state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
                    state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    m_hat, v_hat = state["exp_avg"], state["exp_avg_sq"]
                    if mistake != "no_correction":
                        m_hat, v_hat = m_hat / (1 - beta1 ** t), v_hat / (1 - beta2 ** t)
                    denominator = (v_hat + eps).sqrt() if mistake == "eps_inside" else v_hat.sqrt() + eps
                    if mistake == "eps_uncorrected":      # Kingma & Ba's "efficient" ordering
                        m_hat = state["exp_avg"] * (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t)
                        denominator = state["exp_avg_sq"].sqrt() + eps
                    if mistake == "amsgrad":
                        state["max_v"] = torch.maximum(state.get("max_v", state["exp_avg_sq"]), state["exp_avg_sq"])
                        denominator = (state["max_v"] / (1 - beta2 ** t)).sqrt() + eps
                    if mistake == "rebind":
                        p = p * (1 - lr * wd) - lr * m_hat / denominator
                        continue
                    if mistake == "rebind_update":                 # unlisted: the decay in place, the update not
                        p.mul_(1 - lr * wd)
                        p = p - lr * m_hat / denominator
                        continue
                    if mistake not in ("l2", "decay_after", "no_decay"):
                        p.mul_(1 - (wd if mistake == "unscaled_decay" else lr * wd))
                    p.addcdiv_(m_hat, denominator, value=lr if mistake == "sign" else
                               -2 * lr if mistake == "double_rate" else -lr)
                    if mistake == "decay_after":
                        p.mul_(1 - lr * wd)
    return AdamW


def _explicit_adamw():
    """Another style: one formula per line, the step count an int, parameters updated through .data."""
    class AdamW(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

        def step(self, closure=None):
            for group in self.param_groups:
                (b1, b2), lr = group["betas"], group["lr"]
                for p in (p for p in group["params"] if p.grad is not None):
                    s = self.state[p]
                    s.setdefault("exp_avg", torch.zeros_like(p.data))
                    s.setdefault("exp_avg_sq", torch.zeros_like(p.data))
                    s["step"] = s.get("step", 0) + 1
                    s["exp_avg"] = b1 * s["exp_avg"] + (1 - b1) * p.grad.data
                    s["exp_avg_sq"] = b2 * s["exp_avg_sq"] + (1 - b2) * p.grad.data ** 2
                    m_hat = s["exp_avg"] / (1 - b1 ** s["step"])
                    v_hat = s["exp_avg_sq"] / (1 - b2 ** s["step"])
                    p.data = p.data - lr * group["weight_decay"] * p.data - lr * m_hat / (v_hat.sqrt() + group["eps"])
    return AdamW


@pytest.mark.parametrize("cls", [_adamw(), _adamw(style="float64"), _explicit_adamw()])
def test_adamw_correct_variants_pass(cls):
    nb12.check_adamw(cls)
    nb12.check_adamw(cls, seed=1)


@pytest.mark.parametrize("mistake, expected", [
    ("l2", "Likely mistake: L2 decay added to the gradient"),
    ("no_correction", "Likely mistake: no bias correction"),
    ("from_zero", "Likely mistake: the bias correction counts from step 0"),
    ("eps_inside", "Likely mistake: eps inside the square root"),
    ("eps_uncorrected", "Likely mistake: eps is added to sqrt(v) before the bias correction"),
    ("unscaled_decay", "Likely mistake: the weight decay is not scaled by the learning rate"),
    ("optimizer_step", "Likely mistake: the step count is kept per optimizer"),
    ("counts_skipped", "Likely mistake: the step count is kept per optimizer"),
    ("none_grads", "Likely mistake: parameters without a gradient are not skipped"),
    ("grad_mode", "Likely mistake: step() is not under torch.no_grad()"),
    ("betas_swapped", ["from step 2 of 10", "exp_avg and exp_avg_sq differ at that step", "step 1 was right"]),
    ("default_decay", "only parameters of the group without weight decay differ"),
    ("rebind", ["from step 1 of 10", "the moments exp_avg and exp_avg_sq are right: the update"]),
])
def test_adamw_mistakes_are_named(mistake, expected):
    fails_with(nb12.check_adamw, _adamw(mistake), expected=expected)


@pytest.mark.parametrize("mistake, expected", [
    ("decay_after", "Likely mistake: the weights are decayed after the Adam update"),
    ("amsgrad", "Likely mistake: the denominator uses the largest v so far"),
])
def test_adamw_mistakes_the_hidden_case_tells_apart_are_named(mistake, expected):
    """Decaying after the update changes a step by lr**2 * weight_decay * update, and AMSGrad's max by
    little while v barely shrinks: beyond the tolerance with the hidden case's rate, decay and beta2."""
    fails_with(nb12.check_adamw, _adamw(mistake), seed=1, expected=expected)


@pytest.mark.parametrize("mistake, expected", [    # mistakes no catalog lists, named from the update's parts
    ("sign", "Likely mistake: the Adam update has the wrong sign at step 1"),
    ("no_decay", "Likely mistake: the Adam update is right at step 2, but the weights are not decayed"),
    ("double_rate", "Likely mistake: the Adam update is 2 times torch's at step 1"),
    ("rebind_update", "Likely mistake: only the weight decay reaches the parameters at step 1"),
    ("rebind", "Likely mistake: the parameters do not change at step 1"),
])
def test_adamw_unlisted_mistakes_are_named_from_the_update(mistake, expected):
    fails_with(nb12.check_adamw, _adamw(mistake), expected=expected)


def test_adamw_defaults_and_settings_are_read():
    nb12.check_adamw(_adamw("defaults"), seed=1)      # betas passed explicitly: the defaults unused
    fails_with(nb12.check_adamw, _adamw("defaults"), expected="only v: look at beta2")


def test_adamw_shared_moments_and_a_cached_rate_are_named():
    class Shared(_adamw()):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.by_shape = {}

        def _step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p] = self.by_shape.setdefault(tuple(p.shape), self.state[p])
            return super()._step()

    class CachedRate(_adamw()):
        def __init__(self, params, lr=1e-3, **kwargs):
            super().__init__(params, lr=lr, **kwargs)
            self.rate = lr

        def _step(self):
            for group in self.param_groups:
                group["lr"] = self.rate
            return super()._step()
    fails_with(nb12.check_adamw, Shared, expected="Likely mistake: the moments are shared between parameters")
    fails_with(nb12.check_adamw, CachedRate, expected="Likely mistake: the learning rate is read once")


def test_adamw_state_under_other_names_fails_after_right_updates():
    class OtherNames(_adamw()):
        def _step(self):
            super()._step()
            for state in self.state.values():
                state["m"] = state.pop("exp_avg")

        def _restore(self):
            for state in self.state.values():
                state["exp_avg"] = state.pop("m")

        def step(self, closure=None):
            self._restore()
            return super().step()
    fails_with(nb12.check_adamw, OtherNames, expected="optimizer.state[p]['exp_avg'] is missing")


def test_torch_adam_is_refused():
    class Subclass(torch.optim.AdamW):
        pass

    class Calls(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
            self.inner = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

        def step(self, closure=None):
            self.inner.param_groups = self.param_groups
            self.inner.step()
    fails_with(nb12.check_adamw, Subclass, expected="subclasses torch.optim.Adam")
    fails_with(nb12.check_adamw, Calls, expected="Adam")


# --- clip_grad_norm ----------------------------------------------------------------------------

def _clip(kind="right"):
    def clip_grad_norm(parameters, max_norm):
        if kind == "twice":
            grads = (p.grad for p in parameters if p.grad is not None)
            params = parameters
        else:
            params = [p for p in parameters if p.grad is not None]
            grads = [p.grad for p in params]
        if kind == "float64":
            total = sum(g.double().pow(2).sum() for g in grads) ** 0.5
        elif kind == "foreach":
            total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        elif kind == "twice":
            total = sum(float(g.pow(2).sum()) for g in grads) ** 0.5
        elif kind == "l1":
            total = sum(g.abs().sum() for g in grads)
        elif kind == "summed":
            total = sum(g.norm() for g in grads)
        else:
            total = torch.stack([g.norm() for g in grads]).norm()
        for p in params:
            if p.grad is None:
                continue
            own = p.grad.norm()
            coef = max_norm / ((own if kind == "per_parameter" else total) + 1e-6)
            if kind == "clamped":
                p.grad.mul_(torch.clamp(torch.as_tensor(coef), max=1.0))
            elif kind == "inverted":
                p.grad.mul_(1 / coef) if coef < 1 else None
            elif kind == "sqrt":                   # unlisted: the square root of the coefficient
                p.grad.mul_(coef ** 0.5) if coef < 1 else None
            elif kind == "always" or coef < 1:
                p.grad.mul_(coef * coef if kind == "squared" else coef)
        if kind == "after":
            return torch.stack([p.grad.norm() for p in params]).norm()
        return total
    return clip_grad_norm


@pytest.mark.parametrize("kind", ["right", "float64", "clamped"])
def test_clip_correct_variants_pass(kind):
    nb12.check_clip_grad_norm(_clip(kind))
    nb12.check_clip_grad_norm(_clip(kind), seed=1)


@pytest.mark.parametrize("kind, expected", [
    ("per_parameter", "Likely mistake: each parameter is clipped by its own norm"),
    ("always", "Likely mistake: the gradients are scaled up when their norm is below max_norm"),
    ("after", "Likely mistake: the norm is returned after clipping"),
    ("twice", "may be a generator (model.parameters())"),
    ("squared", ["gradients differ from clip_grad_norm_'s", "scaled down by", "Likely mistake: every gradient is "
                 "scaled by one factor", "the square of clip_grad_norm_'s"]),
    ("sqrt", "the square root of clip_grad_norm_'s"),
    ("inverted", "Likely mistake: the coefficient is inverted"),
    ("l1", "Likely mistake: the norm is the L1 norm"),
    ("summed", "Likely mistake: the total norm is the sum of each parameter's norm"),
])
def test_clip_mistakes_are_named(kind, expected):
    fails_with(nb12.check_clip_grad_norm, _clip(kind), expected=expected)


def test_clip_library_version_is_refused():
    fails_with(nb12.check_clip_grad_norm, lambda params, max_norm: torch.nn.utils.clip_grad_norm_(params, max_norm),
               expected="clip_grad_norm_")


# --- training_state_bytes ----------------------------------------------------------------------

def _state_bytes(kind="right"):
    def training_state_bytes(model, mixed_precision):
        params = list(model.parameters())
        trained = [p for p in params if p.requires_grad or kind == "frozen"]
        half = mixed_precision and kind.startswith("bf16")
        sizes = {"parameters": sum(p.nbytes for p in params) // (2 if half and kind == "bf16_weights" else 1),
                 "gradients": sum(p.numel() * 4 for p in trained) // (2 if half and kind == "bf16_grads" else 1)}
        sizes["adam_moments"] = sum(2 * p.nbytes for p in trained) // (2 if kind == "one_moment" else 1)
        return {key: torch.tensor(value) if kind == "tensors" else value for key, value in sizes.items()}
    return training_state_bytes


@pytest.mark.parametrize("kind", ["right", "tensors"])
def test_training_state_bytes_correct_variants_pass(kind):
    nb12.check_training_state_bytes(_state_bytes(kind))
    nb12.check_training_state_bytes(_state_bytes(kind), seed=1, batch=3, seq=5)


@pytest.mark.parametrize("kind, expected", [
    ("frozen", "Likely mistake: the frozen parameters get gradients here"),
    ("one_moment", "Likely mistake: one moment is counted"),
    ("bf16_weights", "Likely mistake: the master weights are counted in bfloat16 under mixed precision"),
    ("bf16_grads", "Likely mistake: the gradients are counted in bfloat16 under mixed precision"),
])
def test_training_state_bytes_mistakes_are_named(kind, expected):
    fails_with(nb12.check_training_state_bytes, _state_bytes(kind), expected=expected)


# --- saved_activation_bytes ---------------------------------------------------------------------

def _measure(kind="right"):
    def saved_activation_bytes(model, *inputs):
        parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        by_storage, every = {}, []

        def pack(t):
            storage = t.untyped_storage()
            every.append((storage.data_ptr(), storage.nbytes(), t.numel() * t.element_size(), t.element_size(),
                          any(t is p for p in model.parameters()), t.data_ptr()))
            return None if kind == "pack_none" else t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = model(*inputs)
        del output
        if kind == "own_address":
            return sum({address: own for ptr, _, own, _, _, address in every if ptr not in parameters}.values())
        for ptr, nbytes, own, element, is_parameter, _ in every:
            counted = not is_parameter if kind == "identity" else kind == "parameters" or ptr not in parameters
            if counted:
                by_storage[ptr] = nbytes // element * (4 if kind == "four_bytes" else 1) \
                    if kind in ("numbers", "four_bytes") else nbytes
        if kind == "repeats":
            return sum(nbytes for ptr, nbytes, *_ in every if ptr not in parameters)
        if kind == "naive":
            return sum(own for _, _, own, *_ in every)
        if kind == "tensor":
            return torch.tensor(sum(by_storage.values()))
        return 0 if kind == "outside" else sum(by_storage.values())
    return saved_activation_bytes


@pytest.mark.parametrize("kind", ["right", "tensor"])
def test_saved_activation_bytes_correct_variants_pass(kind):
    nb12.check_saved_activation_bytes(_measure(kind))
    nb12.check_saved_activation_bytes(_measure(kind), seed=1, batch=3, seq=5)


@pytest.mark.parametrize("kind, expected", [
    ("repeats", "Likely mistake: a storage saved twice is counted twice"),
    ("numbers", "Likely mistake: numbers are counted, not bytes"),
    ("parameters", "Likely mistake: the model's parameters are counted"),
    ("naive", "Likely mistake: every saved tensor is counted at its own size"),
    ("outside", "Likely mistake: nothing was recorded"),
    ("four_bytes", "Likely mistake: every number is counted as 4 bytes"),
    ("identity", "Likely mistake: parameters are told apart by identity"),
    ("pack_none", "Likely mistake: the pack hook returns None"),
])
def test_saved_activation_bytes_mistakes_are_named(kind, expected):
    fails_with(nb12.check_saved_activation_bytes, _measure(kind), expected=expected)


def test_counting_saved_tensors_by_their_own_address_and_size_fails_on_a_partial_view():
    """The course's modules save no partial view, so that count passes the visible check; the
    hidden one saves a view that shows three quarters of its storage, and names the mistake."""
    nb12.check_saved_activation_bytes(_measure("own_address"))
    fails_with(nb12.check_saved_activation_bytes, _measure("own_address"), seed=1, batch=3, seq=5,
               expected="Likely mistake: each saved tensor is counted by its own address and size")


# --- checkpoints -------------------------------------------------------------------------------

def _save(path, model, optimizer, step, generator, *, optimizer_state=True, data_rng=True, torch_rng=True):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer_state else None,
                "step": step, "generator": generator.get_state() if data_rng else None,
                "rng": torch.get_rng_state() if torch_rng else None}, path)


def _load(path, model, optimizer, generator, *, optimizer_state=True, data_rng=True, torch_rng=True, train=True,
          step=True, weights=True, swapped=False):
    saved = torch.load(path)
    if swapped:
        saved["generator"], saved["rng"] = saved["rng"], saved["generator"]
    if weights:
        model.load_state_dict(saved["model"])
    if optimizer_state:
        optimizer.load_state_dict(saved["optimizer"])
    if data_rng:
        generator.set_state(saved["generator"])
    if torch_rng:
        torch.set_rng_state(saved["rng"])
    if train:
        model.train()
    if step in ("+1", "-1"):
        return saved["step"] + int(step)
    return saved["step"] if step is True else step      # step=0: not restored; step=5: always 5


def _pair(**mistake):
    saving = {k: v for k, v in mistake.items() if k in ("optimizer_state", "data_rng", "torch_rng")}
    return functools.partial(_save, **saving), functools.partial(_load, **mistake)


def test_checkpoints_correct_variants_pass():
    def save_parts(path, model, optimizer, step, generator):     # another style: the training flag saved
        torch.save([model.state_dict(), optimizer.state_dict(), step, generator.get_state(),
                    torch.random.get_rng_state(), True], path)

    def load_parts(path, model, optimizer, generator):
        weights, opt, step, data, rng, training = torch.load(path, weights_only=True)
        model.load_state_dict(weights)
        optimizer.load_state_dict(opt)
        generator.set_state(data)
        torch.random.set_rng_state(rng)
        model.train(training)
        return step
    for save, load in (_pair(), (save_parts, load_parts)):
        nb12.check_checkpoints(save, load)
    nb12.check_checkpoints(*_pair(), seed=2)


def test_the_step_load_checkpoint_returns_may_be_an_int_or_a_tensor_as_the_text_says():
    save, load = _pair()
    nb12.check_checkpoints(save, lambda *args: torch.tensor(load(*args)))
    posed = "\n".join(c.source for c in nbformat.read(SOLUTIONS / "12_training_step.ipynb", as_version=4).cells
                      if c.cell_type == "markdown")
    assert "returns the step to resume from: the next step to run" in posed
    assert "a one-element integer tensor" in posed and "or a\n  one-element tensor, as `torch.optim.AdamW`" in posed


@pytest.mark.parametrize("mistake, expected", [
    (dict(optimizer_state=False), "Likely mistake: the optimizer's state is not restored"),
    (dict(data_rng=False), "Likely mistake: the data generator is not restored"),
    (dict(step=0), "Likely mistake: the step is not restored, so the schedule restarts"),
    (dict(train=False), "Likely mistake: the model is left in eval mode after loading"),
    (dict(torch_rng=False), "Likely mistake: torch's global random generator is not restored"),
    (dict(weights=False), "Likely mistake: the model's weights are not restored"),
    (dict(step="+1"), "Likely mistake: the step is off by one"),
    (dict(step="-1"), "Likely mistake: the step is off by one"),
    (dict(swapped=True), "Likely mistake: the two generators' states are swapped"),
])
def test_checkpoint_mistakes_are_named(mistake, expected):
    fails_with(nb12.check_checkpoints, *_pair(**mistake), expected=expected)


def test_a_load_that_returns_a_fixed_step_fails_the_hidden_case():
    nb12.check_checkpoints(*_pair(step=5))
    fails_with(nb12.check_checkpoints, *_pair(step=5), seed=2,
               expected="Likely mistake: the step is not the one saved")


# --- library code reached past the tripwires and the word scan (Forbidden.library_code) ---------

_CAPTURED = {"loss": getattr(F, "cross" + "_entropy"), "optimizer": getattr(torch.optim, "Ad" + "amW"),
             "clip": getattr(torch.nn.utils, "clip_grad" + "_norm_")}


def test_library_code_captured_before_the_check_is_refused_and_named():
    def cross_entropy(logits, targets, ignore_index=-100):
        return _CAPTURED["loss"](logits.float().flatten(0, 1), targets.flatten(), ignore_index=ignore_index)

    class AdamW(_adamw()):
        def step(self, closure=None):
            if not hasattr(self, "inner"):
                self.inner = _CAPTURED["optimizer"](self.param_groups)
                self.state = self.inner.state
            return self.inner.step()

    def clip_grad_norm(parameters, max_norm):
        return _CAPTURED["clip"](parameters, max_norm)
    fails_with(nb12.check_cross_entropy, cross_entropy, expected="a library version of the cross-entropy")
    fails_with(nb12.check_adamw, AdamW, expected="a library version of AdamW")
    fails_with(nb12.check_clip_grad_norm, clip_grad_norm, expected="a library version of clipping by the global norm")


@pytest.mark.parametrize("check, learner, expected", [
    (nb12.check_cross_entropy, (None,), "cross_entropy: expected your function"),
    (nb12.check_adamw, (torch.nn.Linear,), "a subclass of torch.optim.Optimizer"),
    (nb12.check_clip_grad_norm, (3,), "clip_grad_norm: expected your function"),
    (nb12.check_training_state_bytes, (lambda model, mixed: 7,), "return a dict with the keys"),
    (nb12.check_saved_activation_bytes, (lambda model, *inputs: 1.5,), "a number of bytes, a Python int"),
    (nb12.check_checkpoints, (None, None), "save_checkpoint: expected your function"),
    (nb12.check_checkpoints, (lambda *args: None, lambda *args: None), "wrote no file at path"),
])
def test_answers_of_the_wrong_kind_get_one_line(check, learner, expected):
    fails_with(check, *learner, expected=expected)


# --- what the learner's code returns or leaves, read without trusting it ---------------

class _ById(torch.optim.Optimizer):
    """A right AdamW whose state is keyed by id(p): the int hashes like the tensor p."""
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            for p in (p for p in group["params"] if p.grad is not None):
                s = self.state[id(p)]
                if not s:
                    s.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                s["step"] += 1
                p.mul_(1 - lr * group["weight_decay"])
                s["exp_avg"].lerp_(p.grad, 1 - b1)
                s["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                v_hat = s["exp_avg_sq"] / (1 - b2 ** s["step"])
                p.addcdiv_(s["exp_avg"] / (1 - b1 ** s["step"]), v_hat.sqrt() + group["eps"], value=-lr)


def test_adamw_state_kept_by_id_is_named():
    fails_with(nb12.check_adamw, _ById, expected="Likely mistake: the state is kept by id(p)")


def _odd_state(make):
    """A right AdamW that leaves `make(state)` as its optimizer.state after each step."""
    class Odd(_adamw()):
        def _step(self):
            kept = getattr(self, "kept", None)
            self.state = kept if kept is not None else self.state
            super()._step()
            self.kept, self.state = self.state, make(self.state)
    return Odd


def _odd_groups(make):
    class Odd(_adamw()):
        def _step(self):
            super()._step()
            self.param_groups = make(self.param_groups)
    return Odd


def _saving_to(path_use):
    def save(path, model, optimizer, step, generator):
        _save(path, model, optimizer, step, generator)
        path_use(model, optimizer, generator)
    return save


def _returning(value):
    def load(path, model, optimizer, generator):
        _load(path, model, optimizer, generator)
        return value
    return load


_META = torch.empty((), device="meta")
_ODD = [   # (check, the learner's answer, what the message says)
    (nb12.check_cross_entropy, lambda x, t, i: None, "returned NoneType"),
    (nb12.check_cross_entropy, lambda x, t, i: "1.0", "returned str"),
    (nb12.check_cross_entropy, lambda x, t, i: torch.tensor(1 + 1j), "complex"),
    (nb12.check_cross_entropy, lambda x, t, i: _META, "tensor on meta"),
    (nb12.check_cross_entropy, lambda x, t, i: {"loss": 1.0}, "returned dict"),
    (nb12.check_adamw, _odd_state(lambda s: {str(id(p)): v for p, v in s.items()}), "keys of type str"),
    (nb12.check_adamw, _odd_state(lambda s: None), "optimizer.state is NoneType"),
    (nb12.check_adamw, _odd_state(lambda s: {p: [1, 2] for p in s}), "optimizer.state[p]['exp_avg'] is missing"),
    (nb12.check_adamw, _odd_state(lambda s: {p: {**v, "step": torch.ones(2)} for p, v in s.items()}),
     "state['step']"),
    (nb12.check_adamw, _odd_state(lambda s: {p: {**v, "exp_avg": v["exp_avg"].tolist()} for p, v in s.items()}),
     "optimizer.state[p]['exp_avg'] is missing"),
    (nb12.check_adamw, _odd_groups(lambda g: None), "param_groups is NoneType"),
    (nb12.check_adamw, _odd_groups(lambda g: g[:1]), "param_groups is a list of 1"),
    (nb12.check_clip_grad_norm, lambda ps, m: None, "returned None"),
    (nb12.check_clip_grad_norm, lambda ps, m: torch.ones(2), "tensor of shape [2]"),
    (nb12.check_clip_grad_norm, lambda ps, m: _META, "torch.float32 tensor of shape []"),
    (nb12.check_clip_grad_norm, lambda ps, m: torch.tensor(1j), "complex"),
    (nb12.check_training_state_bytes, lambda model, mixed: {torch.tensor(1): 1, "gradients": 2, "adam_moments": 3},
     "with the keys 'adam_moments', 'gradients', a Tensor"),
    (nb12.check_training_state_bytes, lambda model, mixed: {1: 1, 2: 2, 3: 3}, "a dict with the keys"),
    (nb12.check_training_state_bytes, lambda model, mixed: dict.fromkeys(["parameters", "gradients", "adam_moments"]),
     "is None; a number of bytes is an int"),
    (nb12.check_training_state_bytes,
     lambda model, mixed: dict.fromkeys(["parameters", "gradients", "adam_moments"], torch.tensor(2.5)),
     "torch.float32 tensor"),
    (nb12.check_saved_activation_bytes, lambda model, *inputs: None, "returned None"),
    (nb12.check_saved_activation_bytes, lambda model, *inputs: _META, "a number of bytes"),
    (nb12.check_saved_activation_bytes, lambda model, *inputs: [1], "returned [1]"),
    (nb12.check_checkpoints, (_save, _returning(None)), "load_checkpoint returned None"),
    (nb12.check_checkpoints, (_save, _returning(torch.tensor([5, 5]))), "tensor of shape [2]"),
    (nb12.check_checkpoints, (_save, _returning(_META)), "load_checkpoint returned"),
    (nb12.check_checkpoints, (_save, _returning("5")), "load_checkpoint returned '5'"),
    (nb12.check_checkpoints, (_saving_to(lambda model, optimizer, generator: setattr(optimizer, "state", None)), _load),
     "After save_checkpoint, the training loop cannot go on"),
]


@pytest.mark.parametrize("check, answer, expected", _ODD)
def test_odd_answers_get_a_message_not_a_crash_in_the_graders(check, answer, expected):
    """Whatever the learner's code returns or leaves behind, the check fails with a CheckFailed
    (what is wrong, how to fix it): no exception escapes from the course's code."""
    with pytest.raises(CheckFailed) as failure:
        check(*(answer if isinstance(answer, tuple) else (answer,)))
    assert expected in str(failure.value), str(failure.value)


def test_an_extra_tensor_key_in_the_state_is_read_past():
    """A tensor key inside a parameter's state (compared with "exp_avg", it would raise) is skipped."""
    nb12.check_adamw(_odd_state(lambda s: {p: {torch.ones(2): 1, **v} for p, v in s.items()}))


# --- a checkpoint that keeps references -------------------------------------------------

_IN_MEMORY = {}


def _save_references(path, model, optimizer, step, generator):
    _IN_MEMORY.update(model=model.state_dict(), optimizer=optimizer.state_dict(), step=step,
                      generator=generator.get_state(), rng=torch.get_rng_state())
    torch.save({"step": step}, path)


def _load_references(path, model, optimizer, generator):
    model.load_state_dict(_IN_MEMORY["model"])
    optimizer.load_state_dict(_IN_MEMORY["optimizer"])
    generator.set_state(_IN_MEMORY["generator"])
    torch.set_rng_state(_IN_MEMORY["rng"])
    model.train()
    return _IN_MEMORY["step"]


def _save_optimizer_object(path, model, optimizer, step, generator):
    _save(path, model, optimizer, step, generator)
    _IN_MEMORY["optimizer_object"] = optimizer


def _load_optimizer_from_memory(path, model, optimizer, generator):
    step = _load(path, model, optimizer, generator)
    optimizer.load_state_dict(_IN_MEMORY["optimizer_object"].state_dict())
    return step


@pytest.mark.parametrize("save, load", [(_save_references, _load_references),
                                        (_save_optimizer_object, _load_optimizer_from_memory)])
def test_a_load_that_reads_what_save_kept_in_memory_is_named(save, load):
    fails_with(nb12.check_checkpoints, save, load,
               expected="Likely mistake: load reads the objects that save kept in memory")


# --- library routines refused at the level they run ------------------------

def _first_logit(x, t):
    return x.gather(-1, t.clamp(min=0)[..., None])[..., 0]


_aten, _nn = torch.ops.aten, torch._C._nn
_lse = getattr(_aten, "logsum" + "exp")                                  # past the word scan
_special_log_softmax = getattr(torch.special, "log_" + "softmax")        # taken before the tripwires


@pytest.mark.parametrize("body, name", [
    (lambda x, t, i: -(_aten._log_softmax(x.float(), -1, False).gather(-1, t.clamp(min=0)[..., None])[..., 0])
     [t != i].mean(), "aten::_log_softmax"),
    (lambda x, t, i: _nn.cross_entropy_loss(x.float().flatten(0, 1), t.flatten(), None, 1, i, 0.0),
     "aten::cross_entropy_loss"),   # the outermost refused kernel: the one a grading kernel's dispatcher refuses
    (lambda x, t, i: (_lse(x.float(), [-1]) - _first_logit(x.float(), t))[t != i].mean(),
     "aten::logsumexp"),
    (lambda x, t, i: -_special_log_softmax(x.float(), -1).gather(
        -1, t.clamp(min=0)[..., None])[..., 0][t != i].mean(), "aten::log" "_softmax"),   # not the word itself
    (lambda x, t, i: -(x.float().softmax(-1).gather(-1, t.clamp(min=0)[..., None])[..., 0].log())[t != i].mean(),
     "aten::softmax"),
    (lambda x, t, i: _aten.nll_loss_forward(x.float().flatten(0, 1) - x.float().flatten(0, 1).amax(-1, keepdim=True),
                                            t.flatten(), None, 1, i)[0], "aten::nll_loss_forward"),
])
def test_cross_entropy_library_kernels_are_refused_however_reached(body, name):
    fails_with(nb12.check_cross_entropy, body, expected=[name, "torch's own kernel for part of the cross-entropy"])


def _copy_of(module: str, package: str) -> dict:
    """torch's own source of `module`, compiled again under another name (as a learner could paste it)."""
    import importlib.util

    origin = importlib.util.find_spec(module).origin
    namespace = {"__name__": "pasted", "__package__": package}
    exec(compile(open(origin).read(), "<pasted>", "exec"), namespace)
    return namespace


def test_adamw_library_kernels_and_copies_are_refused():
    class Fused(_adamw()):
        def _step(self):
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                for p in params:
                    self.state[p] or self.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                                                          exp_avg_sq=torch.zeros_like(p))
                states = [self.state[p] for p in params]
                _aten._fused_adamw_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                                    [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
                                    lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                                    weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False,
                                    maximize=False)

    class Foreach(_adamw()):
        def _step(self):
            super()._step()
            torch._foreach_mul_([p for group in self.param_groups for p in group["params"]], 1.0)

    pasted = _copy_of("torch.optim.adam", "torch.optim")

    class Pasted(pasted["Adam"]):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             decoupled_weight_decay=True)
    fails_with(nb12.check_adamw, Fused, expected=["aten::_fused_adamw_", "torch's fused AdamW step"])
    fails_with(nb12.check_adamw, Foreach, expected="aten::_foreach_mul_")
    fails_with(nb12.check_adamw, Pasted, expected=["torch.optim.adam.", "compiled from a copy of its source"])


def test_a_library_kernel_on_a_thread_started_before_the_check_is_refused():
    """The norms computed by torch's multi-tensor kernel on a worker thread that waits on a queue:
    the dispatch mode sees its own thread only, torch's profiler every thread."""
    requests, replies = queue.Queue(), queue.Queue()

    def worker():
        while (grads := requests.get()) is not None:
            replies.put(torch._foreach_norm(grads))
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    def clip_grad_norm(parameters, max_norm):
        params = [p for p in parameters if p.grad is not None]
        requests.put([p.grad for p in params])
        total = torch.stack(replies.get()).norm()
        for p in params:
            p.grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total
    try:
        fails_with(nb12.check_clip_grad_norm, clip_grad_norm, expected=["aten::_foreach_norm", "on another thread"])
    finally:
        requests.put(None)
        thread.join()


def test_clipping_library_kernels_and_copies_are_refused():
    pasted = _copy_of("torch.nn.utils.clip" + "_grad", "torch.nn.utils")

    def clip_grad_norm(parameters, max_norm):
        return pasted["clip_grad" + "_norm_"](parameters, max_norm)
    fails_with(nb12.check_clip_grad_norm, _clip("foreach"), expected="aten::_foreach_norm")
    fails_with(nb12.check_clip_grad_norm, clip_grad_norm,
               expected=["torch.nn.utils.clip_grad.", "compiled from a copy of its source"])


# --- an untouched exercise is answered at once -------------------------------

def test_untouched_exercises_are_answered_before_any_reference_is_built(monkeypatch):
    """The stubs' checks say "not written yet" without building a reference (those take seconds):
    every reference builder of 12's checks raises here, and no check reaches one."""
    from graders.exercises.nb12 import adamw, checkpoint, clipping, loss, memory

    def built(*args, **kwargs):
        raise AssertionError("a reference was built for an untouched exercise")
    for module, name in ((loss, "expected_loss"), (loss, "loss_mistakes"), (adamw, "torch_trajectory"),
                         (adamw, "adamw_mistakes"), (clipping, "expected"), (memory, "measured_state"),
                         (memory, "saved_records"), (checkpoint, "uninterrupted")):
        monkeypatch.setattr(module, name, built)

    def stub(*args, **kwargs):
        raise NotImplementedError

    class AdamW(torch.optim.Optimizer):     # the notebook's given __init__, step still the stub
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self, closure=None):
            raise NotImplementedError
    for check, answer in ((nb12.check_cross_entropy, (stub,)), (nb12.check_adamw, (AdamW,)),
                          (nb12.check_clip_grad_norm, (stub,)), (nb12.check_training_state_bytes, (stub,)),
                          (nb12.check_saved_activation_bytes, (stub,)), (nb12.check_checkpoints, (stub, stub))):
        fails_with(check, *answer, expected="not written yet")


def test_the_setup_cell_says_what_it_does_before_it_imports():
    """Its imports take seconds: a line says what is happening first, and another when it is done."""
    import ast
    import json

    cells = json.load(open("solutions/12_training_step.ipynb"))["cells"]
    setup = next(c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == "setup")
    body = ast.parse("".join(setup["source"])).body
    first_slow = next(i for i, node in enumerate(body) if isinstance(node, (ast.Import, ast.ImportFrom))
                      and node.names[0].name != "time")
    printed = [i for i, node in enumerate(body) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", "") == "print"]
    assert printed and printed[0] < first_slow and printed[-1] == len(body) - 1


def test_switching_the_watch_off_is_refused():
    from torch.utils import _python_dispatch

    def hidden(logits, targets, ignore_index=-100):
        with _python_dispatch._disable_current_modes():
            log_probs = _aten._log_softmax(logits.float(), -1, False)
        return -(_first_logit(log_probs, targets))[targets != ignore_index].mean()

    def popped(logits, targets, ignore_index=-100):
        _python_dispatch._pop_mode()
        return _loss()(logits, targets, ignore_index)
    fails_with(nb12.check_cross_entropy, hidden, expected=["switched off the check's watch", "_disable_current_modes"])
    fails_with(nb12.check_cross_entropy, popped, expected=["switched off the check's watch", "_pop_mode"])
