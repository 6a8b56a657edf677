"""Notebook 11, exercises 5 and 6: `encode` with GPT-2's merges and `decode`, judged token for token
against tiktoken's GPT-2 encoding on hidden texts. The course's pre-tokenizer and byte table run
under the learner's names in these checks, so a mistake in either costs its own exercise only."""
from __future__ import annotations

import json
from functools import lru_cache

from graders.exercises.tokenizer import reference as ref
from graders.exercises.tokenizer.pieces import TIKTOKEN, _text, _where, inputs_text
from graders.exercises.tokenizer.wire import as_list, ids_tensor, tensor_text, text_tensor
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed
from graders.judging.exercise import Exercise
from graders.judging.learner import run_learner, with_course_functions
from graders.reference.tokenizer import END_OF_TEXT, bpe_files, gpt2_encoding

NOTEBOOK = "11_tokenizer"


class CourseTable(dict):
    """The course's byte table, supplied to a check under the learner's name for it (hashable, as
    the parts a check supplies are)."""
    __hash__ = object.__hash__


# --- 5. Encoding ---------------------------------------------------------------------------------

def _table_skipped(failure: CheckFailed) -> bool:
    cause = failure.__cause__
    key = cause.args[0] if isinstance(cause, KeyError) and cause.args else None
    return isinstance(key, str) and any(ord(c) <= 32 or 127 <= ord(c) <= 160 for c in key)


def produce_encode(encode, case: Case, inputs: dict) -> dict:
    text, out = tensor_text(inputs["text"]), {}
    for name, allow in (("ordinary", False), ("special", True)):
        try:
            ids = run_learner("encode", encode, text, allow_special=allow, forbidden=TIKTOKEN)
            out[name] = ids_tensor(as_list("encode", ids, int, "a list of ints (token ids)"))
        except CheckFailed as failure:
            if _table_skipped(failure):
                raise CheckFailed(f"encode raised {failure.__cause__!r}: that key is not a token of encoder.json. "
                                  "Likely mistake: the byte table skipped: map each byte of the UTF-8 text through "
                                  "byte_encoder before the merges (vocab.bpe and encoder.json are written in its "
                                  "characters: 'Ġ' for a space).") from None
            raise
    return out


def _splits(encoder: dict, ranks: dict) -> list[tuple[str, object]]:
    """Wrong ways to split one pre-token (in the table's characters): (the mistake, the split)."""
    def greedy(word):
        tokens, i = [], 0
        while i < len(word):
            j = max(j for j in range(i + 1, len(word) + 1) if j == i + 1 or word[i:j] in encoder)
            tokens.append(word[i:j])
            i = j
        return tokens

    def most_frequent(word):
        symbols = list(word)
        while True:
            pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
            if not pairs:
                return symbols
            best = max(pairs, key=pairs.count)
            at = next(i for i in range(len(symbols) - 1) if (symbols[i], symbols[i + 1]) == best)
            symbols[at:at + 2] = [best[0] + best[1]]

    def pass_over_pairs(word):
        symbols, i = list(word), 0
        while i < len(symbols) - 1:
            if (symbols[i], symbols[i + 1]) in ranks:
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
            i += 1
        return symbols

    def pass_growing_left(word):
        symbols = [word[0]]
        for char in word[1:]:
            if (symbols[-1], char) in ranks:
                symbols[-1] += char
            else:
                symbols.append(char)
        return symbols

    one_pass = ("the merges applied in one left-to-right pass: repeat until no ranked pair is left, merging "
                "the lowest-ranked pair each time")
    return [
        ("greedy longest match: the longest vocabulary token at each position is not what BPE makes; merge "
         "the pair of lowest rank (earliest in vocab.bpe) first, again and again", greedy),
        ("the most frequent pair merged in place of the lowest-ranked one: encoding follows the ranks, the "
         "order in which the merges were learned", most_frequent),
        (one_pass, pass_over_pairs),
        (one_pass, pass_growing_left),
    ]


@lru_cache(maxsize=1)
def _files() -> tuple[dict, dict]:
    """(encoder.json, vocab.bpe's ranks), as the notebook reads them."""
    encoder_json, vocab_bpe = bpe_files()
    encoder = json.loads(encoder_json.read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in vocab_bpe.read_text(encoding="utf-8").splitlines()[1:] if line]
    return encoder, {pair: rank for rank, pair in enumerate(merges)}


