"""Notebook 10's exercises: from GPT-2 to a modern (Llama-style) decoder, each judged against
transformers' Llama from a small config with seeded weights (no download): `RMSNorm` and `SwiGLU`
(`norm_mlp`), rotary position embedding (`rope`), grouped-query attention with a KV cache
(`attention`), the decoder layer, the model and greedy generation (`model`), and the KV cache's
size (`cache_size`), on the config, course modules and converter in `reference`. Notebooks use
them through graders.exercises.nb10.
"""
