"""Grader for 14_rl_verifiable_rewards: reinforcement learning with verifiable rewards, GRPO. A
sampler of groups with their log-probabilities (against the course's seeded sampler), an exact
reward, group-relative advantages and the GRPO loss (against the equations in float64; trl is a
test-only cross-check), and an RL run from notebook 13's finetuned model.

The notebook's check functions; the exercises themselves live in graders.exercises.nb14."""
from graders.exercises.nb14.loss import check_grpo_loss
from graders.exercises.nb14.rewards import check_group_advantages, check_reward
from graders.exercises.nb14.runs import check_train_grpo
from graders.exercises.nb14.sampling import check_sample_group
from graders.judging.notebook import ExampleBug, Notebook
from graders.integrity import ANSWER_LIBRARIES

__all__ = ["NOTEBOOK", "check_sample_group", "check_reward", "check_group_advantages", "check_grpo_loss",
           "check_train_grpo"]


NOTEBOOK = Notebook(
    "14_rl_verifiable_rewards",
    # The classic mistake of the example class's buggy student: the reward does not require the end
    # marker, so the model is never taught to stop.
    ExampleBug("reward_answer", "return float(completion == answer + IM_END)",
               "return float(completion.removesuffix(IM_END) == answer)",
               costs=("reward_test",), named="the model is never taught to stop"),
    pictures=1,
    # What integrity needs (docs/integrity.md): the course's answers, sealed in the grading kernels.
    course_code=("exercises/nb14/*.py",),
    # trl's GRPO answers exercises here, and the kernel needs neither it nor peft (the tests do).
    without_libraries=(*ANSWER_LIBRARIES, "peft", "trl"),
)
