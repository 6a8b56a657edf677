"""GPT-2 grader (06): count_parameters (graders/exercises/nb06/parameter_count.py) mistakes are named;
correct variants pass."""
import pytest

from graders.exercises import nb06
from graders.judging.compare import CheckFailed


# --- count_parameters ---------------------------------------------------------------------------

def _solution_count_parameters():
    from graders.course.example_class import solution_answers
    from graders.reference.config import Config

    namespace = {"Config": Config}
    exec(compile(solution_answers("06_gpt2")["count_answer"], "count_answer", "exec"), namespace)
    return namespace["count_parameters"]


def test_solution_count_parameters_passes_and_agrees_with_gpt2_small():
    count_parameters = _solution_count_parameters()
    for seed in (0, 5, 17, 101):
        nb06.check_count_parameters(count_parameters, seed=seed)
    # GPT-2 small as OpenAI released it, counted by transformers (the grader's independent reference).
    from graders.exercises.nb06.parameter_count import expected_counts
    from graders.reference.config import Config

    assert expected_counts(tuple(vars(Config()).values()))["total_tied"] == 124_439_808


def _with(change):
    """The solution's counts with one mistake: `change(counts, cfg)` edits the dict in place."""
    solution = _solution_count_parameters()

    def count_parameters(cfg):
        counts = solution(cfg)
        change(counts, cfg)
        return counts
    return count_parameters


def _retotal(counts, cfg):
    per_block = counts["attn"] + counts["mlp"] + counts["layer_norms"]
    counts["total"] = (counts["embed"] + counts["pos_embed"] + cfg.n_layers * per_block
                       + counts["ln_final"] + counts["unembed"])
    counts["total_tied"] = counts["total"] - counts["unembed"]


def _attention_without_biases(counts, cfg):
    counts["attn"] = 4 * cfg.n_heads * cfg.d_head * cfg.d_model


def _one_layer_norm(counts, cfg):
    counts["layer_norms"] = 2 * cfg.d_model


def _one_block(counts, cfg):
    counts["total"] -= (cfg.n_layers - 1) * (counts["attn"] + counts["mlp"] + counts["layer_norms"])


def _tied_keeps_bias(counts, cfg):
    counts["total_tied"] += cfg.d_vocab


def _tied_is_untied(counts, cfg):
    counts["total_tied"] = counts["total"]


def _pos_per_token(counts, cfg):
    counts["pos_embed"] = cfg.d_vocab * cfg.d_model


def _one_head(counts, cfg):
    counts["attn"] = 4 * cfg.d_head * cfg.d_model + 3 * cfg.d_head + cfg.d_model


@pytest.mark.parametrize("change, message", [
    (_attention_without_biases, "attention biases b_Q, b_K, b_V, b_O are not counted"),
    (_one_head, "only one head is counted"),
    (_one_layer_norm, "each block has two LayerNorms"),
    (_one_block, "the blocks are counted once"),
    (_tied_keeps_bias, "GPT-2 has no unembedding bias"),
    (_tied_is_untied, "W_U and W_E are one matrix"),
    (_pos_per_token, "one row per position (n_ctx)"),
], ids=lambda x: getattr(x, "__name__", "msg"))
def test_count_parameters_mistakes_are_named(change, message):
    with pytest.raises(CheckFailed) as failure:
        nb06.check_count_parameters(_with(change))
    assert message in str(failure.value)


def test_count_parameters_is_graded_on_other_configs():
    """A count that hard-codes GPT-2 small passes the visible check and fails the hidden ones."""
    from graders.reference.config import Config

    small = _solution_count_parameters()(Config())
    nb06.check_count_parameters(lambda cfg: dict(small))
    with pytest.raises(CheckFailed, match="another config"):
        nb06.check_count_parameters(lambda cfg: dict(small), seed=5)


def test_count_parameters_that_builds_the_modules_is_refused():
    from graders.reference.components import DemoTransformer

    def count_parameters(cfg):
        return {"total": sum(p.numel() for p in DemoTransformer(cfg).parameters())}

    with pytest.raises(CheckFailed, match="runs code from graders/reference/components.py"):
        nb06.check_count_parameters(count_parameters)


def test_count_parameters_must_return_ints_under_every_key():
    with pytest.raises(CheckFailed, match="has no 'embed'"):
        nb06.check_count_parameters(lambda cfg: {})
    counts = _solution_count_parameters()
    with pytest.raises(CheckFailed, match="Python int"):
        nb06.check_count_parameters(lambda cfg: {**counts(cfg), "mlp": float(counts(cfg)["mlp"])})
