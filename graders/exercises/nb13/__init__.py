"""Grader for 13_post_training: from a base model to an assistant. A chat template and its loss
mask (against transformers' apply_chat_template), the SFT loss (against F.cross_entropy), LoRA
(against peft), a finetuning run, the DPO loss (against the paper's equation) and a preference run.

The notebook's check functions and the definitions its cells use; the exercises themselves live
in graders.exercises.nb13.
"""
from graders.exercises.nb13.chat import IM_END, IM_START, chat_encoding
from graders.exercises.nb13.dpo import check_dpo_loss, check_sequence_logprob
from graders.exercises.nb13.lora import check_lora
from graders.exercises.nb13.loss import check_sft_loss
from graders.exercises.nb13.runs import check_finetune, check_train_dpo
from graders.exercises.nb13.template import check_chat_tokens
from graders.judging.notebook import ExampleBug, Notebook
from graders.integrity import ANSWER_LIBRARIES

__all__ = ["NOTEBOOK", "IM_START", "IM_END", "chat_encoding", "check_chat_tokens", "check_sft_loss", "check_lora",
           "check_finetune", "check_sequence_logprob", "check_dpo_loss", "check_train_dpo"]


NOTEBOOK = Notebook(
    "13_post_training",
    # The classic mistake of the example class's buggy student: the assistant's end-of-turn marker
    # masked, so the model never learns to stop.
    ExampleBug("chat_tokens_answer", "learned += [False] * len(header) + [assistant] * (len(body) + 1) + [False]",
               "learned += [False] * len(header) + [assistant] * len(body) + [False, False]",
               costs=("chat_tokens_test",), named="the model never learns to stop"),
    pictures=1,
    course_code=("exercises/nb13/*.py",),
    # peft's LoRA and trl's DPO answer exercises here, and the kernel needs neither (the judge does).
    without_libraries=(*ANSWER_LIBRARIES, "peft", "trl"),
)
