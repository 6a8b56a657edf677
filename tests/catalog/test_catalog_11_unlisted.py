"""Notebook 11's mistakes nobody listed: each is named from what its output shows, or located (the
pre-token, the token, the merge step), and never misnamed."""
from collections import Counter

import pytest

from graders.exercises import nb11
from catalog_helpers import fails_with
from catalog_11_shared import byte_decoder, decoder, pretokenize
from test_catalog_11_encoding import _encoder
from test_catalog_11_training import train_recount


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
