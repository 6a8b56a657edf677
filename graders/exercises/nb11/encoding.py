"""Notebook 11, exercise 5: `bpe` and `encode` with GPT-2's merges, judged token for token against
tiktoken's GPT-2 encoding on hidden texts; then `bpe` again with other ranks (merges the course's
trainer learns from the text itself), as the notebook's Shakespeare comparison calls it. The
course's pre-tokenizer and byte table run under the learner's names in this check, so a mistake in
either costs its own exercise only. A mistake is named from the first pre-token whose tokens differ
and the cut the learner's code made of it (a ranked pair left side by side, the highest rank first,
another pre-token's tokens)."""
from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache

import torch

from graders.exercises.nb11 import reference as ref
from graders.exercises.nb11.libraries import refuse_library_parts
from graders.exercises.nb11.pieces import TIKTOKEN, _text, _where
from graders.exercises.nb11.wire import (as_list, ids_tensor, pieces_tensors, tensor_text, tensors_pieces, text_tensor)
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, keyed_like, mistake_key
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import course_functions, run_learner
from graders.reference.tokenizer import END_OF_TEXT, bpe_files, gpt2_encoding

NOTEBOOK = "11_tokenizer"
OTHER_MERGES = 60   # the ranks `bpe` is called with a second time: the text's own first merges


class CourseTable(dict):
    """The course's byte table, supplied to a check under the learner's name for it (hashable, as
    the parts a check supplies are). Filled by the check that supplies it, not when the module is
    imported: the kernel that grades the table itself holds no course table
    (graders.integrity.kernel_plan)."""
    __hash__ = object.__hash__

    def __init__(self, make):
        super().__init__()
        self._make = make

    def fill(self) -> "CourseTable":
        if not self:
            self.update(self._make())
        return self


ENCODE_PARTS = {"pretokenize": ref.pretokenize, "bytes_to_unicode": ref.bytes_to_unicode,
                "byte_encoder": CourseTable(ref.bytes_to_unicode)}


def _written(text: str) -> list[str]:
    """The distinct pre-tokens of `text`, in order, written in the byte table's characters."""
    table = ref.bytes_to_unicode()
    return list(dict.fromkeys("".join(table[b] for b in chunk.encode("utf-8")) for chunk in ref.pretokenize(text)))


def _other_ranks(merges: list[tuple[bytes, bytes]]) -> dict[tuple[str, str], int]:
    table = ref.bytes_to_unicode()
    return {("".join(table[b] for b in left), "".join(table[b] for b in right)): rank
            for rank, (left, right) in enumerate(merges)}


def inputs_encode(case: Case) -> dict:
    """The text, and the other ranks `bpe` is called with (as the byte strings of their pairs)."""
    merges = ref.train_bpe(_text(case), OTHER_MERGES)
    lefts, left_lengths = pieces_tensors([left for left, _ in merges])
    rights, right_lengths = pieces_tensors([right for _, right in merges])
    return {"text": text_tensor(_text(case)), "lefts": lefts, "left_lengths": left_lengths,
            "rights": rights, "right_lengths": right_lengths}


# --- In the kernel: the learner's code run ------------------------------------------------------

def _named_crash(failure: CheckFailed) -> str | None:
    """The mistake a KeyError of the learner's encode shows: a pair (a rank looked up that is not
    there), a key that is no byte's character (the byte table skipped), or a code point above 255
    (characters, not bytes)."""
    cause = failure.__cause__
    key = cause.args[0] if isinstance(cause, KeyError) and cause.args else None
    if isinstance(key, tuple) and len(key) == 2:
        return Mistake("unranked_pair_lookup", "a pair with no rank looked up with ranks[pair]: most adjacent "
                       "pairs are not merges; make them lose to every ranked pair instead of raising, and stop when "
                       "no pair has a rank")
    if isinstance(key, int) and key > 255:
        return Mistake("code_points", "code points, not bytes: a character's code point is no byte value; map "
                       "each byte of chunk.encode(\"utf-8\") through byte_encoder")
    if isinstance(key, str) and any(ord(c) <= 32 or 127 <= ord(c) <= 160 for c in key):
        return Mistake("table_skipped", "the byte table skipped: map each byte of the UTF-8 text through "
                       "byte_encoder before the merges (vocab.bpe and encoder.json are written in its characters: "
                       "'Ġ' for a space)")
    return None


