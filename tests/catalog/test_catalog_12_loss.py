"""Notebook 12's cross_entropy grader (graders/exercises/nb12/loss.py): correct variants (in other
styles) pass, each catalogued mistake fails with its name."""
import pytest
import torch
import torch.nn.functional as F

from graders.exercises import nb12
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
