"""Finding the submissions in a folder, and accounting for every file in it.

Accepted layouts, mixed freely: nbgrader's `submitted/<student>/<assignment>/<nb>.ipynb` (a
course folder, with each submission's `timestamp.txt`), plain `<student>/<nb>.ipynb` folders,
`<student>.zip` archives, and the flat files an LMS download gives, `<student>_<nb>.ipynb`.

Every file is either graded or reported. A corrupt archive costs its student (reported), never
the class. When a student handed in several copies of one notebook (`01_layernorm-Copy1.ipynb`
beside the original), the note says which copy was graded and which were not; a notebook under
another name is recognised by its nbgrader cell ids. Files that belong to no student, or are no
notebook of the course, are listed as ignored with the reason.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from graders.layout import notebook_names

# Jupyter's "Make a copy" (`-Copy1`), a browser's second download (` (1)`), a file manager's ` copy`.
COPY_SUFFIX = r"(?:-Copy\d*| ?\(\d+\)| copy(?: \d+)?)"


class IntakeError(ValueError):
    """A submissions folder that cannot be read at all (the message says why)."""


@dataclass
class Submission:
    """One student's notebook as found, or not found (path None), with what the report says about it."""
    student: str
    notebook: str
    path: Path | None = None
    label: str = ""                  # where it was found, relative to the submissions folder
    notes: list[str] = field(default_factory=list)
    folder: Path | None = None       # its nbgrader submission folder (timestamp.txt, ...), if any
    timestamp: str | None = None     # nbgrader's timestamp.txt, as written by `nbgrader submit`
    sha256: str = ""


@dataclass
class Intake:
    submissions: dict[str, dict[str, Submission]]   # student -> notebook -> submission
    names: list[str]                                 # the notebooks this run grades
    ignored: list[str]                               # "<file>: why it was not graded"


@dataclass
class _Candidate:
    path: Path
    label: str
    stem: str    # the name it was handed in under (for an LMS file, without the student's prefix)


def discover(folder: Path, names: list[str] | None, unpack_to: Path) -> Intake:
    """Every student's submission of each notebook in `names` (default: each graded course
    notebook that anybody handed in, so that a class given two notebooks is not marked missing
    on the rest). Archives are unpacked under `unpack_to`."""
    root = folder / "submitted" if (folder / "submitted").is_dir() else folder
    if not root.is_dir():
        raise IntakeError(f"{folder} is not a folder (expected a folder of submissions)")
    candidates: dict[str, list[_Candidate]] = {}
    problems: dict[str, list[str]] = {}
    ignored: list[str] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or entry.name == "__MACOSX":
            ignored.append(f"{entry.name}: a hidden or system file: not graded")
        elif entry.is_dir():
            candidates.setdefault(entry.name, []).extend(
                _Candidate(p, str(p.relative_to(root)), p.stem) for p in sorted(entry.rglob("*.ipynb"))
                if ".ipynb_checkpoints" not in p.parts)
        elif entry.suffix.lower() == ".zip":
            found, trouble = _unpack(entry, unpack_to / entry.stem)
            candidates.setdefault(entry.stem, []).extend(found)
            problems.setdefault(entry.stem, []).extend(f"{entry.name}: {reason}" for reason in trouble)
            ignored += [f"{entry.name}: {reason}" for reason in trouble]
        elif entry.suffix == ".ipynb":
            student, stem = _lms_owner(entry.stem)
            if student:
                candidates.setdefault(student, []).append(_Candidate(entry, entry.name, stem))
            else:
                ignored.append(f"{entry.name}: a loose notebook whose name is not "
                               "<student>_<notebook>.ipynb for a notebook of this course, so it "
                               "belongs to no student: not graded")
        else:
            ignored.append(f"{entry.name}: not a student folder, a .zip or a notebook: not graded")

    chosen: dict[str, dict[str, tuple[_Candidate, list[str]]]] = {}
    for student, found in candidates.items():
        chosen[student], unknown = _choose(found)
        ignored += [f"{c.label}: not a notebook of this course (no matching name or nbgrader "
                    "cell ids): not graded" for c in unknown]
    names = names or [n for n in graded_notebooks() if any(n in c for c in chosen.values())]
    submissions = {}
    for student in sorted(chosen):
        submissions[student] = {}
        for name in names:
            if name in chosen[student]:
                candidate, notes = chosen[student][name]
                submissions[student][name] = _found(student, name, candidate, notes)
            else:
                why = "".join(f" ({p})" for p in problems.get(student, []))
                submissions[student][name] = Submission(
                    student, name, notes=[f"{name}.ipynb is missing from the submission{why}"])
    return Intake(submissions, names, ignored)


