"""What a class run shows while it grades: one progress bar, fed by the workers' announcements
(Dask events) and by each notebook saved."""
from __future__ import annotations

import sys
import threading


class Progress:
    """The progress bar: notebooks graded of those to grade, which ones are being graded now,
    and the failed tests so far (with the last notebook that had one)."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="grading", unit="notebook", file=sys.stdout)
        self.running: list[str] = []
        self.done: set[str] = set()
        self.failed, self.last_failed = 0, ""
        self.lock = threading.Lock()

    def announced(self, event) -> None:
        """A worker's announcement (Dask event: (time, ["started" or "finished", "student/notebook"]))."""
        what, notebook = event[1]
        with self.lock:
            if what == "finished":
                self.done.add(notebook)
                if notebook in self.running:
                    self.running.remove(notebook)
            elif notebook not in self.done and notebook not in self.running:
                self.running.append(notebook)
            self._show()

    def finished(self, entry: dict) -> None:
        """A notebook graded and saved."""
        with self.lock:
            what = f"{entry['student']}/{entry['notebook']}"
            self.done.add(what)
            if what in self.running:
                self.running.remove(what)
            lost = sum(c["points"] < c["max_points"] for c in entry["cells"])
            if lost:
                self.failed, self.last_failed = self.failed + lost, what
            self.bar.update(1)
            self._show()

    def _show(self) -> None:
        now = ", ".join(self.running[:3]) + (f" +{len(self.running) - 3}" if len(self.running) > 3 else "")
        last = f" (last: {self.last_failed})" if self.failed else ""
        failed = f"failed tests so far: {self.failed}{last}"
        self.bar.set_postfix_str(f"now: {now or '-'} | {failed}")

    def close(self) -> None:
        self.bar.close()
