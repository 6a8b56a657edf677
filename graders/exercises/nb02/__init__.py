"""Grader for 02_embeddings: `Embed` against hook_embed and `PosEmbed` against hook_pos_embed."""
from graders.judging.notebook import ExampleBug, Notebook
import math

import torch
import torch.nn.functional as F
from torch import nn

import graders.reference.components as course
from graders.judging.cases import Case, activations
from graders.judging.exercise import Exercise
from graders.judging.learner import loaded
from graders.reference.store import part
from graders.reference.config import Config
from graders.judging.compare import CheckFailed, Mistake, compare, require_tensor, with_fix
from graders.judging.learner import Forbidden, recorded_text, run_learner, text_record
from graders.integrity.library_kernels import EMBEDDING_KERNELS, TORCH_REFERENCES

DIMS = ("batch", "position", "d_model")
SMALL_SHAPE = (2, 5)     # the first, small input: ids below 768 so that index mix-ups do not crash


def _forbidden(what: str, course_class) -> Forbidden:
    return Forbidden(
        what,
        targets=[(nn.Embedding, "forward"), (F, "embedding"), (course_class, "forward")],
        source_words=["nn.Embedding", "F.embedding", "functional.embedding", "graders.reference.components"],
        kernels=EMBEDDING_KERNELS, library_code=TORCH_REFERENCES,
    )


FORBIDDEN_EMBED = _forbidden("the token embedding", course.Embed)
FORBIDDEN_POS = _forbidden("the positional embedding", course.PosEmbed)


def small_tokens(case: Case) -> torch.Tensor:
    """A [2, 5] batch of token ids in [0, 768), different in each row and from the positions."""
    generator = torch.Generator().manual_seed(1000 + case.seed)
    return torch.randint(10, Config().d_model, SMALL_SHAPE, generator=generator)


def _crash(outputs: dict) -> None:
    """Re-raise the learner's crash on the case's tokens, recorded by `_run`."""
    if "error" in outputs:
        raise CheckFailed(recorded_text(outputs["error"]))


def _run(what: str, module, tokens_small, tokens, forbidden) -> dict:
    """The learner's outputs on the small input, then on the case's tokens (a crash there is kept)."""
    outputs = {"small_out": run_learner(what, module, tokens_small, forbidden=forbidden)}
    before = tokens.clone()
    try:
        outputs["out"] = run_learner(what, module, tokens, forbidden=forbidden)
    except CheckFailed as err:   # reported by judge, after the small input had its say
        outputs["error"] = text_record(str(err))
    outputs["input_modified"] = torch.tensor(not torch.equal(tokens, before))
    return outputs


# --- Embed ------------------------------------------------------------------------------------

EMBED_FIX = "return self.W_E[tokens]"
EMBED_HINT = ("each token's embedding is the row of W_E its id names, whatever its position: one row per "
              "token of the [batch, position] tokens (look up indexing a tensor with a tensor).")


def embed_mistakes(W_E: torch.Tensor, tokens: torch.Tensor) -> dict:
    batch, seq = tokens.shape
    return {
        Mistake("indexed_by_position", "W_E is indexed by position (0, 1, 2, ...) instead of by token id: each "
                "token's row is W_E[token_id], whatever its position"):
            W_E[torch.arange(seq)].expand(batch, seq, -1),
        Mistake("scaled_by_sqrt_d_model", "the embedding is multiplied by sqrt(d_model) (the original "
                "Transformer paper does this; GPT-2 does not)"): W_E[tokens] * math.sqrt(W_E.shape[1]),
        Mistake("first_sequence_only", "every sequence in the batch uses the first sequence's tokens (tokens[0])"):
            W_E[tokens[0]].expand(batch, seq, -1),
        Mistake("ids_minus_one", "the token ids are off by one (W_E[tokens - 1]): row i of W_E is token i's"):
            W_E[tokens - 1],
        Mistake("ids_plus_one", "the token ids are off by one (W_E[tokens + 1], or rows shifted as in "
                "W_E[1:][tokens]): row i of W_E is token i's"): W_E[(tokens + 1).clamp(max=W_E.shape[0] - 1)],
    }


