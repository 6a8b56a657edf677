"""Notebook 09's encoder parts as a notebook runs them: one mistake costs only its own exercise."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graders.exercises import nb09
from graders.judging.compare import CheckFailed
from graders.reference import bert
from graders.reference.components import MLP, Attention, LayerNorm
from graders.reference.config import Config

from course_code import as_cell
from catalog_helpers import fails_with


# --- One mistake, one exercise: the encoder's parts ---------------------------------

# The solution's answer cells of sections 2-4, run in order as a learner's notebook runs them.
ENCODER_CELLS = ("post_norm", "tied", "bert_embeddings", "encoder_block", "bert")
# Each check of sections 2-4, by the notebook name of the class it grades.
ENCODER_CHECKS = {"PostNormBlock": nb09.check_post_norm_block, "TiedUnembed": nb09.check_tied_unembed,
                  "BertEmbeddings": nb09.check_bert_embeddings, "EncoderBlock": nb09.check_encoder_block,
                  "BertForMLM": nb09.check_bert}


def encoder_notebook(*edits):
    """The answers run in order in one namespace, each edit (cell, solution's text, learner's text)
    made first."""
    from jaxtyping import Float, Int
    from torch import Tensor

    from graders.course.example_class import solution_answers

    answers = solution_answers("09_transformer_family")
    cells = {cell: answers[f"{cell}_answer"] for cell in ENCODER_CELLS}
    for cell, old, new in edits:
        assert old in cells[cell], (cell, old)
        cells[cell] = cells[cell].replace(old, new)
    notebook = {"math": math, "torch": torch, "F": F, "nn": nn, "Tensor": Tensor, "Float": Float, "Int": Int,
                "Config": Config, "EncoderConfig": bert.EncoderConfig, "Attention": Attention, "MLP": MLP,
                "LayerNorm": LayerNorm}
    exec(as_cell("\n\n".join(cells.values()), "09 answers"), notebook)
    return notebook


def failing_checks(notebook) -> set[str]:
    failing = set()
    for name, check in ENCODER_CHECKS.items():
        try:
            check(notebook[name])
        except CheckFailed:
            failing.add(name)
    return failing


NO_LN2 = ("post_norm", "return self.ln2(resid_mid + self.mlp(resid_mid))", "return resid_mid + self.mlp(resid_mid)")
ONE_LAYER_NORM = ("post_norm", "self.ln2 = LayerNorm(cfg)", "self.ln2 = self.ln1")
COPIED_W_E = ("tied", "self.W_E = embed.W_E", "self.W_E = nn.Parameter(embed.W_E.detach().clone())")


def test_the_encoder_solution_passes_every_check():
    assert failing_checks(encoder_notebook()) == set()


@pytest.mark.parametrize("edits, costs", [
    ([NO_LN2], "PostNormBlock"),
    ([ONE_LAYER_NORM], "PostNormBlock"),
    ([ONE_LAYER_NORM, ("encoder_block", "super().__init__(cfg)", "PostNormBlock.__init__(self, cfg)")],
     "PostNormBlock"),
    ([COPIED_W_E], "TiedUnembed"),
    ([("tied", "return x @ self.W_E.T + self.b_U", "return x @ self.W_E.T")], "TiedUnembed"),
    ([("bert_embeddings", "self.W_pos[:posn]", "self.W_pos[1:posn + 1]")], "BertEmbeddings"),
    ([("encoder_block", "0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", "F.gelu(x, approximate='tanh')")],
     "EncoderBlock"),
    ([("encoder_block", "return attn_scores", "return super().apply_causal_mask(attn_scores)")], "EncoderBlock"),
], ids=["no_ln2", "one_layer_norm", "one_layer_norm_explicit_init", "copied_W_E", "no_bias", "positions_from_1",
        "tanh_gelu_erf", "causal_mask"])
def test_a_wrong_encoder_part_costs_only_its_own_check(edits, costs):
    """One wrong part in a notebook whose other answers are the solution's: only the part's own
    check fails. The EncoderBlock's check runs the learner's block on the course's PostNormBlock
    and BertForMLM's builds the learner's model with the course's BertEmbeddings, EncoderBlock,
    TiedUnembed and gelu_erf under those names (09 charged them to both composites as
    well); the learner's names and bases are theirs again afterwards."""
    notebook = encoder_notebook(*edits)
    names = dict(notebook)
    assert failing_checks(notebook) == {costs}
    assert all(notebook[name] is value for name, value in names.items())
    assert notebook["EncoderBlock"].__bases__ == (notebook["PostNormBlock"],)


@pytest.mark.parametrize("edits, check, message", [
    ([NO_LN2, ("encoder_block", "self.attn = BidirectionalAttention(cfg)\n        ", "")],
     "EncoderBlock", "Likely mistake: the causal mask is still applied"),
    ([COPIED_W_E, ("bert", "MLMHead(cfg, self.embed)", "MLMHead(cfg, BertEmbeddings(cfg))")],
     "BertForMLM", "Likely mistake: the MLM head's unembedding is not tied"),
], ids=["block_keeps_the_mask", "head_tied_to_another_embedding"])
def test_a_composite_on_wrong_parts_still_fails_its_own_mistake(edits, check, message):
    """The course's parts stand in for the learner's, not for the learner's use of them: an
    EncoderBlock that keeps the causal attention, or a head tied to an embedding of its own, is
    named as before."""
    notebook = encoder_notebook(*edits)
    fails_with(ENCODER_CHECKS[check], notebook[check], expected=message)
