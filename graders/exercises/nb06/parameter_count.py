"""Grader for 06_gpt2's `count_parameters(cfg)`: where a GPT-2's parameters are, by component.

The expected counts are measured, not written down: each component is the course's own module
built with the case's config, counted with `numel`. GPT-2 as OpenAI ships it (unembedding tied to
the embedding, no unembedding bias) is counted independently, on transformers' `GPT2LMHeadModel`,
whose `parameters()` lists the shared matrix once. Hidden cases use other configs.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.reference.config import Config
from graders.marks import course_answer

PER_BLOCK = ("attn", "mlp", "layer_norms")
KEYS = ("embed", "pos_embed", *PER_BLOCK, "ln_final", "unembed", "total", "total_tied")
MEANING = {
    "embed": "the token embedding W_E",
    "pos_embed": "the positional embedding W_pos",
    "attn": "ONE block's attention (W_Q, W_K, W_V, W_O and b_Q, b_K, b_V, b_O)",
    "mlp": "ONE block's MLP (W_in, b_in, W_out, b_out)",
    "layer_norms": "ONE block's two LayerNorms, ln1 and ln2 (w and b each)",
    "ln_final": "the final LayerNorm",
    "unembed": "the unembedding W_U and b_U",
    "total": "the whole DemoTransformer as you built it (every block, untied)",
    "total_tied": "GPT-2 as OpenAI ships it: W_U is W_E's transpose (counted once) and there is no b_U",
}


COUNT_FORBIDDEN = Forbidden(
    "the parameter count", source_words=[".numel", ".nelement", ".parameters(", ".state_dict("],
    instead="from the config's sizes (d_model, n_heads, ...), without building the modules")


def config_for(case: Case) -> Config:
    """GPT-2 small for seed 0; a seeded smaller config otherwise (d_model = n_heads * d_head,
    as transformers' GPT-2 requires, but d_mlp not always 4 * d_model)."""
    if case.seed == 0:
        return Config()
    g = torch.Generator().manual_seed(case.seed)

    def pick(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=g))

    n_heads, d_head = pick(2, 6), pick(4, 24)
    return Config(d_model=n_heads * d_head, n_heads=n_heads, d_head=d_head, d_mlp=pick(16, 300),
                  n_layers=pick(1, 5), d_vocab=pick(50, 900), n_ctx=pick(8, 200))


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


@course_answer("count_parameters")
@lru_cache(maxsize=8)
def expected_counts(cfg_fields: tuple) -> dict[str, int]:
    """The course's modules' own counts for the config with these fields."""
    from graders.reference import components

    cfg = Config(*cfg_fields)
    with torch.random.fork_rng():
        counts = {"embed": _numel(components.Embed(cfg)), "pos_embed": _numel(components.PosEmbed(cfg)),
                  "attn": _numel(components.Attention(cfg)), "mlp": _numel(components.MLP(cfg)),
                  "layer_norms": 2 * _numel(components.LayerNorm(cfg)),
                  "ln_final": _numel(components.LayerNorm(cfg)), "unembed": _numel(components.Unembed(cfg))}
    counts["total"] = (counts["embed"] + counts["pos_embed"] + counts["ln_final"] + counts["unembed"]
                       + cfg.n_layers * sum(counts[k] for k in PER_BLOCK))
    counts["total_tied"] = _transformers_count(cfg)
    return counts


def _transformers_count(cfg: Config) -> int:
    """transformers' GPT-2 with this config: its parameters, the tied matrix counted once."""
    from transformers import GPT2Config, GPT2LMHeadModel

    # Its special-token ids must lie in the vocabulary (GPT-2's 50256 does not in a small one).
    last = cfg.d_vocab - 1
    config = GPT2Config(vocab_size=cfg.d_vocab, n_positions=cfg.n_ctx, n_embd=cfg.d_model,
                        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_mlp,
                        bos_token_id=last, eos_token_id=last)
    with torch.device("meta"):
        return _numel(GPT2LMHeadModel(config))


