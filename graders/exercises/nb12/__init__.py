"""Grader for 12_training_step: a cross-entropy that does not overflow, AdamW written as a
torch.optim.Optimizer, clipping by the global norm, where a training step's memory goes, and
checkpoints that resume bit for bit, each judged against PyTorch's own (F.cross_entropy,
torch.optim.AdamW, clip_grad_norm_, a real step's tensors and saved_tensors_hooks, a run that never
stopped).

The notebook's check functions and the definitions its cells use; the exercises themselves live
in graders.exercises.nb12.
"""
from graders.exercises.nb12.adamw import check_adamw
from graders.exercises.nb12.checkpoint import check_checkpoints
from graders.exercises.nb12.clipping import check_clip_grad_norm
from graders.exercises.nb12.loss import check_cross_entropy
from graders.exercises.nb12.memory import check_saved_activation_bytes, check_training_state_bytes
from graders.judging.notebook import ExampleBug, Notebook

__all__ = ["NOTEBOOK", "check_cross_entropy", "check_adamw", "check_clip_grad_norm", "check_training_state_bytes",
           "check_saved_activation_bytes", "check_checkpoints"]


NOTEBOOK = Notebook(
    '12_training_step',
    # The classic mistake of the example class's buggy student: weight decay added to the gradient
    # (Adam with L2), not applied to the weights.
    ExampleBug('adamw_answer', 'p.mul_(1 - group["lr"] * group["weight_decay"])',
               'grad = grad + group["weight_decay"] * p',
               costs=('adamw_test',),
               named='L2 decay added to the gradient'),
    pictures=1,
    course_code=('exercises/nb12/*.py',),
)
