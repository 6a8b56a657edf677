"""Notebook 09, exercise 4: an encoder (BERT), judged against transformers' BertForMaskedLM.

The grader draws seeded weights under Hugging Face's names (graders.reference.bert), loads them
into the learner's modules through the course's converter and, on the judge's side, strictly into
`BertForMaskedLM` from a small `BertConfig`. Three checks, like 02, 05 and 06 against GPT-2:
`BertEmbeddings` (word + position + segment, then LayerNorm), `EncoderBlock` (post-norm,
bidirectional attention, the erf GELU; the first differing value named, as for the post-norm
block) and the whole `BertForMLM` (every layer's output in order, the logits of the tied MLM
head, and the parameter count).

A part with a check of its own costs only that check: the EncoderBlock's check runs the learner's
block on the course's PostNormBlock, and BertForMLM's builds the learner's model with the course's
embeddings, blocks, tied unembedding and erf GELU under the notebook's names for them.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
from functools import lru_cache
from importlib.metadata import version

import torch
from torch import nn
import torch.nn.functional as F

from graders.exercises.nb09 import norms
from graders.exercises.nb09.tasks import CLS, mlm_config, seeded_residual
from graders.exercises.common.submodules import CallRecorder
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, check_shape, compare, with_fix
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, build_loaded, course_functions, run_learner
from graders.reference import bert, components
from graders.reference.weights import component, load_strict
from graders.marks import course_answer

DIMS = ("batch", "position", "d_model")
LOGIT_DIMS = ("batch", "position", "d_vocab")
FORBIDDEN = Forbidden(
    "the encoder",
    targets=[(F, "scaled_dot_product_attention"), (nn.MultiheadAttention, "forward"),
             (nn.TransformerEncoderLayer, "forward"), (nn.Embedding, "forward"), (F, "embedding"),
             (nn.LayerNorm, "forward"), (F, "layer_norm")],
    source_words=["scaled_dot_product_attention", "F.scaled_dot_product_attention", "nn.MultiheadAttention",
                  "nn.TransformerEncoderLayer",
                  "nn.TransformerEncoder", "nn.Embedding", "F.embedding", "nn.LayerNorm", "F.layer_norm",
                  "BertForMaskedLM"])


@lru_cache(maxsize=4)
def hf_weights(seed: int) -> dict:
    return bert.random_hf_weights(mlm_config(), 500 + seed)


def weights(seed: int) -> dict:
    return bert.course_weights(hf_weights(seed), mlm_config())


@lru_cache(maxsize=2)
def hf_reference(seed: int):
    """transformers' BertForMaskedLM with the case's weights (judge side only)."""
    return bert.hf_model(mlm_config(), hf_weights(seed))


FORMAT = 1


def hf_outputs(case: Case) -> dict[str, torch.Tensor]:
    """Every output of BertForMaskedLM that the encoder checks of `case` compare with, computed
    once and kept in the course cache (key: the case, the weights, the config, the library
    versions), so that grading again neither imports transformers nor runs it. Judge side only:
    a grading kernel cannot read the cache."""
    from safetensors.torch import load_file, save_file

    from graders.reference.paths import atomic_write, cache_dir

    weights_digest = hashlib.sha256(b"".join(name.encode() + tensor.numpy().tobytes() for name, tensor
                                             in sorted(hf_weights(case.seed).items()))).hexdigest()
    key = json.dumps({"format": FORMAT, "case": dataclasses.asdict(case), "weights": weights_digest,
                      "config": dataclasses.asdict(mlm_config()),
                      "versions": [version(p) for p in ("torch", "transformers")]}, sort_keys=True)
    path = cache_dir("bert-reference") / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.safetensors"
    if path.is_file():
        try:
            return load_file(path)
        except Exception:  # a truncated or corrupt file: compute it again
            path.unlink(missing_ok=True)
    hf, outputs = hf_reference(case.seed), {}
    with torch.no_grad():
        for i, (tokens, types) in enumerate((sequences(case), sequences(case, 1, 5))):
            out = hf(input_ids=tokens, token_type_ids=types, output_hidden_states=True)
            for name, value in zip(_order(mlm_config().n_layers), list(out.hidden_states) + [out.logits]):
                outputs[f"{i}.{name}"] = value.contiguous()
        for i, x in enumerate(_block_inputs(case)):
            outputs[f"layer.{i}"] = hf.bert.encoder.layer[case.block](x).contiguous()
    outputs["n_params"] = torch.tensor(sum(p.numel() for p in hf.parameters()))
    atomic_write(path, lambda temporary: save_file(outputs, temporary))
    return outputs


def sequences(case: Case, batch: int | None = None, seq: int | None = None):
    """(tokens, token_types): random tokens after a [CLS]; segment 1 from a random boundary on."""
    batch, seq = batch or case.batch, seq or case.seq
    generator = torch.Generator().manual_seed(600 + case.seed + 31 * seq)
    tokens = torch.randint(0, mlm_config().d_vocab, (batch, seq), generator=generator)
    tokens[:, 0] = CLS
    boundary = torch.randint(1, seq, (batch, 1), generator=generator)
    return tokens, (torch.arange(seq) >= boundary).long()


# --- BertEmbeddings --------------------------------------------------------------------------

def produce_embeddings(BertEmbeddings, case: Case, inputs: dict) -> dict:
    embed = build_loaded("BertEmbeddings", BertEmbeddings, mlm_config(), component(weights(case.seed), "embed"))
    outputs = {}
    for i, (tokens, types) in enumerate((sequences(case), sequences(case, 1, 5))):
        outputs[f"out_{i}"] = run_learner("BertEmbeddings", embed, tokens, types, forbidden=FORBIDDEN)
    return outputs


def embedding_mistakes(w: dict, tokens, types) -> dict:
    seq, eps = tokens.shape[1], mlm_config().layer_norm_eps
    E, P, T = w["embed.W_E"][tokens], w["embed.W_pos"][:seq], w["embed.W_type"][types]

    def ln(x, eps=eps):
        centred = x - x.mean(-1, keepdim=True)
        scale = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        return centred / scale * w["embed.ln.w"] + w["embed.ln.b"]

    return {
        Mistake("no_layernorm", "the LayerNorm is missing: BERT normalises the sum of its embeddings (GPT-2 "
                "does not)"): E + P + T,
        Mistake("no_token_type_embeddings", "the token-type (segment) embeddings are not added: each token also "
                "gets the row of W_type its type names"): ln(E + P),
        Mistake("no_positional_embeddings", "the positional embeddings are not added: each token also gets the "
                "row of W_pos of its position"):
            ln(E + T),
        Mistake("positions_from_one", "the positions start at 1: position p uses row p of W_pos, from 0"):
            ln(E + w["embed.W_pos"][1:seq + 1] + T),
        Mistake("gpt2_layernorm_eps", "LayerNorm's eps is 1e-5 (GPT-2's): BERT's is 1e-12 (cfg.layer_norm_eps), "
                "and these embeddings are small enough (variance ~1e-3) for it to matter"): ln(E + P + T, 1e-5),
        Mistake("only_token_embeddings_normalised", "only the token embeddings are normalised: the LayerNorm "
                "normalises the sum of the three"):
            ln(E) + P + T,
    }


EMBEDDINGS_FIX = ("summed = self.W_E[tokens] + self.W_pos[:posn] + self.W_type[token_types]; "
                  "return self.ln(summed)")


def judge_embeddings(case: Case, outputs: dict) -> None:
    expected_outputs = hf_outputs(case)
    for i, (tokens, types) in enumerate((sequences(case), sequences(case, 1, 5))):
        expected = expected_outputs[f"{i}.embed"]
        compare(f"BertEmbeddings on tokens of shape {list(tokens.shape)}", outputs.get(f"out_{i}"), expected,
                DIMS, mistakes=lambda: embedding_mistakes(weights(case.seed), tokens, types),
                hint="BERT adds three embeddings, of the tokens, of their positions (from 0) and of their "
                     "types, then normalises the sum with its LayerNorm (eps from cfg).",
                fix=EMBEDDINGS_FIX)


embeddings_exercise = Exercise("09_transformer_family", "BertEmbeddings", produce_embeddings,
                               judge_embeddings, forbidden=(FORBIDDEN,),
                               defaults={"text": None, "batch": 2, "seq": 12})
check_bert_embeddings = embeddings_exercise.checker(
    "Grade `BertEmbeddings` against BertForMaskedLM's embeddings (seeded weights and tokens).")


# --- EncoderBlock ------------------------------------------------------------------------------

class Swap:
    """A mistake made by replacing submodules of the reference block with the course's GPT-2 ones."""
    swaps = True

    def __init__(self, **classes):
        self.classes = classes

    def __call__(self, block: nn.Module) -> nn.Module:
        wrong = copy.deepcopy(block)
        for name, cls in self.classes.items():
            module = cls(block.attn.cfg)
            module.load_state_dict(getattr(block, name).state_dict(), strict=False)
            setattr(wrong, name, module)
        return wrong


