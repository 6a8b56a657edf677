"""Notebook 07's exercises, by topic: the task definitions (`tasks`), running a learner's training
loop (`runs`), the reversal data and evaluation (`reversal`), training on the reversal task
(`train`), accuracy by position (`accuracy`) and training on tiny Shakespeare (`shakespeare`).
Notebooks use them through graders.exercises.nb07."""
