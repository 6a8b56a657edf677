"""Notebook 09's exercises, by topic: sinusoidal positions (`positions`), the post-norm block
(`norms`), weight tying (`tying`), the BERT encoder checked against transformers'
BertForMaskedLM (`encoder`), masked-language-modelling data and loss (`mlm`) and the MLM
training run (`training`), on the definitions in `tasks`. Notebooks use them through
graders.exercises.nb09.

Deterministic by construction: every input, weight and mask comes from a fixed seed.
"""