ENCODER_MISTAKES = {
    Mistake("causal_mask_applied", "the causal mask is still applied: in an encoder every position attends to "
            "every position (override apply_causal_mask so that it masks nothing)"): Swap(attn=components.Attention),
    Mistake("tanh_gelu", "the MLP uses GPT-2's tanh GELU (gelu_new): BERT uses the exact GELU, with the erf "
            "(gelu_erf)"):
        Swap(mlp=components.MLP),
    **norms.POST_NORM_MISTAKES,
}
# Where the encoder block differs from the post-norm block, the check cannot tell which line is wrong.
ENCODER_FIXES = {**norms.FIXES, "attn_out": "", "mlp_out": ""}
ENCODER_HINTS = {**norms.HINTS,
                 "attn_out": "BERT's attention has no mask: every position attends to every position.",
                 "mlp_out": "BERT's MLP is GPT-2's with the exact erf GELU instead of the tanh one."}


def _block_inputs(case: Case) -> list[torch.Tensor]:
    d_model = mlm_config().d_model
    return [seeded_residual(case.seed, case.batch, case.seq, d_model),
            seeded_residual(case.seed + 1, 1, 5, d_model)]


def _notebooks_post_norm(cls: type) -> bool:
    """Whether `cls` is the learner's PostNormBlock (the class of that name that is not the course's)."""
    return cls.__name__ == "PostNormBlock" and cls is not bert.PostNormBlock


