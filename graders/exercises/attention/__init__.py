"""Notebook 03's exercises by topic: the causal mask (`mask`) and the forward pass (`forward`),
with what both use (`common`) and the catalogue of classic attention mistakes (`mistakes`)."""
