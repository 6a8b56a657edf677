"""A deliberately plain BPE trainer, the way a learner first writes one: every merge recounts every
pair of every distinct pre-token. With `mistake`, it makes one of the catalogued training mistakes;
the training check replays them to name what a learner's merges show. Sealed in the grading
kernels (Notebook.implementations): without a mistake it is a correct trainer."""
from __future__ import annotations

from collections import Counter

from graders.exercises.tokenizer.reference import merge_pair, pretokenize

MISTAKES = ("across pre-tokens", "unweighted", "overlapping", "first only", "tie smallest", "tie first seen")


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


def naive_train(text: str, n_merges: int, mistake: str | None = None) -> list[tuple[bytes, bytes]]:
    chunks = [text] if mistake == "across pre-tokens" else pretokenize(text)
    counts = Counter(chunks)
    words = {word: [bytes([b]) for b in word.encode("utf-8")] for word in counts}
    merge = {"overlapping": _merge_overlapping, "first only": _merge_first}.get(mistake, merge_pair)
    merges = []
    for _ in range(n_merges):
        pairs: Counter = Counter()
        for word, symbols in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += 1 if mistake == "unweighted" else counts[word]
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
