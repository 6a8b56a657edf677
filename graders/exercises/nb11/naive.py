"""A deliberately plain BPE trainer, the way a learner first writes one: every merge recounts every
pair of every distinct pre-token. With `mistake`, it makes one of the catalogued training mistakes;
the training check replays them, and asks which mistake's counts explain a learner's first wrong
merge, to name what a learner's merges show. Sealed in the grading kernels
(marked `@course_answer`, graders.marks): without a mistake it is a correct trainer."""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

from graders.exercises.nb11.reference import merge_pair, pretokenize
from graders.marks import course_answer

MISTAKES = ("across pre-tokens", "unweighted", "overlapping", "right to left", "first only", "characters",
            "tie smallest", "tie first seen")
# The mistakes that change what is counted (the others change which of the counted pairs is taken),
# among them two of a fast trainer's: the pairs a merge removes keep their counts; the index from
# each pair to the pre-tokens that hold it is never updated, so a merge changes only the pre-tokens
# that held its pair from the start.
COUNTING = ("unweighted", "split at whitespace", "once per pre-token", "overlapping", "right to left",
            "first only", "characters", "not subtracted", "index not updated")


def _merge_overlapping(symbols: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    """Each occurrence of `pair` merged, overlapping ones too: `a a a` becomes `aa aa`."""
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(pair[0] + pair[1])
            overlaps = i + 2 < len(symbols) and (symbols[i + 1], symbols[i + 2]) == pair
            i += 1 if overlaps else 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


def _merge_first(symbols: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    for i in range(len(symbols) - 1):
        if (symbols[i], symbols[i + 1]) == pair:
            return symbols[:i] + [pair[0] + pair[1]] + symbols[i + 2:]
    return symbols


def _merge_right_to_left(symbols: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    """The occurrences taken from the right: `a a a` becomes `a aa`."""
    merged, i = [], len(symbols) - 1
    while i >= 0:
        if i > 0 and (symbols[i - 1], symbols[i]) == pair:
            merged.append(pair[0] + pair[1])
            i -= 2
        else:
            merged.append(symbols[i])
            i -= 1
    return merged[::-1]


MERGES = {"overlapping": _merge_overlapping, "first only": _merge_first, "right to left": _merge_right_to_left}


@lru_cache(maxsize=8)
def _chunk_counts(text: str, cut: str | None) -> Counter:
    """The distinct pre-tokens and their counts (kept: the judge counts a text's pairs many times)."""
    return Counter({"across pre-tokens": [text], "split at whitespace": text.split()}.get(cut) or pretokenize(text))


def _words(text: str, mistake: str | None) -> tuple[Counter, dict]:
    """The distinct pre-tokens with their counts, and each one's first tokens."""
    counts = _chunk_counts(text, mistake if mistake in ("across pre-tokens", "split at whitespace") else None)
    if mistake == "characters":
        return counts, {word: [c.encode("utf-8") for c in word] for word in counts}
    return counts, {word: [bytes([b]) for b in word.encode("utf-8")] for word in counts}


def _count(counts: Counter, words: dict, mistake: str | None) -> Counter:
    pairs: Counter = Counter()
    for word, symbols in words.items():
        found = zip(symbols, symbols[1:])
        for pair in set(found) if mistake == "once per pre-token" else found:
            pairs[pair] += 1 if mistake == "unweighted" else counts[word]
    return pairs


def pair_counts(text: str, merges: list[tuple[bytes, bytes]], mistake: str | None = None) -> Counter:
    """The pair counts a trainer with `mistake` sees once it has made `merges`."""
    counts, words = _words(text, mistake)
    merge = MERGES.get(mistake, merge_pair)
    stale: Counter = Counter()
    for word, symbols in words.items():
        spelled, first = word.encode("utf-8"), set(zip(symbols, symbols[1:]))
        for pair in merges:
            if mistake == "index not updated" and pair not in first:
                continue
            if pair[0] + pair[1] in spelled:   # a merge can only join bytes that are side by side
                merged = merge(symbols, pair)
                if mistake == "not subtracted" and merged != symbols:
                    stale.update({old: counts[word] for old in zip(symbols, symbols[1:])})
                symbols = merged
        words[word] = symbols
    found = _count(counts, words, mistake) + stale
    return Counter({pair: n for pair, n in found.items() if pair not in merges})


def holder(text: str, merges: list[tuple[bytes, bytes]], pair: tuple[bytes, bytes]) -> tuple[str, int, list]:
    """The most frequent pre-token that holds `pair` once `merges` are made: (it, its count, its tokens)."""
    counts, words = _words(text, None)
    for word, weight in counts.most_common():
        symbols = words[word]
        for merge in merges:
            if merge[0] + merge[1] in word.encode("utf-8"):
                symbols = merge_pair(symbols, merge)
        if pair in zip(symbols, symbols[1:]):
            return word, weight, symbols
    return "", 0, []


@course_answer("train_bpe")
def naive_train(text: str, n_merges: int, mistake: str | None = None) -> list[tuple[bytes, bytes]]:
    counts, words = _words(text, mistake)
    merge = MERGES.get(mistake, merge_pair)
    merges = []
    for _ in range(n_merges):
        pairs = _count(counts, words, mistake)
        if not pairs:
            break
        if mistake == "tie first seen":
            best = max(pairs, key=pairs.get)
        elif mistake == "tie smallest":
            top = max(pairs.values())
            best = min(pair for pair, count in pairs.items() if count == top)
        else:
            best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        words = {word: merge(symbols, best) for word, symbols in words.items()}
    return merges