def _embed_shape(what: str, actual, tokens: torch.Tensor, W_E: torch.Tensor) -> None:
    require_tensor(what, actual)
    batch, seq = tokens.shape
    d_vocab, d_model = W_E.shape
    shape = tuple(actual.shape)
    note = None
    if shape == (d_vocab, d_model):
        note = Mistake("returns_whole_table", "it has the shape of W_E itself [d_vocab, d_model]: return the "
                       "rows the tokens name, not the whole table")
    elif len(shape) == 3 and shape[-1] == d_vocab:
        note = Mistake("transposed_table", "the last dimension is d_vocab, not d_model: you looked up rows "
                       "of W_E transposed. W_E is [d_vocab, d_model]: its rows are the tokens', one per id")
    elif shape == (seq, d_model):
        note = Mistake("batch_dim_missing", "the batch dimension is missing: index with the whole [batch, "
                       "position] tokens tensor, not with one sequence")
    if note:
        raise CheckFailed(with_fix(f"{what}: shape {list(shape)}, expected "
                                   f"[batch={batch}, position={seq}, d_model={d_model}].\n"
                                   f"  Likely mistake: {note}.", EMBED_FIX), mistake=note.key)


def produce_embed(Embed, case: Case, inputs: dict) -> dict:
    module = loaded("Embed", Embed, "embed")
    return _run("Embed", module, small_tokens(case), case.tokens(), FORBIDDEN_EMBED)


def judge_embed(case: Case, outputs: dict) -> None:
    W_E = part("embed")["W_E"]
    small = small_tokens(case)
    what = f"Embed output on random token ids of shape {list(SMALL_SHAPE)}"
    _embed_shape(what, outputs["small_out"], small, W_E)
    compare(what, outputs["small_out"], W_E[small], DIMS, mistakes=lambda: embed_mistakes(W_E, small),
            hint=EMBED_HINT, fix=EMBED_FIX)
    _crash(outputs)
    if bool(outputs["input_modified"]):
        raise CheckFailed("Embed changed its input tokens in place. Read them, don't write them.",
                          mistake="modifies_input_in_place")
    tokens = case.tokens()
    what = "Embed output (hook_embed)"
    _embed_shape(what, outputs["out"], tokens, W_E)
    compare(what, outputs["out"], activations(case)["hook_embed"], DIMS,
            mistakes=lambda: embed_mistakes(W_E, tokens), hint=EMBED_HINT, fix=EMBED_FIX)


embed = Exercise("02_embeddings", "Embed", produce_embed, judge_embed,
                  forbidden=(FORBIDDEN_EMBED,))
check_embed = embed.checker(
    "Grade the learner's `Embed` class (visible check: the reference text).")


# --- PosEmbed -------------------------------------------------------------------------------

POS_FIX = ('batch, seq_len = tokens.shape; return einops.repeat(self.W_pos[:seq_len], '
           '"posn d_model -> batch posn d_model", batch=batch)')
POS_HINT = ("the token at position p gets row p of W_pos, whatever the token, and every sequence of the "
            "batch gets the same rows (look up einops.repeat or Tensor.expand).")


def pos_embed_mistakes(W_pos: torch.Tensor, tokens: torch.Tensor) -> dict:
    batch, seq = tokens.shape
    n_ctx = W_pos.shape[0]
    mistakes = {}
    if int(tokens.max()) < n_ctx:
        mistakes[Mistake("indexed_by_token_id", "W_pos is indexed by the token ids instead of by the positions "
                         "0, 1, ..., seq_len - 1 (PosEmbed ignores which tokens they are, only how many)")] = \
            W_pos[tokens]
    mistakes.update({
        Mistake("offset_by_one", "the positions are offset by one (W_pos[1:seq_len + 1]): the first token is at "
                "position 0"):
            W_pos[1:seq + 1].expand(batch, seq, -1),
        Mistake("last_rows", "the last seq_len rows of W_pos (W_pos[-seq_len:]): position p is row p, from the "
                "first row"):
            W_pos[n_ctx - seq:].expand(batch, seq, -1),
        Mistake("positions_reversed", "the positions are in reverse order"): W_pos[:seq].flip(0).expand(batch, seq, -1),
        Mistake("scaled_by_sqrt_d_model", "the embedding is multiplied by sqrt(d_model) (GPT-2 does not scale it)"):
            W_pos[:seq].expand(batch, seq, -1) * math.sqrt(W_pos.shape[1]),
    })
    return mistakes


