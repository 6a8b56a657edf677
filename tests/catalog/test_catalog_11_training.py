"""Notebook 11's train_bpe graders (graders/exercises/nb11/training.py): correct tokenizers in several
styles pass, each catalogued mistake fails with its name, and the course's trainer agrees with an
independent naive one."""
import heapq
from collections import Counter, defaultdict
from functools import lru_cache

import pytest

from graders.exercises import nb11
from graders.exercises.nb11 import training
from catalog_helpers import fails_with
from catalog_11_shared import pretokenize


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


def test_the_speed_check_names_a_fast_trainers_mistake_as_the_main_check_does(monkeypatch):
    """The two checks named one bug two ways (the main check replays the catalogued
    mistakes; the speed check, too large to replay, explains the first wrong merge)."""
    monkeypatch.setattr(training, "SPEED_CHARACTERS", 30_000)
    words = "Likely mistake: the pair-to-pre-token index is not updated"
    fails_with(nb11.check_train_bpe, _fast(update_index=False), expected=words, seed=1)
    fails_with(nb11.check_train_bpe_speed, _fast(update_index=False), expected=words)
