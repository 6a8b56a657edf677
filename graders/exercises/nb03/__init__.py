"""Grader for 03_attention: `Attention.apply_causal_mask`, the `Attention` forward pass, and the
heads' QK and OV circuits (graders.exercises.nb03.circuits).

Graded against the reference's blocks.{i}.attn: the pre-mask scores are rebuilt from hook_q /
hook_k, the masked scores are judged through their softmax (hook_pattern), so -inf and any large
negative constant both pass; the forward pass is fed blocks.{i}.ln1.hook_out and compared with
blocks.{i}.hook_attn_out. The exercises live by topic in graders.exercises.nb03.
"""
from graders.judging.notebook import ExampleBug, Notebook
from graders.exercises.nb03.circuits import check_qk_ov_circuits
from graders.exercises.nb03.forward import (check_attention, inputs_attention, judge_attention, produce_attention)
from graders.exercises.nb03.mask import check_apply_causal_mask

__all__ = ["NOTEBOOK", "check_apply_causal_mask", "check_attention", "check_qk_ov_circuits",
           "inputs_attention",
           "judge_attention", "produce_attention"]


NOTEBOOK = Notebook(
    '03_attention',
    # The classic mistake of the example class's buggy student: scores scaled by sqrt(d_model).
    ExampleBug('attention_answer', 'math.sqrt(self.cfg.d_head)',
               'math.sqrt(self.cfg.d_model)',
               costs=('attention_test',), named='sqrt(d_model)'),
    pictures=1,
    course_code=('reference/components.py',),
)
