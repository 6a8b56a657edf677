"""Grader for 08_sampling: logit transforms, samplers, generation, beam search and the KV cache
(and its size).

The notebook's check functions; the exercises themselves live by topic in
graders.exercises.nb08. The course's own implementations (sampling/reference.py) are not
exported here: a learner who types `nb08.apply_top_p??` finds a check, not an answer.
"""
from graders.judging.notebook import ExampleBug, Notebook
from graders.exercises.nb08.beam import check_beam_search
from graders.exercises.nb08.cache_size import check_kv_cache_bytes
from graders.exercises.nb08.generation import check_generate
from graders.exercises.nb08.kv_cache import (CACHE_MISTAKES, check_forward_with_cache, check_generate_with_cache)
from graders.exercises.nb08.samplers import (DRAWS, check_sample_next_token, check_sampler, chi_square_p_value)
from graders.exercises.nb08.filters import ascending_keep, check_top_k, check_top_p
from graders.exercises.nb08.transforms import (check_frequency_penalty, check_greedy, check_temperature)
from graders.exercises.common.small_models import (MarkovModel, cache_config, markov_model, sampling_config,
                                                   seeded_model)


def _seeded_model(cfg, seed: int):
    """The grader's seeded DemoTransformer for `cfg`, in eval mode (as the checks run it)."""
    return seeded_model(cfg, seed).eval()


__all__ = [
    "NOTEBOOK",
    "check_greedy", "check_temperature", "check_frequency_penalty", "check_top_k", "check_top_p",
    "check_sampler", "check_sample_next_token", "check_generate", "check_beam_search",
    "check_forward_with_cache", "check_generate_with_cache", "check_kv_cache_bytes",
    "MarkovModel", "markov_model", "sampling_config", "cache_config", "CACHE_MISTAKES", "DRAWS",
    "chi_square_p_value", "ascending_keep", "_seeded_model",
]


NOTEBOOK = Notebook(
    '08_sampling',
    # The classic mistake of the example class's buggy student: top-p keeps one token too few
    # (sample_next_token's check runs the course's top-p, so it costs top-p's points only).
    ExampleBug('top_p_answer', 'mass_before = probs.cumsum(dim=-1) - probs',
               'mass_before = probs.cumsum(dim=-1)',
               costs=('top_p_test',), named='one token too few'),
    course_code=('exercises/nb08/reference.py',),
)
