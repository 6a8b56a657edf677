"""The compact vocabulary of notebook 07 (graders.reference.vocab)."""
import pytest
import torch

from graders.reference.tokenizer import gpt2_encoding
from graders.reference.vocab import UNKNOWN_TEXT, CompactTokenizer, CompactVocab


def test_map_and_back():
    vocab = CompactVocab.from_ids(torch.tensor([[40, 7, 40], [50256, 7, 3]]))
    assert vocab.kept == (3, 7, 40, 50256) and vocab.d_vocab == 5 and vocab.unknown == 4
    old = torch.tensor([[3, 7, 40, 50256, 0, 12345]])
    new = vocab.encode_ids(old)
    assert new.tolist() == [[0, 1, 2, 3, 4, 4]]            # 0 and 12345 were never seen
    assert vocab.decode_ids(new).tolist() == [[3, 7, 40, 50256, -1, -1]]
    assert CompactVocab.from_json(vocab.to_json()) == vocab
    with pytest.raises(ValueError):
        vocab.encode_ids(torch.tensor([50257]))
    with pytest.raises(ValueError):
        vocab.decode_ids(torch.tensor([5]))
    with pytest.raises(ValueError):
        CompactVocab((7, 3))


def test_tokenizer_round_trip_and_unknown_tokens():
    enc = gpt2_encoding()
    seen = "To be, or not to be, that is the question."
    vocab = CompactVocab.from_ids(torch.tensor(enc.encode_ordinary(seen)))
    tokenizer = CompactTokenizer(enc, vocab)
    ids = tokenizer.encode_ordinary(seen)
    assert max(ids) < vocab.unknown and tokenizer.decode(ids) == seen
    ids = tokenizer.encode_ordinary(" be the xylophone")      # ' xylophone' was never seen
    assert ids[:2] == tokenizer.encode_ordinary(" be the") and set(ids[2:]) == {vocab.unknown}
    assert tokenizer.decode(ids).startswith(" be the" + UNKNOWN_TEXT)
    assert tokenizer.eot_token == vocab.unknown and tokenizer.n_vocab == vocab.d_vocab