def _run(what: str, fn, *args, **kwargs):
    try:
        return run_learner(what, fn, *args, forbidden=TIKTOKEN, **kwargs)
    except CheckFailed as failure:
        named = _named_crash(failure)
        if named:
            raise CheckFailed(f"{what} raised {failure.__cause__!r}. Likely mistake: {named}.",
                              mistake=mistake_key(named)) from None
        raise


def produce_encode(learner, case: Case, inputs: dict) -> dict:
    encode, bpe = learner
    ENCODE_PARTS["byte_encoder"].fill()
    text, out = tensor_text(inputs["text"]), {}
    with course_functions(encode, ENCODE_PARTS):
        refuse_library_parts("encode", learner, "GPT-2's tokenizer")
        for name, allow in (("ordinary", False), ("special", True)):
            ids = _run("encode", encode, text, allow_special=allow)
            out[name] = ids_tensor(as_list("encode", ids, int, "a list of ints (token ids)"))
        ranks = _other_ranks(list(zip(tensors_pieces(inputs["lefts"], inputs["left_lengths"]),
                                      tensors_pieces(inputs["rights"], inputs["right_lengths"]))))
        cuts = [as_list("bpe", _run("bpe", bpe, word, ranks), str, "a list of str (tokens)")
                for word in _written(text)]
    out["other_tokens"], out["other_lengths"] = pieces_tensors([t.encode("utf-8") for cut in cuts for t in cut])
    out["other_counts"] = torch.tensor([len(cut) for cut in cuts], dtype=torch.int64)
    return out


# --- In the judge: what the learner's cuts show --------------------------------------------------

@lru_cache(maxsize=1)
def _files() -> tuple[dict, dict]:
    """(encoder.json, vocab.bpe's ranks), as the notebook reads them."""
    encoder_json, vocab_bpe = bpe_files()
    encoder = json.loads(encoder_json.read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in vocab_bpe.read_text(encoding="utf-8").splitlines()[1:] if line]
    return encoder, {pair: rank for rank, pair in enumerate(merges)}


def _greedy(word: str, vocabulary) -> list[str]:
    tokens, i = [], 0
    while i < len(word):
        j = max(j for j in range(i + 1, len(word) + 1) if j == i + 1 or word[i:j] in vocabulary)
        tokens.append(word[i:j])
        i = j
    return tokens


def _merging(word: str, ranks: dict, choose) -> list[str]:
    """`word` merged pair by pair, `choose` picking each time among the ranked adjacent pairs."""
    symbols = list(word)
    while True:
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            return symbols
        best = choose(pairs)
        at = next(i for i in range(len(symbols) - 1) if (symbols[i], symbols[i + 1]) == best)
        symbols[at:at + 2] = [best[0] + best[1]]


def _one_pass(word: str, ranks: dict) -> list[str]:
    tokens = [word[0]]
    for char in word[1:]:
        if (tokens[-1], char) in ranks:
            tokens[-1] += char
        else:
            tokens.append(char)
    return tokens


ONE_PASS = Mistake("stops_early", "the merges stop early (one left-to-right pass, or a loop that ends too soon): "
                   "repeat until no adjacent pair has a rank, merging the lowest-ranked pair each time")


def _as_they_come(word: str, ranks: dict) -> list[str]:
    """One left-to-right pass that merges any ranked pair as soon as it forms, rank ignored."""
    tokens: list[str] = []
    for char in word:
        tokens.append(char)
        while len(tokens) > 1 and (tokens[-2], tokens[-1]) in ranks:
            tokens[-2:] = [tokens[-2] + tokens[-1]]
    return tokens


