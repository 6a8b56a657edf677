"""How much of an answer function's own code must be found in one source for it to be flagged as
a copy, per exercise (an answer cell): the one place that says it.

An exercise whose independent correct answers already share much of their code with the course's
solution or a library's (the notebook dictates the names, the hint the code) needs a higher bar,
and one where they share nearly all of it cannot tell a copy from an honest answer at all.
`python benchmarks/bench_copies.py` measures, on the honest corpus (tests/copies_corpus), the share
independent answers reach in each exercise; every bar here is above it, and tests/grading/test_copies.py
fails when an honest answer reaches one.
"""
from __future__ import annotations

# How far above the most an honest answer reached every bar stands (then rounded up to 0.05).
MARGIN = 0.10
# Where no exercise is named below: the honest answers of the exercises not named reach at most
# 34% (07's groups_answer), and MARGIN above that.
DEFAULT = 0.50
# An exercise whose honest answers share so much with the solution that no share separates a copy.
CANNOT_FLAG = None

# {"notebook/answer cell": its bar, or CANNOT_FLAG}, with the most an honest answer reached.
THRESHOLDS: dict[str, float | None] = {
    "05_transformer_block/block_answer": CANNOT_FLAG,       # 100%: the four modules the notebook names
    "06_gpt2/model_answer": CANNOT_FLAG,                    # 100%: the five attributes the notebook names
    "07_training/evaluate_answer": CANNOT_FLAG,             # 100%: the catalog's eval_batched is the solution's loop
    "10_modern_decoder/gqa_answer": 0.55,                   # 41%
    "10_modern_decoder/model_answer": 0.95,                 # 81%
    "10_modern_decoder/generate_answer": CANNOT_FLAG,       # 85%: the hint spells out the loop
    "11_tokenizer/encode_answer": 0.80,                     # 68%
    "11_tokenizer/train_answer": 0.80,                      # 70%
    "12_training_step/checkpoint_answer": CANNOT_FLAG,      # 100%: one state_dict or state per object given
    "13_post_training/lora_answer": 0.95,                   # 83%: the notebook spells out merge_lora
}


def threshold(notebook: str, grade_id: str) -> float | None:
    """The share past which an answer function of that cell is flagged; None: it never is."""
    return THRESHOLDS.get(f"{notebook}/{grade_id}", DEFAULT)
