"""Grader for 10_modern_decoder: RMSNorm, rotary position embedding, the SwiGLU MLP, grouped-query
attention with a KV cache, the decoder layer and model, greedy generation and the KV cache's size,
each checked against transformers' Llama (a small config with seeded weights, built locally).

The notebook's check functions and the definitions its cells use; the exercises themselves live
in graders.exercises.nb10.
"""
from graders.exercises.nb10.attention import check_gq_attention
from graders.exercises.nb10.cache_size import check_kv_cache_bytes
from graders.exercises.nb10.model import check_decoder_layer, check_generate_greedy, check_modern_decoder
from graders.exercises.nb10.norm_mlp import check_rms_norm, check_swiglu
from graders.exercises.nb10.reference import ModernConfig
from graders.exercises.nb10.rope import check_rope
from graders.judging.notebook import ExampleBug, Notebook

__all__ = [
    "NOTEBOOK", "ModernConfig",
    "check_rms_norm", "check_rope", "check_swiglu", "check_gq_attention", "check_decoder_layer",
    "check_modern_decoder", "check_generate_greedy", "check_kv_cache_bytes",
]


NOTEBOOK = Notebook(
    '10_modern_decoder',
    # The classic mistake of the example class's buggy student: `repeat` for `repeat_interleave`.
    ExampleBug('gqa_answer', 't.repeat_interleave(group, dim=1)', 't.repeat(1, group, 1, 1)',
               costs=('gqa_test',),
               named='`repeat` where `repeat_interleave` is needed'),
    pictures=2,
    course_code=('exercises/nb10/*.py',),
)