@contextlib.contextmanager
def on_course_post_norm(EncoderBlock):
    """The learner's EncoderBlock on the course's PostNormBlock while the check runs, where it
    inherits the notebook's (`class EncoderBlock(PostNormBlock)`, as the notebook suggests), and
    with the course's under that name (`PostNormBlock.__init__(self, cfg)`): PostNormBlock has a
    check of its own, so a mistake in it costs that check only. The bases are put back after."""
    heirs = [(cls, cls.__bases__) for cls in getattr(EncoderBlock, "__mro__", ())
             if any(_notebooks_post_norm(base) for base in cls.__bases__)]
    try:
        for cls, bases in heirs:
            cls.__bases__ = tuple(bert.PostNormBlock if _notebooks_post_norm(b) else b for b in bases)
        with course_functions(EncoderBlock, {"PostNormBlock": bert.PostNormBlock}):
            yield
    finally:
        for cls, bases in heirs:
            cls.__bases__ = bases


def produce_block(EncoderBlock, case: Case, inputs: dict) -> dict:
    with on_course_post_norm(EncoderBlock):
        block = build_loaded("EncoderBlock", EncoderBlock, mlm_config(),
                             component(weights(case.seed), f"blocks.{case.block}"))
        return norms.run_block(f"EncoderBlock (blocks.{case.block})", block, _block_inputs(case), FORBIDDEN)


