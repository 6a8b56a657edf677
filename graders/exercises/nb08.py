"""Grader for 08_sampling: logit transforms, samplers, generation, beam search and the KV cache
(and its size).

The notebook's check functions; the exercises themselves live by topic in
graders.exercises.sampling. The course's own implementations (sampling/reference.py) are not
exported here: a learner who types `nb08.apply_top_p??` finds a check, not an answer.
"""
from graders.judging.notebook import ExampleBug, Notebook
from graders.exercises.sampling.beam import check_beam_search
from graders.exercises.sampling.cache_size import check_kv_cache_bytes
from graders.exercises.sampling.generation import check_generate
from graders.exercises.sampling.kv_cache import (CACHE_MISTAKES, check_forward_with_cache,
                                                 check_generate_with_cache)
from graders.exercises.sampling.samplers import (DRAWS, check_sample_next_token, check_sampler,
                                                 chi_square_p_value)
from graders.exercises.sampling.filters import ascending_keep, check_top_k, check_top_p
from graders.exercises.sampling.transforms import (check_frequency_penalty, check_greedy,
                                                   check_temperature)
from graders.exercises.small_models import (MarkovModel, cache_config, markov_model,
                                            sampling_config, seeded_model)


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
    course_code=('exercises/sampling/reference.py',),
    implementations=(
        'exercises/sampling/reference.py:greedy_search',
        'exercises/sampling/reference.py:apply_temperature',
        'exercises/sampling/reference.py:token_counts',
        'exercises/sampling/reference.py:apply_frequency_penalty',
        'exercises/sampling/reference.py:apply_top_k',
        'exercises/sampling/reference.py:apply_top_p',
        'exercises/sampling/reference.py:sample_basic',
        'exercises/sampling/reference.py:next_token_logits',
        'exercises/sampling/reference.py:sample_next_token',
        'exercises/sampling/reference.py:generate',
        'exercises/sampling/reference.py:beam_search',
        'exercises/sampling/reference.py:attention_with_cache',
        'exercises/sampling/reference.py:forward_with_cache',
        'exercises/sampling/reference.py:generate_with_cache',
    ),
)