def _pos_shape(what: str, actual, tokens: torch.Tensor, W_pos: torch.Tensor) -> None:
    require_tensor(what, actual)
    batch, seq = tokens.shape
    n_ctx, d_model = W_pos.shape
    shape = tuple(actual.shape)
    note = None
    if shape == (seq, d_model):
        note = Mistake("batch_dim_missing", "the batch dimension is missing: the rows of W_pos are [position, "
                       "d_model]; repeat or expand them to [batch, position, d_model]")
    elif len(shape) == 3 and shape[0] == 1 and batch > 1 and shape[1:] == (seq, d_model):
        note = Mistake("batch_dim_one", "the batch dimension is 1: broadcast over the batch (einops.repeat or "
                       ".expand to the tokens' batch size), every sequence gets the same positional embeddings")
    elif shape == (n_ctx, d_model) or (len(shape) == 3 and shape[1] == n_ctx and seq != n_ctx):
        note = Mistake("all_rows_returned", f"all n_ctx={n_ctx} rows of W_pos are returned: take only as many "
                       "rows as the tokens have positions (the second dimension of their shape)")
    elif len(shape) == 3 and shape[0] == seq and shape[1] == batch and seq != batch:
        note = Mistake("batch_position_swapped", "batch and position are swapped: the output is [batch, position, "
                       "d_model]")
    if note:
        raise CheckFailed(with_fix(f"{what}: shape {list(shape)}, expected "
                                   f"[batch={batch}, position={seq}, d_model={d_model}].\n"
                                   f"  Likely mistake: {note}.", POS_FIX), mistake=note.key)


def produce_pos_embed(PosEmbed, case: Case, inputs: dict) -> dict:
    module = loaded("PosEmbed", PosEmbed, "pos_embed")
    return _run("PosEmbed", module, small_tokens(case), case.tokens(), FORBIDDEN_POS)


def judge_pos_embed(case: Case, outputs: dict) -> None:
    W_pos = part("pos_embed")["W_pos"]
    small = small_tokens(case)
    what = f"PosEmbed output on random token ids of shape {list(SMALL_SHAPE)}"
    _pos_shape(what, outputs["small_out"], small, W_pos)
    compare(what, outputs["small_out"], W_pos[:SMALL_SHAPE[1]].expand(*SMALL_SHAPE, -1), DIMS,
            mistakes=lambda: pos_embed_mistakes(W_pos, small), hint=POS_HINT, fix=POS_FIX)
    _crash(outputs)
    if bool(outputs["input_modified"]):
        raise CheckFailed("PosEmbed changed its input tokens in place. Read them, don't write them.",
                          mistake="modifies_input_in_place")
    tokens = case.tokens()
    what = "PosEmbed output (hook_pos_embed)"
    _pos_shape(what, outputs["out"], tokens, W_pos)
    compare(what, outputs["out"], activations(case)["hook_pos_embed"], DIMS,
            mistakes=lambda: pos_embed_mistakes(W_pos, tokens), hint=POS_HINT, fix=POS_FIX)


pos_embed = Exercise("02_embeddings", "PosEmbed", produce_pos_embed, judge_pos_embed,
                      forbidden=(FORBIDDEN_POS,))
check_pos_embed = pos_embed.checker(
    "Grade the learner's `PosEmbed` class (visible check: the reference text).")


NOTEBOOK = Notebook(
    '02_embeddings',
    # The classic mistake of the example class's buggy student: positions offset by one.
    ExampleBug('pos_embed_answer', 'self.W_pos[:seq_len]',
               'self.W_pos[1:seq_len + 1]',
               costs=('pos_embed_test',), named='offset by one'),
    pictures=1,
    course_code=('reference/components.py',),
)