def judge_block(case: Case, outputs: dict) -> None:
    reference = load_strict(bert.EncoderBlock(mlm_config()),
                            component(weights(case.seed), f"blocks.{case.block}")).eval()
    xs = _block_inputs(case)
    expected = [hf_outputs(case)[f"layer.{i}"] for i in range(len(xs))]
    norms.judge_block(f"EncoderBlock (blocks.{case.block})", outputs, xs, reference, ENCODER_MISTAKES,
                      ENCODER_HINTS, ENCODER_FIXES, expected)


block_exercise = Exercise("09_transformer_family", "EncoderBlock", produce_block, judge_block,
                          forbidden=(FORBIDDEN,), defaults={"text": None, "batch": 2, "seq": 12},
                          guard=Guard(supplies=(bert.PostNormBlock,)))   # its base for the check (on_course_post_norm)
check_encoder_block = block_exercise.checker(
    "Grade `EncoderBlock` against a layer of BertForMaskedLM (seeded weights and residual streams).")


# --- BertForMLM ------------------------------------------------------------------------------

def _order(n_layers: int) -> list[str]:
    return ["embed"] + [f"blocks.{i}" for i in range(n_layers)] + ["logits"]


@course_answer("BertEmbeddings")
class CourseEmbeddings(bert.BertEmbeddings):
    """The course's BertEmbeddings with the course's LayerNorm of tensor operations: the fused one
    calls F.layer_norm, which this check refuses while the learner's model runs."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.ln = components.LayerNorm(cfg)


@course_answer("EncoderBlock")
class CourseEncoderBlock(bert.PostNormBlock):
    """The course's EncoderBlock with the course's LayerNorm of tensor operations (see above)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.attn, self.mlp = bert.BidirectionalAttention(cfg), bert.BertMLP(cfg)


# The parts BertForMLM builds or calls that have checks of their own (gelu_erf is checked with the
# EncoderBlock), under the notebook's names: the model's check uses the course's, so that a mistake in one costs
# that check only. MLMHead and BertForMLM themselves, how they build, tie and call these, are the
# learner's.
MODEL_PARTS = {"BertEmbeddings": CourseEmbeddings, "EncoderBlock": CourseEncoderBlock,
               "TiedUnembed": bert.TiedUnembed, "gelu_erf": bert.gelu_erf}


def produce_model(BertForMLM, case: Case, inputs: dict) -> dict:
    cfg = mlm_config()
    model = build_loaded("BertForMLM", BertForMLM, cfg, weights(case.seed), load=bert.load_tied)
    blocks = getattr(model, "blocks", None)
    named = {"embed": getattr(model, "embed", None)}
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        named.update({f"blocks.{i}": b for i, b in enumerate(blocks)})
    (tokens, types), second = sequences(case), sequences(case, 1, 5)
    with CallRecorder(named) as rec:
        logits = run_learner("BertForMLM", model, tokens, types, forbidden=FORBIDDEN)
    outputs = {name: rec.call(name)[1] for name in named if rec.call(name) is not None}
    outputs = {k: v for k, v in outputs.items() if isinstance(v, torch.Tensor)}
    outputs["logits"] = logits
    outputs["second_logits"] = run_learner("BertForMLM", model, *second, forbidden=FORBIDDEN)
    outputs["n_params"] = torch.tensor(sum(p.numel() for p in model.parameters()))
    return outputs


