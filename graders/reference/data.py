"""Course data (tiny Shakespeare) and trained models passed between notebooks.

`tinyshakespeare_path()` finds the 1.1 MB tiny Shakespeare text, verified by sha256, in this
order:
1. `$GPT2_COURSE_SHAKESPEARE`, if set (a file that is missing or has the wrong sha256 is an
   error: an explicit setting is never silently replaced by something else);
2. the course cache, `graders.reference.paths.cache_dir("data")/tinyshakespeare.txt`;
3. `<course folder>/../shared/data/tinyshakespeare.txt`, the offline location the tests and CI
   use (the course folder is the one holding `graders/`);
4. a download from Karpathy's char-rnn repository into the cache (online users only).
If none works, the error says where to put the file and which sha256 it must have.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from graders.reference.paths import cache_dir, sha256_file

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

SHAKESPEARE_ENV = "GPT2_COURSE_SHAKESPEARE"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
FILE_NAME = "tinyshakespeare.txt"
ROOT = Path(__file__).resolve().parents[2]
SHARED_PATH = ROOT.parent / "shared" / "data" / FILE_NAME


class DataFileError(RuntimeError):
    """A course data file is missing or is not the expected file."""


def _where_to_put_it() -> str:
    return (f"Download {SHAKESPEARE_URL} and either save it as {cache_dir('data') / FILE_NAME} "
            f"or set the environment variable {SHAKESPEARE_ENV} to its path. "
            f"Its sha256 must be {SHAKESPEARE_SHA256}.")


def _verified(path: Path) -> bool:
    return path.is_file() and sha256_file(path) == SHAKESPEARE_SHA256


def _download(target: Path) -> None:
    import urllib.request

    partial = target.with_suffix(".part")
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as response:
            partial.write_bytes(response.read())
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise DataFileError(f"tiny Shakespeare is not on this machine and downloading it failed "
                            f"({err}). {_where_to_put_it()}") from None
    if sha256_file(partial) != SHAKESPEARE_SHA256:
        actual = sha256_file(partial)
        partial.unlink()
        raise DataFileError(f"the downloaded tiny Shakespeare has sha256 {actual}, expected "
                            f"{SHAKESPEARE_SHA256}. {_where_to_put_it()}")
    partial.replace(target)


def tinyshakespeare_path(download: bool = True) -> Path:
    """The path of a verified copy of tiny Shakespeare (see the module docstring for the order)."""
    explicit = os.environ.get(SHAKESPEARE_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise DataFileError(f"{SHAKESPEARE_ENV} is set to {path}, but there is no file there. "
                                f"Put tiny Shakespeare (sha256 {SHAKESPEARE_SHA256}) at that path, "
                                f"or unset {SHAKESPEARE_ENV} to use the course cache.")
        actual = sha256_file(path)
        if actual != SHAKESPEARE_SHA256:
            raise DataFileError(f"{SHAKESPEARE_ENV} points at {path}, whose sha256 is {actual}; "
                                f"tiny Shakespeare's is {SHAKESPEARE_SHA256}. The file is corrupt "
                                f"or a different text: replace it with {SHAKESPEARE_URL}.")
        return path
    cached = cache_dir("data") / FILE_NAME
    if _verified(cached):
        return cached
    if _verified(SHARED_PATH):
        return SHARED_PATH
    if not download:
        raise DataFileError(f"tiny Shakespeare was not found. {_where_to_put_it()}")
    _download(cached)
    return cached


def load_tinyshakespeare() -> str:
    """The text of tiny Shakespeare (1,115,394 characters)."""
    return tinyshakespeare_path().read_text(encoding="utf-8")


# --- Trained models handed from one notebook to the next -------------------------------------

def model_dir(name: str) -> Path:
    """Where the model `name` is saved: `cache_dir("models")/name/`."""
    return cache_dir("models", name)


def save_model(model, name: str, vocab=None) -> Path:
    """Save a DemoTransformer's weights (safetensors) and its Config (JSON) under `name`, with
    its `graders.reference.vocab.CompactVocab` (JSON) if it was trained on one: the model's token
    ids mean nothing without that map. Saving without one removes a map saved there before."""
    import dataclasses

    from safetensors.torch import save_file

    folder = model_dir(name)
    if vocab is not None and vocab.d_vocab != model.cfg.d_vocab:
        raise ValueError(f"the vocabulary has {vocab.d_vocab} ids but the model {model.cfg.d_vocab}")
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(dataclasses.asdict(model.cfg), indent=2))
    if vocab is not None:
        (folder / VOCAB_FILE).write_text(vocab.to_json())
    else:
        (folder / VOCAB_FILE).unlink(missing_ok=True)
    return folder


VOCAB_FILE = "vocab.json"


def load_vocab(name: str):
    """The CompactVocab saved with the model `name`, or None if it uses GPT-2's full vocabulary."""
    from graders.reference.vocab import CompactVocab

    path = model_dir(name) / VOCAB_FILE
    return CompactVocab.from_json(path.read_text()) if path.is_file() else None


def load_model(name: str, model_class=None):
    """Rebuild the model saved under `name` (by default as graders.reference.components.DemoTransformer).

    Its vocabulary map, if any, is `load_vocab(name)`."""
    from safetensors.torch import load_file

    from graders.reference.config import Config

    folder = model_dir(name)
    if not (folder / "model.safetensors").is_file():
        raise DataFileError(f"no trained model called {name!r} in {folder}: run the notebook that "
                            "trains and saves it first.")
    if model_class is None:
        from graders.reference.components import DemoTransformer as model_class
    cfg = Config(**json.loads((folder / "config.json").read_text()))
    model = model_class(cfg)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval()
