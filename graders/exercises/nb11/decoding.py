"""Notebook 11, exercise 6: `decode`, judged against tiktoken's decode on the round trip of hidden
texts and on single tokens that hold part of a character. Its mistakes are named from where the
learner's text first parts from tiktoken's and what stands there: a stand-in of the byte table, a
character inserted between tokens, a '\ufffd' where a character was cut across tokens."""
from __future__ import annotations

import difflib

from graders.exercises.nb11 import reference as ref
from graders.exercises.nb11.encoding import CourseTable
from graders.exercises.nb11.pieces import TIKTOKEN, _text, _where, run_answer
from graders.exercises.nb11.wire import ids_tensor, tensor_text, text_tensor
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, keyed_like, mistake_key
from graders.judging.exercise import Exercise
from graders.reference.tokenizer import END_OF_TEXT, gpt2_encoding

NOTEBOOK = "11_tokenizer"
LATIN_1 = Mistake("latin_1_table", "the tokens' characters read as Latin-1 (or their code points taken as bytes): "
                  "GPT-2's table moved 68 bytes to other characters ('Ġ', chr(288), is the space). Map each "
                  "character back to its byte with byte_decoder")


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


def _crash_named(failure: CheckFailed) -> str | None:
    """The mistake a crash of the learner's decode shows, if it shows one."""
    cause = failure.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return Mistake("strict_decode", "decoding strictly: a token may hold part of a character; decode the "
                       "joined bytes with errors=\"replace\"")
    if isinstance(cause, UnicodeEncodeError) or isinstance(cause, ValueError) and "range(0, 256)" in str(cause):
        return LATIN_1
    return None


def produce_decode(decode, case: Case, inputs: dict) -> dict:
    DECODE_PARTS["byte_decoder"].fill()
    ids, out = inputs["ids"].tolist(), {}
    for i, run in enumerate([ids, *([token] for token in inputs["partial"].tolist())]):
        try:
            text = run_answer("decode", decode, run)
        except CheckFailed as failure:
            named = _crash_named(failure)
            if named:
                raise CheckFailed(f"decode raised {type(failure.__cause__).__name__} on {run[:8]}"
                                  f"{' ...' if len(run) > 8 else ''}. Likely mistake: {named}.",
                                  mistake=mistake_key(named)) from None
            raise
        if not isinstance(text, str):
            raise CheckFailed(f"decode: return a str; got {type(text).__name__}.")
        out[f"text_{i}"] = text_tensor(text)
    return out


def _joined(theirs: str, renderings: dict[str, list[str]]) -> tuple[str, str] | None:
    """(the separator, the rendering) when the learner's text is the tokens rendered one way
    (`renderings`: each token's string, by what that is) joined with one character between."""
    for name, strings in renderings.items():
        first = strings[0] if strings else ""
        separator = theirs[len(first):len(first) + 1] if theirs.startswith(first) else ""
        if len(strings) > 1 and separator and theirs == separator.join(strings):
            return separator, name
    return None


def _moved_lost(data: bytes, theirs: str, expected: str, at: int) -> bool:
    """Whether the learner's text is the text with each byte the table moved (the space, the
    newline, control bytes: their stand-ins are above chr(255)) replaced by what stands first in its
    place in the learner's text, or dropped: what Latin-1 makes of the stand-ins."""
    moved = {b for b, c in ref.bytes_to_unicode().items() if ord(c) > 255}
    if at >= len(expected) or ord(expected[at]) not in moved:
        return False
    for stand_in in {theirs[at:at + 1].encode("latin-1", errors="ignore"), b""}:
        if b"".join(stand_in if b in moved else bytes([b]) for b in data).decode(errors="replace") == theirs:
            return True
    return False


def _diagnosis(run: list[int], theirs: str, expected: str, at: int) -> str:
    """The likely mistake, from what stands where the texts first part."""
    encoding, table = gpt2_encoding(), ref.bytes_to_unicode()
    pieces = [encoding.decode_single_token_bytes(i) for i in run]
    if theirs == "".join(piece.decode("utf-8", errors="replace") for piece in pieces):
        return Mistake("per_token_decode", "Likely mistake: each token is decoded on its own and the pieces "
                       "joined: a character split across tokens comes out as '\ufffd'. Join the bytes of all "
                       "tokens first, then decode once.")
    undone = ("Likely mistake: the byte table is not undone: map each character of the tokens' strings back to "
              "its byte with byte_decoder, then decode the bytes.")
    if theirs == "".join(table[b] for b in b"".join(pieces)):
        return Mistake("table_not_undone", f"Yours is the tokens' strings as they are, in the byte table's "
                       f"characters. {undone}")
    if at < len(expected) and at < len(theirs) and ord(expected[at]) < 256 \
            and table[ord(expected[at])] != expected[at] and theirs[at] == table[ord(expected[at])]:
        return Mistake("table_not_undone", f"Yours has {theirs[at]!r} where the text has {expected[at]!r}, byte "
                       f"{ord(expected[at])}: the byte table's stand-in for it. {undone}")
    if theirs == b"".join(pieces).decode("utf-8", errors="ignore"):
        return Mistake("errors_ignore", "Likely mistake: errors=\"ignore\" drops a character cut across tokens; "
                       "errors=\"replace\" shows it as '\ufffd', as tiktoken does.")
    if theirs == b"".join(pieces).decode("latin-1"):
        return Mistake("latin_1_decode", "Likely mistake: the bytes decoded as Latin-1, a character for each byte: "
                       "decode them as UTF-8, with errors=\"replace\".")
    joined = _joined(theirs, {
        "": [piece.decode("utf-8", errors="replace") for piece in pieces],
        f", and {undone[16:-1]}": ["".join(table[b] for b in piece) for piece in pieces]})
    if joined:
        separator, also = joined
        return Mistake("joined_with_separator", f"Yours has {separator!r} between the tokens. Likely mistake: the "
                       f"tokens joined with {separator!r} between them: a token holds its own spaces; join them with "
                       f"nothing between{also}.")
    if _moved_lost(b"".join(pieces), theirs, expected, at):
        return keyed_like(LATIN_1, "Only the bytes the table moved (the space, the newline, control bytes) "
                       f"come out wrong. Likely mistake: {LATIN_1}.")
    if len(theirs) < len(expected) and difflib.SequenceMatcher(None, expected, theirs, autojunk=False).ratio() > 0.8:
        return "Yours leaves part of the text out: every id's bytes belong in the text, the special token's too."
    return ("Look up each id's string in decoder, map its characters back to bytes with byte_decoder, join all "
            "the bytes and decode them once, with errors=\"replace\".")


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
        diagnosis = _diagnosis(run, theirs, expected, at)
        raise CheckFailed(f"{what}: {theirs[max(0, at - 10):at + 10]!r} at character {at}, expected "
                          f"{expected[max(0, at - 10):at + 10]!r}. {diagnosis}", mistake=mistake_key(diagnosis))


DECODE_PARTS = {"byte_decoder": CourseTable(lambda: {c: b for b, c in ref.bytes_to_unicode().items()}),
                "bytes_to_unicode": ref.bytes_to_unicode}
decode_exercise = Exercise(NOTEBOOK, "decode", produce_decode, judge_decode,
                           inputs=inputs_decode, forbidden=(TIKTOKEN,), defaults={"text": None},
                           describe=_where, course_parts=DECODE_PARTS)
check_decode = decode_exercise.checker("Grade `decode` against tiktoken's decode (a round trip of hidden texts).")
