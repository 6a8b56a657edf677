"""Notebook 10's kv_cache_bytes grader (graders/exercises/nb10/cache_size.py): correct variants (in
other styles) pass, each catalogued mistake fails with its name."""
import pytest
import torch

from graders.exercises import nb10
from graders.exercises.nb10 import reference as ref
from graders.judging.compare import CheckFailed
from course_code import course_code_allowed
from catalog_helpers import fails_with


# The variants are built on the course's reference decoder (a subclass with one method changed).
reference_code_allowed = course_code_allowed(ref)


# --- kv_cache_bytes ------------------------------------------------------------------------------

def _bytes(heads="n_kv_heads", factor=2):
    def kv_cache_bytes(cfg, batch, seq_len, dtype):
        element = torch.finfo(dtype).bits // 8
        return factor * cfg.n_layers * batch * seq_len * getattr(cfg, heads) * cfg.d_head * element
    return kv_cache_bytes


def _bytes_per_number(size):
    def kv_cache_bytes(cfg, batch, seq_len, dtype):
        return 2 * cfg.n_layers * batch * seq_len * cfg.n_kv_heads * cfg.d_head * size
    return kv_cache_bytes


@pytest.mark.parametrize("learner, expected", [
    (_bytes_per_number(2), "Likely mistake: the dtype is ignored: every number is counted as 2 bytes"),
    (_bytes_per_number(4), "Likely mistake: the dtype is ignored: every number is counted as 4 bytes"),
    (lambda cfg, batch, seq_len, dtype: _bytes(heads="n_heads")(cfg, batch, seq_len, torch.float32),
     "Likely mistake: n_heads is used: the cache holds the keys and values of the n_kv_heads KV heads only "
     "(that is what grouped-query attention saves). And: the dtype is ignored: every number is counted as 4"),
    (lambda cfg, batch, seq_len, dtype: 8 * _bytes()(cfg, batch, seq_len, dtype), "Likely mistake: bits, not bytes"),
])
def test_kv_cache_bytes_tells_each_factor_apart_over_the_dtypes(learner, expected):
    """2 bytes a number and keys only are both half of float32's answer: bfloat16's and float64's
    answers tell them apart."""
    for seed, batch in ((0, 1), (1, 3)):
        fails_with(nb10.check_kv_cache_bytes, learner, expected=expected, seed=seed, batch=batch)


def test_kv_cache_bytes_passes_and_its_mistakes_are_named():
    for seed, batch in ((0, 1), (1, 3)):
        nb10.check_kv_cache_bytes(_bytes(), seed=seed, batch=batch)
    fails_with(nb10.check_kv_cache_bytes, _bytes(heads="n_heads"), expected="Likely mistake: n_heads is used")
    fails_with(nb10.check_kv_cache_bytes, _bytes(factor=1), expected="Likely mistake: only the keys are counted")


RUNS_ITS_OWN_ROPE = '''
import math
import torch
from graders.exercises.nb10 import reference as ref

def rope_cos_sin(positions, d_head, theta):
    cos, sin = ref.rope_cos_sin(positions, d_head, theta)
    return sin, cos                       # the mistake: swapped

def apply_rope(x, cos, sin):
    return x * cos                        # the mistake: no rotation

class GQAttention(ref.GQAttention):
    def forward(self, x, cos, sin, past=None):
        q = apply_rope(torch.einsum("bpd,ndh->bnph", x, self.W_Q), cos, sin)
        k = apply_rope(torch.einsum("bpd,ndh->bnph", x, self.W_K), cos, sin)
        v = torch.einsum("bpd,ndh->bnph", x, self.W_V)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        group = self.cfg.n_heads // k.shape[1]
        k_all, v_all = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        n_q, n_k = q.shape[2], k.shape[2]
        scores = (q @ k_all.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
            torch.ones(n_q, n_k, dtype=torch.bool).triu(1 + n_k - n_q), float("-inf"))
        return torch.einsum("bnph,nhd->bpd", scores.softmax(-1) @ v_all, self.W_O), (k, v)

class ModernDecoder(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        start = past[0][0].shape[-2] if past else 0
        positions = torch.arange(tokens.shape[1]) + start
        cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return self.ln_final(x) @ self.W_U, cache
'''


def test_a_mistake_in_rope_costs_only_the_rope_check():
    """The attention's and the model's checks run the course's RoPE under the notebook's names."""
    learner: dict = {}
    exec(RUNS_ITS_OWN_ROPE, learner)
    nb10.check_gq_attention(learner["GQAttention"])
    nb10.check_modern_decoder(learner["ModernDecoder"])
    with pytest.raises(CheckFailed):
        nb10.check_rope(learner["rope_cos_sin"], learner["apply_rope"])
    assert learner["apply_rope"](torch.ones(1), torch.ones(1), torch.zeros(1)).item() == 1.0   # names restored


def test_the_demonstrations_stated_time_is_a_benchmarks_line():
    """A time the notebook states comes from a benchmark that prints it, with the
    conditions it was measured under; the demonstration says what it does from its first line."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cells = json.loads((root / "solutions" / "10_modern_decoder.ipynb").read_text())["cells"]
    sources = ["".join(cell["source"]) for cell in cells]
    demo = next(i for i, source in enumerate(sources) if "def train_and_validate" in source)
    stated = re.search(r"`(benchmarks/[\w.]+)` runs\s+it as the notebook does: (\d+) s on one thread of (.+?)\s+"
                       r"\(load average ([\d.]+)\)", sources[demo - 1], re.S)
    assert stated, sources[demo - 1]
    benchmark = (root / stated.group(1)).read_text()
    assert "10's demonstration: {total:.0f} s" in benchmark and "load average {load:.1f}" in benchmark
    assert "seconds" not in sources[demo - 1].replace(stated.group(0), "")   # no other time stated
    first_code = sources[demo].split("if ready(ModernDecoder):", 1)[1].lstrip().splitlines()
    assert first_code[0].startswith("print("), first_code[0]   # before the text is encoded
