"""graders.reference.data: tiny Shakespeare is found offline, verified, and a bad file gets a clear message."""
from pathlib import Path

import pytest

from graders.reference import data

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """An empty course cache, no environment override, no shared copy, no network."""
    monkeypatch.setenv("GPT2_COURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(data.SHAKESPEARE_ENV, raising=False)
    monkeypatch.setattr(data, "SHARED_PATH", tmp_path / "nowhere" / data.FILE_NAME)

    def offline(url, timeout=None):
        raise OSError("network is unreachable (test)")
    monkeypatch.setattr("urllib.request.urlopen", offline)
    return tmp_path


def test_environment_variable_is_used(isolated, monkeypatch):
    if not SHARED.is_file():
        pytest.skip(f"tiny Shakespeare is not at {SHARED}")
    monkeypatch.setenv(data.SHAKESPEARE_ENV, str(SHARED))
    assert data.tinyshakespeare_path() == SHARED
    text = data.load_tinyshakespeare()
    assert len(text) == 1115394 and text.startswith("First Citizen:")


def test_shared_folder_is_the_offline_fallback(monkeypatch, tmp_path):
    if not SHARED.is_file():
        pytest.skip(f"tiny Shakespeare is not at {SHARED}")
    monkeypatch.setenv("GPT2_COURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(data.SHAKESPEARE_ENV, raising=False)
    assert data.SHARED_PATH.resolve() == SHARED.resolve()
    assert data.tinyshakespeare_path(download=False).resolve() == SHARED.resolve()


def test_missing_file_named_by_the_variable(isolated, monkeypatch):
    missing = isolated / "absent.txt"
    monkeypatch.setenv(data.SHAKESPEARE_ENV, str(missing))
    with pytest.raises(data.DataFileError) as error:
        data.tinyshakespeare_path()
    message = str(error.value)
    assert data.SHAKESPEARE_ENV in message and str(missing) in message
    assert data.SHAKESPEARE_SHA256 in message


def test_corrupt_file_is_refused(isolated, monkeypatch):
    corrupt = isolated / "corrupt.txt"
    corrupt.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    monkeypatch.setenv(data.SHAKESPEARE_ENV, str(corrupt))
    with pytest.raises(data.DataFileError) as error:
        data.tinyshakespeare_path()
    message = str(error.value)
    assert "corrupt" in message and data.SHAKESPEARE_SHA256 in message and data.SHAKESPEARE_ENV in message


def test_offline_without_any_copy_says_where_to_put_it(isolated):
    with pytest.raises(data.DataFileError) as error:
        data.tinyshakespeare_path()
    message = str(error.value)
    assert "downloading it failed" in message
    assert data.SHAKESPEARE_ENV in message and data.SHAKESPEARE_SHA256 in message
    assert str(isolated / "cache" / "data" / data.FILE_NAME) in message
    assert not (isolated / "cache" / "data" / "tinyshakespeare.part").exists()


def test_corrupt_download_is_not_cached(isolated, monkeypatch):
    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return b"<html>rate limited</html>"
    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout=None: Response())
    with pytest.raises(data.DataFileError, match="sha256"):
        data.tinyshakespeare_path()
    assert not any((isolated / "cache" / "data").iterdir())


def test_download_is_verified_and_cached(isolated, monkeypatch):
    if not SHARED.is_file():
        pytest.skip(f"tiny Shakespeare is not at {SHARED}")

    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return SHARED.read_bytes()
    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout=None: Response())
    path = data.tinyshakespeare_path()
    assert path == isolated / "cache" / "data" / data.FILE_NAME
    monkeypatch.setattr("urllib.request.urlopen", None)     # the second call uses the cache
    assert data.tinyshakespeare_path() == path


def test_models_round_trip(isolated):
    import torch

    from graders.reference.components import DemoTransformer
    from graders.reference.config import Config

    cfg = Config(d_vocab=100, n_ctx=16, d_model=32, n_layers=1, n_heads=2, d_head=16, d_mlp=64)
    torch.manual_seed(0)
    model = DemoTransformer(cfg)
    data.save_model(model, "roundtrip")
    loaded = data.load_model("roundtrip")
    assert loaded.cfg == cfg
    tokens = torch.randint(0, 100, (2, 16))
    assert torch.equal(loaded(tokens), model.eval()(tokens))
    with pytest.raises(data.DataFileError, match="no trained model"):
        data.load_model("never-saved")


def test_model_saved_with_its_vocabulary(isolated):
    import torch

    from graders.reference.components import DemoTransformer
    from graders.reference.config import Config
    from graders.reference.vocab import CompactVocab

    vocab = CompactVocab.from_ids(torch.tensor([5, 900, 5, 50256, 17]))
    cfg = Config(d_vocab=vocab.d_vocab, n_ctx=8, d_model=32, n_layers=1, n_heads=2, d_head=16, d_mlp=64)
    model = DemoTransformer(cfg)
    data.save_model(model, "compact", vocab=vocab)
    assert data.load_vocab("compact") == vocab and data.load_model("compact").cfg == cfg
    data.save_model(model.__class__(Config(d_vocab=100, n_ctx=8, d_model=32, n_layers=1, n_heads=2,
                                           d_head=16, d_mlp=64)), "compact")
    assert data.load_vocab("compact") is None           # a full-vocabulary model replaced it
    with pytest.raises(ValueError, match="vocabulary has 5 ids but the model 100"):
        data.save_model(DemoTransformer(Config(d_vocab=100, n_ctx=8, d_model=32, n_layers=1,
                                               n_heads=2, d_head=16, d_mlp=64)), "bad", vocab=vocab)
