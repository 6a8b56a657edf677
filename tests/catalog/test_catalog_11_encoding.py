"""Notebook 11's encode grader (graders/exercises/nb11/encoding.py): correct tokenizers in several
styles pass, each catalogued mistake fails with its name."""
import heapq
from collections import Counter

import pytest
import regex

from graders.exercises import nb11
from catalog_helpers import fails_with
from catalog_11_shared import SPECIAL, bpe_ranks, byte_encoder, encoder, pretokenize


# --- 5. Encoding

def get_pairs(word):
    return {(a, b) for a, b in zip(word, word[1:])}


def bpe(token, ranks):
    """GPT-2's encoder.py: merge the lowest-ranked pair everywhere, until none is left."""
    word = tuple(token)
    while len(word) > 1:
        bigram = min(get_pairs(word), key=lambda pair: ranks.get(pair, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new_word.extend(word[i:])
                break
            new_word.extend(word[i:j])
            i = j
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
    return list(word)


def bpe_by_index(word, ranks):
    """Another style: the lowest-ranked pair by position, merged once per step."""
    symbols = list(word)
    while len(symbols) > 1:
        rank, i = min((ranks.get((symbols[i], symbols[i + 1]), 10 ** 9), i) for i in range(len(symbols) - 1))
        if rank == 10 ** 9:
            break
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols


def bpe_heap(word, ranks):
    """Another: a heap of (rank, pair) over the adjacent pairs, rebuilt after each merge."""
    symbols = list(word)
    while True:
        heap = [(ranks[p], p) for p in zip(symbols, symbols[1:]) if p in ranks]
        if not heap:
            return symbols
        heapq.heapify(heap)
        _, (a, b) = heap[0]
        out, i = [], 0
        while i < len(symbols):
            if symbols[i:i + 2] == [a, b]:
                out.append(a + b)
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out


_CACHES = {}


def bpe_recursive(word, ranks):
    """Another: recursion on the lowest-ranked pair, with one cache per ranks table."""
    cache = _CACHES.setdefault(id(ranks), (ranks, {}))[1]
    if word not in cache:
        symbols = tuple(word)
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            cache[word] = list(symbols)
        else:
            best = min(pairs, key=ranks.get)
            i = next(i for i in range(len(symbols) - 1) if symbols[i:i + 2] == best)
            cache[word] = bpe_recursive(symbols[:i] + (best[0] + best[1],) + symbols[i + 2:], ranks)
    return cache[word]


def _encoder(split=bpe, special="cut", table=True, key=None, code_points=False):
    """(encode, bpe): an encoder around `split`, GPT-2's ranks and the learner's globals; or with
    one mistake."""
    cache = {}

    def encode(text, allow_special=False):
        pieces = text.split(SPECIAL) if allow_special and special == "cut" else [text]
        if special == "always":
            pieces = text.split(SPECIAL)
        ids = []
        for n, piece in enumerate(pieces):
            if n:
                ids.append(encoder[SPECIAL])
            for chunk in pretokenize(piece):
                if code_points:
                    word = "".join(byte_encoder[ord(c)] for c in chunk)
                else:
                    word = "".join(byte_encoder[b] for b in chunk.encode("utf-8")) if table else chunk
                if key is None:
                    ids += [encoder[t] for t in split(word, bpe_ranks)]
                    continue
                if key(chunk) not in cache:
                    cache[key(chunk)] = [encoder[t] for t in split(word, bpe_ranks)]
                ids += cache[key(chunk)]
        return ids
    return encode, split


def greedy(word, ranks):
    tokens, i = [], 0
    while i < len(word):
        j = len(word)
        while j > i + 1 and word[i:j] not in encoder:
            j -= 1
        tokens.append(word[i:j])
        i = j
    return tokens


def one_pass(word, ranks):
    out = [word[0]]
    for s in word[1:]:
        if (out[-1], s) in ranks:
            out[-1] += s
        else:
            out.append(s)
    return out


def most_frequent(word, ranks):
    symbols = list(word)
    while True:
        pairs = Counter(p for p in zip(symbols, symbols[1:]) if p in ranks)
        if not pairs:
            return symbols
        best = pairs.most_common(1)[0][0]
        i = next(i for i in range(len(symbols) - 1) if (symbols[i], symbols[i + 1]) == best)
        symbols[i:i + 2] = [best[0] + best[1]]


def highest_first(word, ranks):
    symbols = list(word)
    while True:
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            return symbols
        best = max(pairs, key=ranks.get)
        i = next(i for i in range(len(symbols) - 1) if (symbols[i], symbols[i + 1]) == best)
        symbols[i:i + 2] = [best[0] + best[1]]


def as_they_come(word, ranks):
    """One pass from left to right, merging any ranked pair as soon as it forms, its rank ignored."""
    tokens = []
    for char in word:
        tokens.append(char)
        while len(tokens) > 1 and (tokens[-2], tokens[-1]) in ranks:
            tokens[-2:] = [tokens[-2] + tokens[-1]]
    return tokens


def in_passes(word, ranks):
    """Passes from left to right, each merging every ranked pair it meets, until one merges none."""
    symbols = list(word)
    while True:
        out, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) in ranks:
                out.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        if out == symbols:
            return symbols
        symbols = out


_WORD_CACHE = {}


def bpe_cached_by_word(word, ranks):
    """The bug that passed: a cache keyed on the word alone."""
    if word not in _WORD_CACHE:
        _WORD_CACHE[word] = bpe(word, ranks)
    return _WORD_CACHE[word]


def bpe_global_ranks(word, ranks):
    return bpe(word, bpe_ranks)


def encode_whole_text(text, allow_special=False):
    return [encoder[t] for t in bpe("".join(byte_encoder[b] for b in text.encode()), bpe_ranks)]


@pytest.mark.parametrize("split", [bpe, bpe_by_index, bpe_heap, bpe_recursive])
def test_encoding_correct_styles_pass(split):
    for seed in (0, 1, 2, 3, 5, 6):
        nb11.check_encode(*_encoder(split), seed=seed)
    nb11.check_encode(*_encoder(split, key=lambda chunk: chunk), seed=4)   # a cache keyed on the pre-token


@pytest.mark.parametrize("learner, seed, expected", [
    (_encoder(greedy), 0, "Likely mistake: greedy longest match"),
    (_encoder(most_frequent), 4, "Likely mistake: the most frequent pair merged in place of the lowest-ranked one"),
    # Where no pair repeats inside a pre-token, the most frequent pair is the leftmost ranked one:
    # the two mistakes cut the text alike, and both are said.
    (_encoder(most_frequent), 2, "Likely mistake: the ranks ignored: any ranked pair merged as soon as it forms"),
    (_encoder(most_frequent), 2, "Or: the most frequent pair merged in place of the lowest-ranked one"),
    (_encoder(as_they_come), 4, "Likely mistake: the ranks ignored: any ranked pair merged as soon as it forms, in "
                                "one pass from left to right"),
    (_encoder(in_passes), 0, "Likely mistake: the ranks ignored: each pass from left to right merges every ranked "
                             "pair it meets"),
    (_encoder(in_passes), 3, "Likely mistake: the ranks ignored: each pass from left to right merges every ranked "
                             "pair it meets"),
    (_encoder(one_pass), 0, "Likely mistake: the merges stop early (one left-to-right pass"),
    (_encoder(one_pass), 3, "Likely mistake: the merges stop early (one left-to-right pass"),
    (_encoder(highest_first), 0, "Likely mistake: the highest rank merged first"),
    (_encoder(special="never"), 0, "Likely mistake: the special token is split into pieces"),
    (_encoder(special="always"), 0, "Likely mistake: the special token is honoured when it is not allowed"),
    (_encoder(table=False), 0, "Likely mistake: the byte table skipped"),
    (_encoder(code_points=True), 0, "encode raised KeyError(128578). Likely mistake: code points, not bytes"),
    (_encoder(code_points=True), 5, "Likely mistake: code points, not bytes"),
    (_encoder(key=str.strip), 1, "Likely mistake: a cache whose key is not the pre-token itself"),
    # The bug that passed: only bpe with other ranks than GPT-2's shows it.
    (_encoder(bpe_cached_by_word), 0, "Yours is its cut by GPT-2's ranks. Likely mistake: bpe ignores its `ranks` "
                                      "argument: a cache keyed on the word alone"),
    (_encoder(bpe_global_ranks), 3, "Likely mistake: bpe ignores its `ranks` argument"),
    # Nobody listed these: BPE over the whole text, without pre-tokens; a cache keyed on the
    # lowercased pre-token. Located at their first token, and named from what they show.
    ((encode_whole_text, bpe), 6, "token 18 is 628, expected 198, in the pre-token '\\n' (at character 70): "
     "yours [b'\\n\\n'], tiktoken's [b'\\n']. A token of yours runs past the end of this pre-token. "
     "Likely mistake: merges across"),
    (_encoder(key=str.lower), 4, "Likely mistake: a cache whose key is not the pre-token itself"),
])
def test_encoding_mistakes_are_named(learner, seed, expected):
    _WORD_CACHE.clear()
    fails_with(nb11.check_encode, *learner, expected=expected, seed=seed)


def test_tiktoken_is_not_an_answer():
    import tiktoken  # noqa: F401  (the learner's notebook imports it for its comparisons)
    from graders.reference.tokenizer import gpt2_encoding

    enc = gpt2_encoding()
    def encode_with_tiktoken(text, allow_special=False):
        return enc.encode(text, allowed_special="all" if allow_special else set())

    fails_with(nb11.check_encode, encode_with_tiktoken, bpe,
               expected="your encode uses tiktoken's Encoding, a library's version of GPT-2's tokenizer")
    def decode_with_it(ids):
        return enc.decode(ids)

    def encode_with_its_core(text, allow_special=False):
        return enc._core_bpe.encode_ordinary(text)

    fails_with(nb11.check_decode, decode_with_it, expected="your decode uses tiktoken's Encoding")
    fails_with(nb11.check_encode, encode_with_its_core, bpe, expected="your encode uses tiktoken's Encoding")
    fails_with(nb11.check_pretokenize, lambda text: regex.findall(enc._pat_str, text),
               expected="your pretokenize uses tiktoken's Encoding")


def test_tiktokens_compiled_encoder_under_a_computed_name_is_refused():
    """The word scan cannot see `getattr(enc, "_core" + "_bpe")`; the profiler of compiled calls can."""
    from graders.reference.tokenizer import gpt2_encoding

    core = getattr(gpt2_encoding(), "_core" + "_bpe")

    def encode(text, allow_special=False):
        return list(core.encode_ordinary(text))

    fails_with(nb11.check_encode, encode, bpe, expected="your encode calls CoreBPE.encode_ordinary, compiled code")


def test_one_token_too_many_is_one_token():
    """A count of one is singular ("1 more token", not "1 more tokens")."""
    from graders.exercises.nb11.encoding import _first_difference

    assert _first_difference([1, 2, 3], [1, 2], "", False).startswith("1 more token than tiktoken's 2,")
    assert _first_difference([1, 2, 3, 4], [1, 2], "", False).startswith("2 more tokens than")