def _in_passes(word: str, ranks: dict) -> list[str]:
    """Passes from left to right, each merging every ranked pair it meets, rank ignored."""
    symbols, merged = list(word), True
    while merged:
        out, i, merged = [], 0, False
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) in ranks:
                out.append(symbols[i] + symbols[i + 1])
                i, merged = i + 2, True
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return symbols


RANKS_IGNORED = ("the ranks ignored: {how}; BPE merges the lowest-ranked pair of the whole pre-token first (the "
                 "earliest line of vocab.bpe), then looks again")


def cut_mistakes(word: str, ranks: dict) -> dict[str, list[str]]:
    """Wrong cuts of one pre-token (in the table's characters), by what their mistake is called."""
    vocabulary = {a + b for a, b in ranks} | set(word)
    return {
        Mistake("greedy", "greedy longest match: the longest vocabulary token at each position is not what BPE "
                "makes; merge the pair of lowest rank (earliest in vocab.bpe) first, again and again"):
            _greedy(word, vocabulary),
        Mistake("highest_rank_first", "the highest rank merged first: the lowest rank (the earliest line of "
                "vocab.bpe) goes first"): _merging(word, ranks, lambda pairs: max(pairs, key=ranks.get)),
        Mistake("merged_as_formed", RANKS_IGNORED.format(
            how="any ranked pair merged as soon as it forms, in one pass from left to right")):
            _as_they_come(word, ranks),
        Mistake("merged_in_passes", RANKS_IGNORED.format(
            how="each pass from left to right merges every ranked pair it meets")): _in_passes(word, ranks),
        Mistake("most_frequent_pair", "the most frequent pair merged in place of the lowest-ranked one: encoding "
                "follows the ranks, the order in which the merges were learned"):
            _merging(word, ranks, lambda pairs: Counter(pairs).most_common(1)[0][0]),
        ONE_PASS: _one_pass(word, ranks),
    }


def _cut_diagnosis(word: str, mine: list[str], right: list[str], ranks: dict, cuts=()) -> str:
    """Why the learner's cut of `word` (its bytes right) is not the reference's. `cuts` are the
    (pre-token, learner's cut) of the text's other pre-tokens, right or wrong: a mistake is named
    only when its cut is the learner's on every one of them."""
    left = next(((a, b) for a, b in zip(mine, mine[1:]) if (a, b) in ranks), None)
    if left is not None:
        return keyed_like(ONE_PASS,
                       f"{left} (rank {ranks[left]}) is still side by side in yours. Likely mistake: {ONE_PASS}.")
    named = [name for name, made in cut_mistakes(word, ranks).items() if made == mine]
    for other, cut in cuts:
        if not named:
            break
        variants = cut_mistakes(other, ranks)
        named = [name for name in named if variants[name] == cut]
    if named:   # two when they cut every pre-token of this text alike: both are said
        also = f" Or: {named[1]}; the two cut every pre-token of this text alike." if len(named) > 1 else ""
        return keyed_like(named[0], f"Likely mistake: {named[0]}.{also}")
    order, symbols = [], list(word)
    while len(order) < 6 and symbols != right:
        best = min(zip(symbols, symbols[1:]), key=lambda pair: ranks.get(pair, float("inf")))
        order.append(f"{best[0]}+{best[1]} (rank {ranks[best]})")
        symbols = ref.merge_pair(symbols, best)
    return ("The same bytes, cut otherwise, with no ranked pair left: the merges were made in another order "
            f"than their ranks. The reference merges this pre-token {', '.join(order)}"
            f"{', ...' if symbols != right else ''}.")


def _chunks(text: str, allow_special: bool) -> list[tuple[str, list[int]]]:
    """(pre-token, tiktoken's ids of it), in order; the special token as a chunk of its own."""
    encoding, found = gpt2_encoding(), []
    for n, piece in enumerate(text.split(END_OF_TEXT) if allow_special else [text]):
        if n:
            found.append((END_OF_TEXT, [encoding.eot_token]))
        found += [(chunk, encoding.encode_ordinary(chunk)) for chunk in ref.pretokenize(piece)]
    return found


