"""The course's answers to notebook 11 that its checks need (sealed in the grading kernels,
graders.integrity.kernel_view): GPT-2's byte-to-unicode table and pre-tokenizer (run in place of the
learner's in the later checks), and the incremental BPE trainer that training is judged against
(tiktoken has none). Encoding and decoding are judged against tiktoken itself."""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict

import regex

from graders.reference.tokenizer import GPT2_PATTERN
from graders.marks import course_answer


@course_answer("bytes_to_unicode")
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table (OpenAI's encoder.py): printable bytes stand for themselves, the n-th of the
    others for chr(256 + n)."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    others = [value for value in range(256) if value not in printable]
    return {value: chr(value) if value in printable else chr(256 + others.index(value)) for value in range(256)}


@course_answer("pretokenize")
def pretokenize(text: str) -> list[str]:
    return regex.findall(GPT2_PATTERN, text)


class _Largest:
    """A heap entry that pops the most frequent pair first, the greatest pair among equals."""
    __slots__ = ("count", "pair")

    def __init__(self, count: int, pair: tuple[bytes, bytes]):
        self.count, self.pair = count, pair

    def __lt__(self, other: "_Largest") -> bool:
        return (self.count, self.pair) > (other.count, other.pair)


@course_answer("train_bpe")
def merge_pair(symbols: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    """`symbols` with each occurrence of `pair`, left to right and not overlapping, made one."""
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == pair[0] and symbols[i + 1] == pair[1]:
            merged.append(pair[0] + pair[1])
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


@course_answer("train_bpe")
def train_bpe(text: str, n_merges: int) -> list[tuple[bytes, bytes]]:
    """BPE merges in order, learned incrementally: a merge recounts only the pre-tokens that hold
    its pair, and a heap of (count, pair) finds the next one. Stops early when no pair is left."""
    counts = Counter(pretokenize(text))
    words = [[bytes([b]) for b in word.encode("utf-8")] for word in counts]
    weights = list(counts.values())
    pair_counts: Counter = Counter()
    holders: dict[tuple[bytes, bytes], set[int]] = defaultdict(set)
    for index, (symbols, weight) in enumerate(zip(words, weights)):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += weight
            holders[pair].add(index)
    heap = [_Largest(count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[bytes, bytes]] = []
    while heap and len(merges) < n_merges:
        top = heapq.heappop(heap)
        if pair_counts.get(top.pair) != top.count:
            continue   # stale: the pair's count changed since this entry was pushed
        merges.append(top.pair)
        changed = set()
        for index in holders.pop(top.pair):
            symbols, weight = words[index], weights[index]
            merged = merge_pair(symbols, top.pair)
            if len(merged) == len(symbols):
                continue
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] -= weight
                changed.add(pair)
            for pair in zip(merged, merged[1:]):
                pair_counts[pair] += weight
                holders[pair].add(index)
                changed.add(pair)
            words[index] = merged
        for pair in changed:
            if pair_counts[pair] > 0:
                heapq.heappush(heap, _Largest(pair_counts[pair], pair))
            else:
                del pair_counts[pair]
    return merges
