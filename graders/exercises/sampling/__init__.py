"""Notebook 08's exercises, by topic: the reference implementations (`reference`), the logit
transforms (`transforms`), the top-k and top-p filters (`filters`), the samplers (`samplers`),
`generate` (`generation`), beam search (`beam`), the KV cache (`kv_cache`) and its size
(`cache_size`). The notebook uses their check functions through graders.exercises.nb08.

Deterministic by construction, never flaky: every input comes from a fixed seed, and every
sampler is judged from draws made with a generator the grader seeds.
"""
