"""Where the course keeps generated files (outside git): weights, tokenizer, activations, and
what is being built for it now (`building`: a check's progress line says it)."""
import contextlib
import os
from pathlib import Path

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

CACHE_ENV = "GPT2_COURSE_CACHE"


def cache_dir(*parts: str) -> Path:
    """`$GPT2_COURSE_CACHE`, else `~/.cache/gpt2-from-scratch`, joined with `parts`, created."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gpt2-from-scratch"
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write(path: Path, write) -> Path:
    """Call `write(temporary_path)`, then move the result to `path` in one step.

    Readers never see half a file, and processes that produce the same file at the same time
    each write their own temporary copy, so none finds its file gone.
    """
    import tempfile

    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


def atomic_folder(path: Path, write, replace_broken: bool = False) -> Path:
    """Call `write(temporary_folder)`, then put it at `path` in one step.

    A folder another process put at `path` meanwhile is kept (it is complete: it got there the
    same way) unless `replace_broken`: the caller found the one there unreadable. Removing a
    good copy would pull it from under the processes reading it.
    """
    import shutil
    import tempfile

    temporary = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        write(temporary)
        if replace_broken and path.exists():
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.replace(temporary, path)
        except OSError:  # another process just put a complete copy there: keep theirs
            pass
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return path


def sha256_file(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_building: list[str] = []   # what is being built for the cache now, innermost last


@contextlib.contextmanager
def building(what: str):
    """While the block runs, `being_built()` is `what` ("generating the synthetic reference"): a
    check that waits for it says so in its progress line (graders.judging.progress.busy)."""
    _building.append(what)
    try:
        yield
    finally:
        _building.remove(what)


def being_built() -> str | None:
    return _building[-1] if _building else None