def encode_mistakes(text: str, allow_special: bool) -> dict[str, list[list[int]]]:
    """What the catalogued encoding mistakes make of `text`, by description."""
    encoder, ranks = _files()
    table = ref.bytes_to_unicode()
    found = {}
    for likely, split in _splits(encoder, ranks):
        ids = []
        for piece in (text.split(END_OF_TEXT) if allow_special else [text]):
            for chunk in ref.pretokenize(piece):
                ids += [encoder[t] for t in split("".join(table[b] for b in chunk.encode("utf-8")))]
            ids.append(encoder[END_OF_TEXT])
        found.setdefault(likely, []).append(ids[:-1])
    return found


def _first_difference(theirs: list[int], expected: list[int], text: str) -> str:
    """Where the learner's ids first part from tiktoken's: the pre-token, and its tokens either way."""
    encoding = gpt2_encoding()
    at = next((i for i, (a, b) in enumerate(zip(theirs, expected)) if a != b), min(len(theirs), len(expected)))
    if at == len(expected):
        return f"{len(theirs) - at} more tokens than tiktoken's {at}, after all of them: {theirs[at:at + 8]}."
    position, start = 0, 0
    for chunk in ref.pretokenize(text):
        n = len(encoding.encode_ordinary(chunk))
        if position + n > at:
            break
        position += n
        start += len(chunk)
    right = expected[position:position + n]
    spelled, mine = b"", []
    for token in theirs[position:]:
        if not 0 <= token < encoding.n_vocab or len(spelled) >= len(encoding.decode_bytes(right)):
            break
        mine.append(token)
        spelled += encoding.decode_single_token_bytes(token)
    def pieces(ids: list[int]) -> list[bytes]:
        return [encoding.decode_single_token_bytes(i) for i in ids if 0 <= i < encoding.n_vocab]

    head = (f"token {at} is {theirs[at] if at < len(theirs) else 'missing'}, expected "
            f"{expected[at] if at < len(expected) else 'nothing (yours is longer)'}, in the pre-token "
            f"{text[start:start + 20]!r}: yours {pieces(mine)}, tiktoken's {pieces(right)}.")
    chunk = encoding.decode_bytes(right)
    if spelled.startswith(chunk) and len(spelled) > len(chunk):
        return head + (" A token of yours runs past the end of this pre-token. Likely mistake: merges across "
                       "pre-tokens: pre-tokenize first, and merge inside each pre-token only.")
    if spelled != chunk:
        return head + " Your tokens spell other bytes than the text: check the byte table and the ids."
    if len(mine) > len(right):
        return head + (" The same bytes, in more tokens: some merges were not made (repeat until no ranked "
                       "pair is left).")
    return head + " The same bytes, cut otherwise: the merges were made in another order than their ranks."


def judge_encode(case: Case, outputs: dict) -> None:
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
                              f"text at {END_OF_TEXT} first and give each one the id {encoding.eot_token}.")
        if not mode and END_OF_TEXT in text and theirs == wanted_special:
            raise CheckFailed(f"{where}: {END_OF_TEXT} became the special token {encoding.eot_token}. Likely "
                              "mistake: the special token is honoured when it is not allowed: without "
                              "allow_special it is ordinary text, as tiktoken's encode_ordinary has it.")
        for likely, made in encode_mistakes(text, bool(mode)).items():
            if theirs in made:
                raise CheckFailed(f"{where}: {_first_difference(theirs, expected, text)} Likely mistake: {likely}.")
        raise CheckFailed(f"{where}: {_first_difference(theirs, expected, text)}")


ENCODE_PARTS = {"pretokenize": ref.pretokenize, "bytes_to_unicode": ref.bytes_to_unicode,
                "byte_encoder": CourseTable(ref.bytes_to_unicode())}
encode_exercise = Exercise(NOTEBOOK, "encode", with_course_functions(produce_encode, ENCODE_PARTS), judge_encode,
                           inputs=inputs_text, forbidden=(TIKTOKEN,),
                           defaults={"text": None}, describe=_where)
check_encode = encode_exercise.checker("Grade `encode` token for token against tiktoken's GPT-2 encoding.")


