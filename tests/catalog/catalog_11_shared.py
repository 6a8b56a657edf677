"""The learner's side of notebook 11's catalogs: the notebook's globals (GPT-2's byte table,
pre-tokenizer, vocabulary and merges), as the answers read them."""
import json

import regex

from graders.reference.tokenizer import bpe_files

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