def _aligned(theirs: list[int], chunks: list) -> list[tuple[str, list[int]]]:
    """Each pre-token with the learner's ids that spell it, as far as they spell the text and end
    where its pre-tokens end."""
    encoding, found, i = gpt2_encoding(), [], 0
    for chunk, _ in chunks:
        wanted, spelled, mine = chunk.encode("utf-8"), b"", []
        while len(spelled) < len(wanted) and i < len(theirs) and 0 <= theirs[i] < encoding.n_vocab:
            spelled += encoding.decode_single_token_bytes(theirs[i])
            mine.append(theirs[i])
            i += 1
        if spelled != wanted:
            break
        found.append((chunk, mine))
    return found


def _first_difference(theirs: list[int], expected: list[int], text: str, allow_special: bool) -> str:
    """Where the learner's ids first part from tiktoken's (the pre-token, its tokens either way), and
    what the learner's tokens there show."""
    encoding, table = gpt2_encoding(), ref.bytes_to_unicode()
    at = next((i for i, (a, b) in enumerate(zip(theirs, expected)) if a != b), min(len(theirs), len(expected)))
    if at == len(expected):
        more = len(theirs) - at
        return (f"{more} more token{'s' if more > 1 else ''} than tiktoken's {at}, after all of them: "
                f"{theirs[at:at + 8]}.")
    valid = all(0 <= i < encoding.n_vocab for i in theirs)
    if valid and max(map(ord, text)) < 256 and encoding.decode_bytes(theirs) == bytes(map(ord, text)) != text.encode():
        return Mistake("code_points", "your tokens spell the text's code points, one byte each. Likely mistake: "
                       "code points, not bytes: map each byte of chunk.encode(\"utf-8\") through byte_encoder.")
    chunks, position = _chunks(text, allow_special), 0
    for index, (chunk, right) in enumerate(chunks):
        if position + len(right) > at:
            break
        position += len(right)
    start = sum(len(c) for c, _ in chunks[:index])
    spelled, mine = b"", []
    for token in theirs[position:]:
        if not 0 <= token < encoding.n_vocab or len(spelled) >= len(chunk.encode("utf-8")):
            break
        mine.append(token)
        spelled += encoding.decode_single_token_bytes(token)

    def pieces(ids: list[int]) -> list[bytes]:
        return [encoding.decode_single_token_bytes(i) for i in ids if 0 <= i < encoding.n_vocab]

    head = (f"token {at} is {theirs[at] if at < len(theirs) else 'missing'}, expected {expected[at]}, in the "
            f"pre-token {chunk!r} (at character {start}): yours {pieces(mine)}, tiktoken's {pieces(right)}.")
    wanted = chunk.encode("utf-8")
    if spelled.startswith(wanted) and len(spelled) > len(wanted):
        return Mistake("merges_across_pretokens", head + (
            " A token of yours runs past the end of this pre-token. Likely mistake: merges across "
            "pre-tokens: pre-tokenize first, and merge inside each pre-token only."))
    if spelled != wanted:
        other = next((c for c, ids in chunks if c != chunk and theirs[position:position + len(ids)] == ids), None)
        if other is not None:
            return Mistake("cache_key_not_pretoken", head + (
                f" Yours are tiktoken's tokens of another pre-token, {other!r}. Likely mistake: a cache "
                "whose key is not the pre-token itself (stripped, or changed otherwise): key it on the "
                "whole pre-token."))
        return head + " Your tokens spell other bytes than the text: check the byte table and the ids."
    _, ranks = _files()

    def written(ids: list[int]) -> list[str]:
        return ["".join(table[b] for b in piece) for piece in pieces(ids)]

    cuts = [("".join(written(tiktokens)), written(ids))
            for (_, ids), (_, tiktokens) in zip(_aligned(theirs, chunks), chunks)]
    diagnosis = _cut_diagnosis("".join(written(right)), written(mine), written(right), ranks, cuts)
    return keyed_like(diagnosis, head + " " + diagnosis)