def graded_notebooks() -> list[str]:
    """The course's notebooks that have test cells (00_tour has none)."""
    from graders.harness.cells import source_notebook, test_cells

    return [name for name in notebook_names() if test_cells(source_notebook(name))]


def _found(student: str, name: str, candidate: _Candidate, notes: list[str]) -> Submission:
    stamp = candidate.path.parent / "timestamp.txt"
    nbgrader_folder = stamp.is_file()  # `nbgrader submit`/`collect` put one beside the notebooks
    return Submission(student, name, candidate.path, candidate.label, notes,
                      folder=candidate.path.parent if nbgrader_folder else None,
                      timestamp=stamp.read_text().strip() if nbgrader_folder else None,
                      sha256=hashlib.sha256(candidate.path.read_bytes()).hexdigest())


def _unpack(archive: Path, target: Path) -> tuple[list[_Candidate], list[str]]:
    """The notebooks in a student's archive, and what went wrong reading it."""
    found, trouble = [], []
    try:
        with zipfile.ZipFile(archive) as opened:
            for member in opened.infolist():
                parts = Path(member.filename).parts
                if member.is_dir() or not member.filename.endswith(".ipynb") or "__MACOSX" in parts \
                        or parts[-1].startswith("._") or ".ipynb_checkpoints" in parts:
                    continue
                if member.filename.startswith("/") or ".." in parts:
                    trouble.append(f"its entry {member.filename} points outside the archive: not extracted")
                    continue
                destination = target.joinpath(*parts)
                try:
                    data = opened.read(member)
                except (zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError) as err:
                    trouble.append(f"its entry {member.filename} could not be extracted ({err})")
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(data)
                found.append(_Candidate(destination, f"{archive.name}:{member.filename}", destination.stem))
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        trouble.append(f"could not be opened ({type(err).__name__}: {err}): nothing in it was graded")
    return sorted(found, key=lambda c: c.label), trouble


def _lms_owner(stem: str) -> tuple[str | None, str]:
    """(student, notebook stem) for an LMS download named `<student>_<notebook>.ipynb`."""
    for name in notebook_names():
        match = re.fullmatch(rf"(.+?)_({re.escape(name)}{COPY_SUFFIX}?)", stem)
        if match:
            return match.group(1), match.group(2)
    return None, stem


def _choose(found: list[_Candidate]) -> tuple[dict[str, tuple[_Candidate, list[str]]], list[_Candidate]]:
    """{notebook: (the copy graded, notes)} and the files that are no notebook of the course.

    A file named exactly like the notebook wins over a copy (`-Copy1`, ` (1)`), which wins over
    a file recognised only by its cells; among equals, the first in path order."""
    names = notebook_names()
    ranked: dict[str, list[tuple[int, _Candidate]]] = {}
    unknown = []
    for candidate in found:
        base = re.sub(rf"{COPY_SUFFIX}$", "", candidate.stem)
        if base in names:
            ranked.setdefault(base, []).append((0 if candidate.stem == base else 1, candidate))
            continue
        recognised = _identify(candidate.path, names)
        if recognised:
            ranked.setdefault(recognised, []).append((2, candidate))
        else:
            unknown.append(candidate)
    chosen = {}
    for name, options in ranked.items():
        options.sort(key=lambda option: (option[0], option[1].label))
        (rank, graded), others = options[0], [c for _, c in options[1:]]
        notes = []
        if rank:
            notes.append(f"submitted as {graded.label} (renamed): graded as {name}.ipynb")
        if others:
            notes.append(f"{len(options)} copies of {name}.ipynb were handed in: graded {graded.label}; "
                         f"not graded: {', '.join(c.label for c in others)}")
        chosen[name] = (graded, notes)
    return chosen, unknown


def _identify(path: Path, names: list[str]) -> str | None:
    """The course notebook whose nbgrader cell ids this file shares most (at least half of
    the ids of both together), if any. Cell ids every notebook has (`setup`) alone match none."""
    try:
        cells = json.loads(path.read_text()).get("cells", [])
        ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in cells} - {None}
    except (OSError, ValueError, AttributeError):
        return None
    overlaps = {name: len(ids & _cell_ids(name)) / len(ids | _cell_ids(name))
                for name in names if ids | _cell_ids(name)}
    best = max(overlaps, key=overlaps.get, default=None)
    return best if best and overlaps[best] >= 0.5 else None


@functools.lru_cache(maxsize=None)
def _cell_ids(name: str) -> frozenset:
    from graders.harness.cells import nbgrader_meta, source_notebook

    return frozenset(nbgrader_meta(c).get("grade_id") for c in source_notebook(name).cells) - {None}
