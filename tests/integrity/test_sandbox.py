"""What a confined kernel is given to read (graders.integrity.sandbox.kernel_files)."""
import os
from pathlib import Path

from graders.integrity import sandbox
from graders.reference import store
from graders.reference.paths import CACHE_ENV


def test_a_cache_file_renamed_away_while_the_files_are_listed_does_not_stop_the_grading(tmp_path, monkeypatch):
    """Two workers grading a class on a new machine fill the same cache: one's half-written
    ".ranks-*.tmp" can be listed by the other and renamed before it is made readable. The
    files the kernel reads still come out readable by every uid."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(b"0")
    monkeypatch.setattr(store, "weights_file", lambda: weights)
    tokenizer = tmp_path / "cache" / "tokenizer-gpt2"
    tokenizer.mkdir(parents=True)
    kept = tokenizer / "ranks.tiktoken"
    kept.write_text("ranks")
    os.chmod(kept, 0o600)
    listed = Path.rglob

    def listed_before_a_rename(self, pattern):
        return [*listed(self, pattern), self / ".ranks.tiktoken.abc.tmp"]   # gone by now

    monkeypatch.setattr(Path, "rglob", listed_before_a_rename)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    files = sandbox.kernel_files(inputs)
    assert tokenizer in files and weights in files
    assert kept.stat().st_mode & 0o444 == 0o444