def _judge_ids(case: Case, outputs: dict) -> None:
    text, encoding = _text(case), gpt2_encoding()
    ordinary, special = outputs["ordinary"].tolist(), outputs["special"].tolist()
    wanted_special = encoding.encode(text, allowed_special={END_OF_TEXT})
    wanted_ordinary = encoding.encode_ordinary(text)
    for mode, theirs, expected in (("", ordinary, wanted_ordinary),
                                   (" with allow_special=True", special, wanted_special)):
        if theirs == expected:
            continue
        where = f"encode on {_where(case)}{mode}"
        if mode and END_OF_TEXT in text and theirs == wanted_ordinary:
            pieces = len(encoding.encode_ordinary(END_OF_TEXT))
            raise CheckFailed(f"{where}: {END_OF_TEXT} became {pieces} tokens. "
                              f"Likely mistake: the special token is split into pieces: when it is allowed, cut the "
                              f"text at {END_OF_TEXT} first and give each one the id {encoding.eot_token}.",
                              mistake="special_token_split")
        if not mode and END_OF_TEXT in text and theirs == wanted_special:
            raise CheckFailed(f"{where}: {END_OF_TEXT} became the special token {encoding.eot_token}. Likely "
                              "mistake: the special token is honoured when it is not allowed: without "
                              "allow_special it is ordinary text, as tiktoken's encode_ordinary has it.",
                              mistake="special_token_honoured")
        difference = _first_difference(theirs, expected, text, bool(mode))
        raise CheckFailed(f"{where}: {difference}", mistake=mistake_key(difference))


def _judge_other_ranks(case: Case, outputs: dict, bpe) -> None:
    """The learner's bpe with the text's own merges as ranks, word by word against `bpe`'s."""
    text = _text(case)
    ranks = _other_ranks(ref.train_bpe(text, OTHER_MERGES))
    tokens = [t.decode("utf-8") for t in tensors_pieces(outputs["other_tokens"], outputs["other_lengths"])]
    cuts, start = [], 0
    for word, count in zip(_written(text), outputs["other_counts"].tolist()):
        cuts.append((word, tokens[start:start + count]))
        start += count
    for word, mine in cuts:
        right = bpe(word, ranks)
        if mine == right:
            continue
        head = (f"bpe({word!r}, ranks) with other ranks than GPT-2's (the {len(ranks)} merges the course's "
                f"trainer learns from {_where(case)}, in that order): {mine}, expected {right}.")
        if mine == bpe(word, _files()[1]):
            raise CheckFailed(f"{head} Yours is its cut by GPT-2's ranks. Likely mistake: bpe ignores its `ranks` "
                              "argument: a cache keyed on the word alone (key it on the word and the ranks, or keep "
                              "one cache per ranks), or bpe_ranks read in place of `ranks`.",
                              mistake="ranks_argument_ignored")
        if "".join(mine) != word:
            raise CheckFailed(f"{head} Your tokens do not add up to the word: return the tokens it is cut into.")
        diagnosis = _cut_diagnosis(word, mine, right, ranks, cuts)
        raise CheckFailed(f"{head} {diagnosis}", mistake=mistake_key(diagnosis))


def judge_encode(case: Case, outputs: dict) -> None:
    def bpe(word: str, ranks: dict) -> list[str]:
        """The reference's BPE of one pre-token (here, inside the judge, which grading kernels see sealed)."""
        symbols = list(word)
        while len(symbols) > 1:
            best = min(zip(symbols, symbols[1:]), key=lambda pair: ranks.get(pair, float("inf")))
            if best not in ranks:
                break
            symbols = ref.merge_pair(symbols, best)
        return symbols

    _judge_ids(case, outputs)
    _judge_other_ranks(case, outputs, bpe)


encode_exercise = Exercise(NOTEBOOK, "encode", produce_encode, judge_encode, inputs=inputs_encode,
                           forbidden=(TIKTOKEN,), defaults={"text": None},
                           describe=_where, guard=Guard(supplies=tuple(ENCODE_PARTS.values())))
check_encode = encode_exercise.checker(
    "Grade `bpe` and `encode` token for token against tiktoken's GPT-2 encoding, and `bpe` with other ranks.",
    learner=lambda encode, bpe: (encode, bpe))
