"""Grader for 09_transformer_family: sinusoidal positions, the post-norm block, weight tying, an
encoder (BERT) checked against transformers' BertForMaskedLM, masked-language-modelling data and
loss, and a short MLM training run.

The notebook's check functions and the definitions its cells use; the exercises themselves live
by topic in graders.exercises.nb09.
"""
from graders.judging.notebook import ExampleBug, Notebook
from graders.exercises.nb09.encoder import check_bert, check_bert_embeddings, check_encoder_block
from graders.exercises.nb09.mlm import check_mask_tokens, check_mlm_loss
from graders.exercises.nb09.norms import check_post_norm_block
from graders.exercises.nb09.positions import check_sinusoidal, sinusoidal
from graders.exercises.nb09.tasks import (CLS, D_VOCAB, HALF, IGNORE, MASK, N_ORDINARY, SEP, SEQ_LEN, block_config,
                                          mlm_config, reference_mask_tokens, train_config, reference_mlm_loss,
                                          reversal_pairs, spread_weights)
from graders.exercises.nb09.training import BATCH, LOSS_BAR, LR, STEPS, check_mlm_training, held_out
from graders.exercises.nb09.tying import check_tied_unembed

__all__ = [
    "NOTEBOOK",
    "check_sinusoidal", "check_post_norm_block", "check_tied_unembed", "check_bert_embeddings",
    "check_encoder_block", "check_bert", "check_mask_tokens", "check_mlm_loss", "check_mlm_training",
    "CLS", "SEP", "MASK", "N_ORDINARY", "D_VOCAB", "HALF", "SEQ_LEN", "IGNORE", "STEPS", "BATCH", "LR",
    "LOSS_BAR", "block_config", "mlm_config", "train_config", "reversal_pairs", "reference_mask_tokens",
    "reference_mlm_loss", "spread_weights", "sinusoidal", "held_out",
]


NOTEBOOK = Notebook(
    '09_transformer_family',
    # The classic mistake of the example class's buggy student: sin and cos swapped.
    ExampleBug('sinusoidal_answer', 'torch.stack([torch.sin(angles), torch.cos(angles)]',
               'torch.stack([torch.cos(angles), torch.sin(angles)]',
               costs=('sinusoidal_test',), named='sin and cos are swapped'),
    course_code=('exercises/nb09/*.py',),
)