def count_mistakes(cfg: Config, right: dict[str, int]) -> dict[str, dict[str, int]]:
    """What each usual mistake gives, key by key."""
    d, heads = cfg.d_model, cfg.n_heads * cfg.d_head
    blocks = cfg.n_layers * sum(right[k] for k in PER_BLOCK)
    ends = right["embed"] + right["pos_embed"] + right["ln_final"]
    return {
        "attn": {Mistake("attention_biases_not_counted", "the attention biases b_Q, b_K, b_V, b_O are not "
                         "counted"): 4 * heads * d,
                 Mistake("b_o_not_counted", "b_O is not counted (it has d_model entries)"): right["attn"] - d,
                 Mistake("one_head", "only one head is counted: W_Q, W_K, W_V, W_O and b_Q, b_K, b_V hold n_heads "
                         "heads each"):
                     4 * cfg.d_head * d + 3 * cfg.d_head + d,
                 Mistake("w_o_not_counted", "W_O is not counted"): right["attn"] - heads * d},
        "mlp": {Mistake("mlp_biases_not_counted", "the MLP biases b_in and b_out are not counted"): 2 * d * cfg.d_mlp,
                Mistake("one_mlp_matrix", "only one of the two weight matrices is counted"):
                    d * cfg.d_mlp + cfg.d_mlp + d},
        "layer_norms": {Mistake("one_layer_norm", "half of them: each block has two LayerNorms (ln1 and ln2), each "
                                "with a gain w and a bias b of d_model entries"): 2 * d},
        "pos_embed": {Mistake("pos_embed_per_token", "W_pos has one row per position (n_ctx), not per token "
                              "(d_vocab)"): cfg.d_vocab * d},
        "embed": {Mistake("embed_per_position", "W_E has one row per token (d_vocab), not per position (n_ctx)"):
                      cfg.n_ctx * d},
        "unembed": {Mistake("b_u_not_counted", "b_U is not counted (d_vocab entries)"): d * cfg.d_vocab},
        "total": {Mistake("blocks_counted_once", "the blocks are counted once: there are n_layers of them"):
                      ends + right["unembed"] + blocks // cfg.n_layers,
                  Mistake("total_without_unembed", "the unembedding is left out of the total"): ends + blocks,
                  Mistake("total_without_ln_final", "the final LayerNorm is left out of the total"):
                      right["total"] - right["ln_final"]},
        "total_tied": {Mistake("tied_keeps_b_u", "b_U is still counted: GPT-2 has no unembedding bias"):
                           right["total_tied"] + cfg.d_vocab,
                       Mistake("tied_is_untied", "the untied total: with tying, W_U and W_E are one matrix, "
                               "counted once"):
                           right["total"],
                       Mistake("tied_without_embed", "the embedding is left out as well as the unembedding"):
                           right["total_tied"] - right["embed"]},
    }


def produce(count_parameters, case: Case, inputs: dict) -> dict:
    if not callable(count_parameters):
        raise CheckFailed(f"count_parameters: expected your function, got {count_parameters!r}.")
    counts = run_learner("count_parameters", count_parameters, config_for(case), forbidden=COUNT_FORBIDDEN)
    if not isinstance(counts, dict):
        raise CheckFailed(f"count_parameters returned {type(counts).__name__}; return a dict with "
                          f"the keys {', '.join(KEYS)}.")
    missing = [k for k in KEYS if k not in counts]
    if missing:
        raise CheckFailed(f"count_parameters: the dict has no {', '.join(repr(k) for k in missing)}. "
                          f"Return one integer for each of {', '.join(KEYS)}.")
    out = {}
    for key in KEYS:
        value = counts[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise CheckFailed(f"count_parameters[{key!r}] is {value!r} ({type(value).__name__}); "
                              "a parameter count is a Python int.")
        out[key] = torch.tensor(value, dtype=torch.int64)
    return out


def judge(case: Case, outputs: dict) -> None:
    cfg = config_for(case)
    right = expected_counts(tuple(vars(cfg).values()))
    mistakes = count_mistakes(cfg, right)
    where = "GPT-2 small's config" if case.seed == 0 else f"another config ({_short(cfg)})"
    for key in KEYS:
        got = int(outputs[key])
        if got == right[key]:
            continue
        named = [why for why, value in mistakes.get(key, {}).items() if value == got]
        likely = f" Likely mistake: {named[0]}." if named else ""
        raise CheckFailed(f"count_parameters[{key!r}] on {where}: {got:,} is not the number of "
                          f"parameters in {MEANING[key]}.{likely} Count each parameter's shape "
                          "from the module's __init__ and multiply its sizes.",
                          mistake=mistake_key(named[0]) if named else None)


def _short(cfg: Config) -> str:
    return ", ".join(f"{k}={v}" for k, v in vars(cfg).items() if k not in ("debug", "layer_norm_eps", "init_range"))


count = Exercise("06_gpt2", "count_parameters", produce, judge, forbidden=(COUNT_FORBIDDEN,))
check_count_parameters = count.checker(
    "Grade the learner's `count_parameters(cfg)` (visible check: GPT-2 small's config).")
