"""Where the course keeps generated files (outside git): weights, tokenizer, activations."""
import os
from pathlib import Path

CACHE_ENV = "GPT2_COURSE_CACHE"


def cache_dir(*parts: str) -> Path:
    """`$GPT2_COURSE_CACHE`, else `~/.cache/gpt2-from-scratch`, joined with `parts`, created."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gpt2-from-scratch"
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
