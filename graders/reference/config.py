"""The `Config` every notebook gives the learner (GPT-2 small by default)."""
from dataclasses import dataclass

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


@dataclass
class Config:
    d_model: int = 768
    debug: bool = True
    layer_norm_eps: float = 1e-5
    d_vocab: int = 50257
    init_range: float = 0.02
    n_ctx: int = 1024
    d_head: int = 64
    d_mlp: int = 3072
    n_heads: int = 12
    n_layers: int = 12
