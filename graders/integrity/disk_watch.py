"""A confined kernel's writes to the host's disk, bounded.

Its scratch folders are memory of a bounded size (graders.integrity.sandbox_kernel.SCRATCH_MB), but
its records and sockets are host folders this process reads, and no single file there grows past
FILE_MB: only their number is left. A watch stops the kernel once they hold more than
`max_bytes` of disk or `max_entries` files, so that one notebook cannot fill the disk under the
class graded beside it; its cell is reported as stopped for that.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

MAX_BYTES = 2 * 2**30      # a whole notebook's records take tens of MiB
MAX_ENTRIES = 10_000       # a whole notebook's records are a few hundred files


def disk_use(folders, max_entries: int) -> tuple[int, int]:
    """(bytes of disk, entries) under `folders`, counting stops past `max_entries`."""
    used = entries = 0
    stack = [str(f) for f in folders]
    while stack and entries <= max_entries:
        try:
            with os.scandir(stack.pop()) as found:
                for entry in found:
                    entries += 1
                    stat = entry.stat(follow_symlinks=False)
                    used += stat.st_blocks * 512        # disk taken, not apparent size (sparse files)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:   # removed meanwhile
            continue
    return used, entries


class DiskWatch:
    """While in use, looks at `folders` every `every` seconds and calls `stop()` once when they
    hold more than `max_bytes` or `max_entries`; `exceeded` then says what was written."""

    def __init__(self, folders: list[Path], stop, max_bytes: int = MAX_BYTES,
                 max_entries: int = MAX_ENTRIES, every: float = 0.5):
        self.folders, self.stop, self.every = folders, stop, every
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.exceeded: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            used, entries = disk_use(self.folders, self.max_entries)
            if used > self.max_bytes or entries > self.max_entries:
                self.exceeded = (f"more than {self.max_bytes // 2**20:,} MiB" if used > self.max_bytes
                                 else f"more than {self.max_entries:,} files")
                self.stop()
                return
