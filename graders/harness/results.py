"""A class's results, kept in OUT/results.json and saved as each notebook finishes.

One entry per (student, notebook): the verdict of each test cell, the notes and flags behind
them, the seconds grading took, and which file was graded (its sha256, its nbgrader timestamp)
by which grader. That makes grading resumable and mergeable: an interrupted run keeps every
notebook it finished; running again grades only what is new or changed (a different file, or a
different grader); a second batch of submissions (late ones) is merged in, and a notebook a
student did not hand in again keeps its earlier grade.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from graders.layout import ROOT, SOLUTIONS


class ResultsError(ValueError):
    """An output folder whose results.json cannot be read (the message says what to do)."""


@functools.lru_cache(maxsize=1)
def grader_version() -> str:
    """What a verdict depends on besides the submission: the graders package's sources, the
    source notebooks (tests, points, hidden cases) and the reference weights (pretrained or
    synthetic). A change to any of them makes every stored verdict stale."""
    from graders.reference.store import reference_id

    digest = hashlib.sha256()
    package = ROOT / "graders"
    for path in sorted(package.rglob("*.py")) + sorted(SOLUTIONS.glob("*.ipynb")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(reference_id().fingerprint.encode())
    return digest.hexdigest()[:16]


def submission_key(submission) -> dict:
    """What identifies a graded file: its bytes, its nbgrader timestamp and the grader."""
    return {"file": submission.label, "sha256": submission.sha256,
            "timestamp": submission.timestamp, "grader": grader_version()}


class ClassResults:
    """The entries of OUT/results.json, by (student, notebook); rewritten whole on each change."""

    def __init__(self, out: Path):
        self.path = out / "results.json"
        self.entries: dict[tuple[str, str], dict] = {}
        if self.path.exists():
            try:
                loaded = json.loads(self.path.read_text())
                self.entries = {(e["student"], e["notebook"]): e for e in loaded}
            except (OSError, ValueError, TypeError, KeyError) as err:
                raise ResultsError(f"{self.path} cannot be read ({type(err).__name__}: {err}). It holds "
                                   "the results this run would add to: move it away, or choose "
                                   "another output folder (--out / OUT=).") from None

    def unchanged(self, submission) -> dict | None:
        """The stored entry of this exact file graded by this grader, if there is one."""
        entry = self.entries.get((submission.student, submission.notebook))
        if entry and entry.get("submission") == submission_key(submission):
            return entry
        return None

    def graded_before(self, student: str, notebook: str) -> bool:
        """Whether an earlier run graded a file for this student and notebook."""
        entry = self.entries.get((student, notebook))
        return bool(entry and entry.get("submission"))

    def put(self, entry: dict) -> None:
        self.entries[(entry["student"], entry["notebook"])] = entry
        self.save()

    def save(self) -> None:
        """Write results.json in one step: an interrupted write leaves the previous file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".json.tmp")
        ordered = [self.entries[key] for key in sorted(self.entries)]
        temporary.write_text(json.dumps(ordered, indent=1, sort_keys=True))
        os.replace(temporary, self.path)

    def students(self) -> list[str]:
        return sorted({student for student, _ in self.entries})

    def of(self, student: str) -> dict[str, dict]:
        return {notebook: e for (s, notebook), e in self.entries.items() if s == student}