def head_mistakes(w: dict, h: torch.Tensor) -> dict:
    eps = mlm_config().layer_norm_eps

    def ln(x):
        centred = x - x.mean(-1, keepdim=True)
        scale = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        return centred / scale * w["mlm_head.ln.w"] + w["mlm_head.ln.b"]

    dense = h @ w["mlm_head.W_dense"] + w["mlm_head.b_dense"]
    W_U, b_U = w["embed.W_E"].T, w["mlm_head.unembed.b_U"]
    return {
        Mistake("head_tanh_gelu", "the MLM head uses GPT-2's tanh GELU: BERT's head uses the exact erf GELU"):
            ln(components.gelu_new(dense)) @ W_U + b_U,
        Mistake("head_no_gelu", "the MLM head has no GELU: dense, GELU, LayerNorm, then the tied "
                "unembedding"): ln(dense) @ W_U + b_U,
        Mistake("head_no_layernorm", "the MLM head skips its LayerNorm: dense, GELU, LayerNorm, then the tied "
                "unembedding"):
            bert.gelu_erf(dense) @ W_U + b_U,
        Mistake("head_no_dense", "the MLM head skips its dense layer: it transforms the last residual stream "
                "(dense, GELU, LayerNorm) before the tied unembedding"): ln(bert.gelu_erf(h)) @ W_U + b_U,
        Mistake("no_prediction_bias", "the prediction bias b_U is not added"): ln(bert.gelu_erf(dense)) @ W_U,
    }


def judge_model(case: Case, outputs: dict) -> None:
    cfg, reference = mlm_config(), hf_outputs(case)
    expected = {name: reference[f"0.{name}"] for name in _order(cfg.n_layers)}
    check_shape("BertForMLM logits", outputs.get("logits"), expected["logits"].shape, LOGIT_DIMS)
    hints = {"embed": "the model starts with embed(tokens, token_types).",
             "logits": "logits = mlm_head(the last block's output)."}
    for i in range(cfg.n_layers):
        hints[f"blocks.{i}"] = f"blocks[{i}] reads the output of " + (
            "embed." if i == 0 else f"blocks[{i - 1}].")
    for depth, key in enumerate(_order(cfg.n_layers)):
        actual = outputs.get(key)
        if actual is None:
            raise CheckFailed(f"BertForMLM: could not see the output of {key}. Name the submodules "
                              "`embed`, `blocks` (an nn.ModuleList) and `mlm_head`, and call each once.")
        last = expected[f"blocks.{cfg.n_layers - 1}"]
        mistakes = head_mistakes(weights(case.seed), last) if key == "logits" else {}
        compare(f"BertForMLM: the output of {key}, compared layer by layer with BertForMaskedLM,",
                actual, expected[key], LOGIT_DIMS if key == "logits" else DIMS, mistakes=mistakes,
                hint=hints[key], depth=max(depth, 1))
    compare("BertForMLM logits on a second input of shape [1, 5]", outputs.get("second_logits"),
            reference["1.logits"], LOGIT_DIMS, depth=cfg.n_layers + 1)
    expected_count = int(reference["n_params"])
    count = int(outputs["n_params"])
    if count != expected_count:
        copy_size = cfg.d_vocab * cfg.d_model
        untied = count - expected_count == copy_size
        raise CheckFailed(with_fix(
            f"BertForMLM has {count:,} parameters, BertForMaskedLM {expected_count:,}."
            + (f"\n  Likely mistake: the MLM head's unembedding is not tied: it holds its own "
               f"[{cfg.d_vocab}, {cfg.d_model}] matrix. Build it from the model's own embedding (TiedUnembed)."
               if untied else ""), "self.unembed = TiedUnembed(embed)" if untied else ""),
            mistake="head_unembedding_not_tied" if untied else None)


model_exercise = Exercise("09_transformer_family", "BertForMLM", produce_model,
                          judge_model, forbidden=(FORBIDDEN,), defaults={"text": None, "batch": 2, "seq": 12},
                          course_parts=MODEL_PARTS)
check_bert = model_exercise.checker(
    "Grade `BertForMLM` layer by layer against BertForMaskedLM (seeded weights and tokens).")
