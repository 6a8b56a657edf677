"""Notebook 12's exercises: inside the training step (a stable loss, AdamW, clipping by the global
norm, checkpoints that resume exactly), each judged against PyTorch's own implementation."""
