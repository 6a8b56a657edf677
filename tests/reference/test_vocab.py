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


def test_notebook_08_loads_a_compact_model_and_decodes_with_its_map(monkeypatch, tmp_path):
    """08's setup cell, run on a model saved by 07 with a compact vocabulary: its `enc` speaks the
    model's ids, and text with tokens 07 never saw encodes to the unknown id instead of crashing."""
    import json

    import matplotlib

    from graders.reference import data
    from graders.reference.components import DemoTransformer
    from graders.reference.config import Config

    matplotlib.use("Agg")
    monkeypatch.setenv("GPT2_COURSE_CACHE", str(tmp_path / "cache"))
    seen = " O Romeo, Romeo, wherefore art thou Romeo? To be, or not to be"
    vocab = CompactVocab.from_ids(torch.tensor(gpt2_encoding().encode_ordinary(seen)))
    torch.manual_seed(0)
    model = DemoTransformer(Config(d_vocab=vocab.d_vocab, n_ctx=16, d_model=32, n_layers=1,
                                   n_heads=2, d_head=16, d_mlp=64))
    data.save_model(model, "07-shakespeare", vocab=vocab)
    notebook = json.load(open("solutions/08_sampling.ipynb"))
    setup = next(c for c in notebook["cells"]
                 if c["metadata"].get("nbgrader", {}).get("grade_id") == "setup")
    namespace = {}
    exec("".join(setup["source"]), namespace)
    assert namespace["model"].cfg.d_vocab == vocab.d_vocab
    enc, to_ids = namespace["enc"], namespace["to_ids"]
    assert enc.decode(to_ids(seen)[0].tolist()) == seen
    ids = to_ids(" Romeo and the xylophone")
    assert int(ids.max()) == vocab.unknown and namespace["next_logits"](" the xylophone").shape == (1, vocab.d_vocab)
    assert UNKNOWN_TEXT in enc.decode(ids[0].tolist())