# --- 6. Decoding ---------------------------------------------------------------------------------

def inputs_decode(case: Case) -> dict:
    """tiktoken's ids of the case's text, and those of its tokens that hold part of a character
    (computed here: no tiktoken code may run while the learner's is watched)."""
    ids = gpt2_encoding().encode(_text(case), allowed_special={END_OF_TEXT})
    return {"ids": ids_tensor(ids), "partial": ids_tensor(_split_characters(ids))}


def _split_characters(ids: list[int]) -> list[int]:
    """The ids among `ids` whose token holds part of a character only (up to 4)."""
    encoding = gpt2_encoding()
    partial = []
    for token in ids:
        try:
            encoding.decode_single_token_bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            partial.append(token)
    return partial[:4]


def produce_decode(decode, case: Case, inputs: dict) -> dict:
    ids, out = inputs["ids"].tolist(), {}
    for i, run in enumerate([ids, *([token] for token in inputs["partial"].tolist())]):
        try:
            text = run_learner("decode", decode, run, forbidden=TIKTOKEN)
        except CheckFailed as failure:
            if isinstance(failure.__cause__, UnicodeDecodeError):
                raise CheckFailed(f"decode raised UnicodeDecodeError on {run[:8]}{' ...' if len(run) > 8 else ''}. "
                                  "Likely mistake: decoding strictly: a token may hold part of a character; decode "
                                  "the joined bytes with errors=\"replace\".") from None
            raise
        if not isinstance(text, str):
            raise CheckFailed(f"decode: return a str; got {type(text).__name__}.")
        out[f"text_{i}"] = text_tensor(text)
    return out


def decode_mistakes(ids: list[int]) -> dict[str, str]:
    encoding, table = gpt2_encoding(), ref.bytes_to_unicode()
    strings = {i: "".join(table[b] for b in encoding.decode_single_token_bytes(i)) for i in ids}
    return {
        "each token is decoded on its own and the pieces joined: a character split across tokens comes "
        "out as '\ufffd'. Join the bytes of all tokens first, then decode once":
            "".join(encoding.decode([i]) for i in ids),
        "the byte table is not undone: the tokens' strings hold GPT-2's stand-ins ('Ġ' for a space); map "
        "each character back to its byte with byte_decoder, then decode the bytes":
            "".join(strings.values()) if len(set(ids)) == len(ids) else "".join(strings[i] for i in ids),
    }


def judge_decode(case: Case, outputs: dict) -> None:
    encoding = gpt2_encoding()
    ids = encoding.encode(_text(case), allowed_special={END_OF_TEXT})
    for i, run in enumerate([ids, *([token] for token in _split_characters(ids))]):
        theirs, expected = tensor_text(outputs[f"text_{i}"]), encoding.decode(run)
        if theirs == expected:
            continue
        what = (f"decode(encode(text)) on {_where(case)}" if i == 0 else
                f"decode([{run[0]}]), a token that holds part of a character "
                f"({encoding.decode_single_token_bytes(run[0])!r})")
        at = next((j for j, (a, b) in enumerate(zip(theirs, expected)) if a != b), min(len(theirs), len(expected)))
        head = (f"{what}: {theirs[max(0, at - 10):at + 10]!r} at character {at}, expected "
                f"{expected[max(0, at - 10):at + 10]!r}.")
        for likely, text in decode_mistakes(run).items():
            if theirs == text:
                raise CheckFailed(f"{head} Likely mistake: {likely}.")
        raise CheckFailed(f"{head} Look up each id's string in decoder, map its characters back to bytes with "
                          "byte_decoder, join all the bytes and decode them once, with errors=\"replace\".")


DECODE_PARTS = {"byte_decoder": CourseTable({c: b for b, c in ref.bytes_to_unicode().items()}),
                "bytes_to_unicode": ref.bytes_to_unicode}
decode_exercise = Exercise(NOTEBOOK, "decode", with_course_functions(produce_decode, DECODE_PARTS), judge_decode,
                           inputs=inputs_decode, forbidden=(TIKTOKEN,), defaults={"text": None},
                           describe=_where)
check_decode = decode_exercise.checker("Grade `decode` against tiktoken's decode (a round trip of hidden texts).")
