"""Grader for 07_training: the reversal data, evaluation, training, accuracy by position, the
optimiser's parameter groups and learning-rate schedule, and training on tiny Shakespeare.

The notebook's check functions and the helpers its cells and the course's tests and benchmarks
use; the exercises themselves live by topic in graders.exercises.nb07.
"""
from graders.judging.notebook import ExampleBug, Notebook
from graders.exercises.nb07.accuracy import check_per_position_accuracy
from graders.exercises.common.next_token import loss_mistakes, reference_loss
from graders.exercises.nb07.practice import check_lr_at, check_optimizer_groups
from graders.exercises.nb07.reversal import check_evaluate, check_reversal_generator
from graders.exercises.nb07.runs import TrainingRun, one_thread
from graders.exercises.nb07.shakespeare import (check_shakespeare_smoke, check_shakespeare_training, judge_shakespeare,
                                                judge_shakespeare_smoke)
from graders.exercises.nb07.tasks import (BAND_ABOVE, BAND_BELOW, BELOW_UNIGRAM, D_VOCAB, FLOOR, HALF, MIN_CONTEXT_GAIN,
                                          N_SMOKE_VAL_WINDOWS, N_TEST_SEQUENCES, N_UNPREDICTABLE, N_VAL_WINDOWS,
                                          REVERSAL, REVERSAL_BATCH, REVERSAL_EVAL_EVERY, SEQ_LEN, SHAKESPEARE,
                                          SHAKESPEARE_BATCH, SHAKESPEARE_D_MODEL, SHAKESPEARE_WINDOW, SMOKE,
                                          SMOKE_BELOW_UNIFORM, UNTRAINED_LOSS, Recipe, compact_shakespeare_tokens,
                                          per_position, random_windows, reference_reversal, reversal_config,
                                          shakespeare_config, shakespeare_tokens, shakespeare_vocab, unigram_entropy)
from graders.exercises.nb07.train import check_train, judge_train

__all__ = [
    "NOTEBOOK",
    "check_reversal_generator", "check_evaluate", "check_train",
    "check_shakespeare_training", "check_shakespeare_smoke",
    "check_per_position_accuracy", "check_optimizer_groups", "check_lr_at",
    "loss_mistakes", "TrainingRun", "one_thread",
    "judge_train", "judge_shakespeare", "judge_shakespeare_smoke",
    "BAND_ABOVE", "BAND_BELOW", "BELOW_UNIGRAM", "D_VOCAB", "FLOOR", "HALF", "MIN_CONTEXT_GAIN",
    "N_SMOKE_VAL_WINDOWS",
    "N_TEST_SEQUENCES", "N_UNPREDICTABLE", "N_VAL_WINDOWS", "REVERSAL", "REVERSAL_BATCH",
    "REVERSAL_EVAL_EVERY", "Recipe", "SEQ_LEN", "SHAKESPEARE", "SHAKESPEARE_BATCH",
    "SHAKESPEARE_D_MODEL", "SHAKESPEARE_WINDOW", "SMOKE", "SMOKE_BELOW_UNIFORM",
    "UNTRAINED_LOSS", "per_position", "random_windows", "reference_loss", "reference_reversal",
    "reversal_config", "shakespeare_config", "shakespeare_tokens", "unigram_entropy",
    "compact_shakespeare_tokens", "shakespeare_vocab",
]


NOTEBOOK = Notebook(
    '07_training',
    # The classic mistake of the example class's buggy student: optimizer.zero_grad() forgotten.
    # The gradients that pile up fail the reversal run and the graded Shakespeare run, which
    # grades train again on purpose (the notebook says so beside its check).
    ExampleBug('train_answer', '        optimizer.zero_grad()\n',
               '',
               costs=('train_test', 'shakespeare_test'), named='optimizer.zero_grad() is missing'),
    course_code=('exercises/nb07/*.py',),
)
