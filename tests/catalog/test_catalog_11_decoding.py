"""Notebook 11's decode grader (graders/exercises/nb11/decoding.py): correct tokenizers in several
styles pass, each catalogued mistake fails with its name."""
import pytest

from graders.exercises import nb11
from catalog_helpers import fails_with
from catalog_11_shared import byte_decoder, decoder


# --- 6. Decoding

def decode(ids):
    return bytearray(byte_decoder[c] for c in "".join(decoder[i] for i in ids)).decode("utf-8", errors="replace")


def decode_loop(ids):
    data = b""
    for i in ids:
        data += bytes(byte_decoder[c] for c in decoder[i])
    return data.decode(errors="replace")


def test_decoding_correct_styles_pass():
    for learner in (decode, decode_loop):
        for seed in (0, 2, 5):
            nb11.check_decode(learner, seed=seed)


@pytest.mark.parametrize("learner, expected", [
    (lambda ids: bytearray(byte_decoder[c] for c in "".join(decoder[i] for i in ids)).decode("utf-8"),
     "Likely mistake: decoding strictly"),
    (lambda ids: "".join(decode([i]) for i in ids), "Likely mistake: each token is decoded on its own"),
    (lambda ids: "".join(decoder[i] for i in ids), "Likely mistake: the byte table is not undone"),
    (lambda ids: " ".join(decode([i]) for i in ids), "Likely mistake: the tokens joined with ' ' between them"),
    (lambda ids: bytes(b for i in ids for b in decoder[i].encode("latin-1", errors="replace")).decode(errors="replace"),
     "Only the bytes the table moved (the space, the newline, control bytes) come out wrong. Likely mistake: the "
     "tokens' characters read as Latin-1"),
    (lambda ids: b"".join(decoder[i].encode("latin-1") for i in ids).decode(), "decode raised UnicodeEncodeError on "
     "[39, 2634, 18798, 11, 266, 30570, 335, 0] .... Likely mistake: the tokens' characters read as Latin-1"),
    (lambda ids: "".join(decoder[i] for i in ids).encode("utf-8").decode(), "Likely mistake: the byte table is not "
     "undone"),
    # Nobody listed these: the special token dropped (located at its character); the tokens joined
    # with a newline, and the table not undone (named from what the text shows); the bytes decoded
    # as Latin-1.
    (lambda ids: decode([i for i in ids if i != 50256]), "at character 43, expected ' café 🙂 日本<|endoftex'. Yours "
     "leaves part of the text out"),
    (lambda ids: "\n".join(decoder[i] for i in ids), "Yours has '\\n' between the tokens. Likely mistake: the "
     "tokens joined with '\\n' between them: a token holds its own spaces; join them with nothing between, and the "
     "byte table is not undone"),
    (lambda ids: bytes(byte_decoder[c] for i in ids for c in decoder[i]).decode("latin-1"),
     "Likely mistake: the bytes decoded as Latin-1"),
])
def test_decoding_mistakes_are_named(learner, expected):
    fails_with(nb11.check_decode, learner, expected=expected)
