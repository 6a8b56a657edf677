"""Notebook 13's exercises: from a base model to an assistant (a chat template and its loss mask,
the SFT loss, LoRA, a finetuning run, DPO and a preference run), each judged against the library
or the equation it stands for (transformers' chat templates, F.cross_entropy, peft, the DPO paper)."""
