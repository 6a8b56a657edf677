"""Notebook 11's exercises: GPT-2's tokenizer built from bytes up, graded against tiktoken."""
