"""Notebook 12's training_state_bytes and saved_activation_bytes graders
(graders/exercises/nb12/memory.py): correct variants (in other styles) pass, each catalogued mistake
fails with its name."""
import pytest
import torch

from graders.exercises import nb12
from catalog_helpers import fails_with


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
        by_storage, every, held = {}, [], []

        def pack(t):
            if kind == "pack_none_kept_alive":
                held.append(t)   # alive to the end, whatever pack returns: the count comes out right
            storage = t.untyped_storage()
            every.append((storage.data_ptr(), storage.nbytes(), t.numel() * t.element_size(), t.element_size(),
                          any(t is p for p in model.parameters()), t.data_ptr()))
            return None if kind.startswith("pack_none") else t
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


def test_a_pack_hook_that_returns_none_fails_even_where_its_count_comes_out_right():
    """The count of a pack hook that returns None depends on the allocator (freed storages' addresses
    are reused) unless the learner keeps the tensors alive some other way: it is refused whatever it
    counts, so that the grade does not vary from run to run."""
    fails_with(nb12.check_saved_activation_bytes, _measure("pack_none_kept_alive"),
               expected="Likely mistake: the pack hook returns None")


def test_counting_saved_tensors_by_their_own_address_and_size_fails_on_a_partial_view():
    """The course's modules save no partial view, so that count passes the visible check; the
    hidden one saves a view that shows three quarters of its storage, and names the mistake."""
    nb12.check_saved_activation_bytes(_measure("own_address"))
    fails_with(nb12.check_saved_activation_bytes, _measure("own_address"), seed=1, batch=3, seq=5,
               expected="Likely mistake: each saved tensor is counted by its own address and size")
