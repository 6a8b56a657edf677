"""Notebook 07's exercises, by topic: the task definitions (`tasks`), running a learner's training
loop (`runs`), the loss (`loss`), the reversal data and evaluation (`reversal`), training on the
reversal task (`train`) and on tiny Shakespeare (`shakespeare`), and sampling (`generation`).
Notebooks use them through graders.exercises.nb07."""
