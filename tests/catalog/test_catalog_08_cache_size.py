"""Notebook 08's kv_cache_bytes grader (graders/exercises/nb08/cache_size.py): correct variants pass,
each catalogued mistake fails with its diagnosis."""
import pytest
import torch

from graders.exercises import nb08
from graders.exercises.nb08 import filters, reference
from graders.judging.compare import CheckFailed

from course_code import course_code_allowed


# The variants are built on the course's reference sampler and filters.
reference_code_allowed = course_code_allowed(reference, filters)


# --- kv_cache_bytes -------------------------------------------------------------------------------

def _solution_kv_cache_bytes():
    from graders.course.example_class import solution_answers
    from graders.reference.config import Config

    namespace = {"torch": torch, "Config": Config}
    exec(compile(solution_answers("08_sampling")["kv_bytes_answer"], "kv_bytes_answer", "exec"), namespace)
    return namespace["kv_cache_bytes"]


def test_solution_kv_cache_bytes_passes_on_measured_caches():
    size = _solution_kv_cache_bytes()
    nb08.check_kv_cache_bytes(size, reference.forward_with_cache)
    nb08.check_kv_cache_bytes(size, reference.forward_with_cache, seed=5, batch=4, seq=11)
    # Without a working forward_with_cache of the learner's, the course's cache still decides.
    nb08.check_kv_cache_bytes(size, lambda *args: (_ for _ in ()).throw(NotImplementedError()))


def _bytes(cfg, batch, seq_len, dtype):
    return 2 * cfg.n_layers * batch * seq_len * cfg.n_heads * cfg.d_head * torch.finfo(dtype).bits // 8


@pytest.mark.parametrize("wrong, message, seed", [
    (lambda c, b, s, d: _bytes(c, b, s, d) // 2, "only the keys are counted", 0),
    (lambda c, b, s, d: _bytes(c, b, s, d) // c.n_layers, "one layer is counted", 0),
    (lambda c, b, s, d: _bytes(c, b, s, d) * 8, "bits, not bytes", 0),
    (lambda c, b, s, d: _bytes(c, b, s, torch.float32), "the dtype is ignored", 0),
    (lambda c, b, s, d: _bytes(c, 1, s, d), "the batch is left out", 5),
    (lambda c, b, s, d: _bytes(c, b, s, d) // c.n_layers, "one layer is counted", 5),
    (lambda c, b, s, d: 2 * c.n_layers * b * s * c.d_model * torch.finfo(d).bits // 8, "d_model is used", 5),
], ids=["keys_only", "keys_only_or_one_layer", "bits", "dtype_ignored", "no_batch", "one_layer", "d_model"])
def test_kv_cache_bytes_mistakes_are_named(wrong, message, seed):
    with pytest.raises(CheckFailed) as failure:
        nb08.check_kv_cache_bytes(wrong, reference.forward_with_cache, seed=seed, batch=4, seq=11)
    assert message in str(failure.value), str(failure.value)


def test_kv_cache_bytes_that_matches_a_wrong_cache_says_so():
    """A forward_with_cache that keeps only the keys builds half a cache: an answer that matches
    it is told to fix forward_with_cache."""
    def keys_only_forward(model, tokens, cache=None):
        logits, kv = reference.forward_with_cache(model, tokens, cache)
        return logits, [k for k, _ in kv]

    with pytest.raises(CheckFailed, match="fix forward_with_cache first"):
        nb08.check_kv_cache_bytes(lambda c, b, s, d: _bytes(c, b, s, d) // 2, keys_only_forward)


def test_kv_cache_bytes_that_measures_a_cache_is_refused():
    def measuring(cfg, batch, seq_len, dtype):
        return sum(t.numel() for t in reference.forward_with_cache)

    with pytest.raises(CheckFailed, match="without building a cache"):
        nb08.check_kv_cache_bytes(measuring, reference.forward_with_cache)
