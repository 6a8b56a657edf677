"""Notebook 11 as a whole: a mistake in the pre-tokenizer or the byte table costs only their checks."""
from graders.exercises import nb11
from catalog_helpers import fails_with
from catalog_11_shared import pretokenize
from test_catalog_11_decoding import decode
from test_catalog_11_encoding import _encoder, bpe_by_index
from test_catalog_11_training import train_recount


# --- One mistake, one exercise

def test_a_mistake_in_the_pre_tokenizer_or_the_table_costs_only_their_checks(monkeypatch):
    """Training, encoding and decoding run the course's pretokenize and byte table under the
    learner's names: a wrong one fails its own check only. A notebook is one namespace; these
    answers are defined in several modules, so the wrong ones go into each of their globals."""
    wrong = {"pretokenize": lambda text: text.split(" "), "byte_encoder": {b: chr(b) for b in range(256)},
             "byte_decoder": {chr(b): b for b in range(256)}}
    for namespace in (globals(), train_recount.__globals__, bpe_by_index.__globals__, decode.__globals__):
        for name, value in wrong.items():
            monkeypatch.setitem(namespace, name, value)
    fails_with(nb11.check_pretokenize, pretokenize, expected="Likely mistake")
    nb11.check_train_bpe(train_recount, seed=1)
    nb11.check_encode(*_encoder(bpe_by_index), seed=2)
    nb11.check_decode(decode, seed=2)
