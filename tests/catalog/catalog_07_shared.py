"""The losses notebook 07's evaluate and train variants use, as a learner's notebook defines them."""
import torch.nn.functional as F


# --- losses the evaluate and train tests use ------------------------------------------------

def loss_gather(logits, tokens):
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    return -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1).mean()


def loss_cross_entropy(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def loss_logsumexp(logits, tokens):
    picked = logits[:, :-1].gather(-1, tokens[:, 1:].unsqueeze(-1))[..., 0]
    return (logits[:, :-1].logsumexp(-1) - picked).mean()


def unshifted(logits, tokens):
    return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def per_position(logits, tokens):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
