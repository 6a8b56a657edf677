"""What the class got wrong, as figures: computed from OUT/results.json alone.

Every `make grade` writes them (and `python -m graders.harness.insights OUT` from an existing
results.json): OUT/insights.html for reading (graders.harness.insights_page), OUT/insights.json
and a CSV per table in OUT/insights/ for pandas. The tables:

- cells: per notebook and test cell, the mean and median points, the shares with full marks, not
  written yet and not handed in, the crashes and time-outs, and a histogram of the points;
- mistakes: per test cell, each recognised mistake (counted by its key, graders.judging.compare
  .Mistake), each mistake named without a key (by its words), and the other failures by where
  they were localised (their message's first line, numbers dropped); each with the number of
  students and one example message, anonymised;
- hidden_only: per test cell, the students who passed every visible check and failed a hidden one;
- copies: per answer cell, the students whose answer is flagged as a near-copy;
- timing: the seconds grading took per notebook;
- students: each student's points per test cell (the heat map's rows), ordered by total.

Students' names are in this instructor's file only (the hidden-only and copy tables, the heat map):
never in an example message, and never on a learner's feedback page.
"""
from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

from graders.harness.copies import cell_notes
from graders.harness.reports import safe

NOT_WRITTEN = "not written yet"
BINS = 5   # histogram bins over each test cell's points, 0 to its maximum
TABLES = ("cells", "mistakes", "hidden_only", "copies", "timing")
LIKELY = "Likely mistake:"


class InsightsError(ValueError):
    """results.json is missing or unreadable (the message says which, in one line)."""


def load_entries(out: Path) -> list[dict]:
    """The entries of OUT/results.json, or InsightsError saying why there are none."""
    path = out / "results.json"
    try:
        entries = json.loads(path.read_text())
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "cells" in e for e in entries):
            raise ValueError("not a list of graded notebooks")
    except FileNotFoundError:
        raise InsightsError(f"{path} does not exist: grade the class first (make grade)") from None
    except (OSError, ValueError) as err:
        raise InsightsError(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    return entries


def anonymised(message: str, students: list[str]) -> str:
    """`message`'s first lines without any student's name or any file path."""
    text = "\n".join(message.split("\n")[:3])
    text = re.sub(r"(?<![\w.)\]])~?/(?:[\w.-]+/)*[\w.-]+", "<path>", text)
    for name in sorted(students, key=len, reverse=True):
        text = re.sub(rf"\b{re.escape(name)}\b", "<student>", text)
    return text


def localised(message: str) -> str:
    """Where an unnamed failure was found: its first line, without numbers, values or names."""
    first = message.split("\n")[0].split(LIKELY)[0].strip()
    return re.sub(r"\d+(\.\d+)?", "#", first)[:160]


def failure_group(cell: dict) -> tuple[str, str]:
    """(kind, label) under which a failed cell is counted: its mistake's key; the words of a
    mistake named without one; or where the failure was localised."""
    if cell.get("mistake"):
        return "key", cell["mistake"]
    message = cell.get("message", "")
    if LIKELY in message:
        return "named, no key", message.split(LIKELY, 1)[1].split("\n")[0].strip()[:160]
    return "localised", localised(message)


def _histogram(points: list[float], maximum: float) -> list[int]:
    counts = [0] * BINS
    for p in points:
        counts[min(BINS - 1, int(BINS * p / maximum)) if maximum else 0] += 1
    return counts


def _share(n: int, of: int) -> float:
    return round(n / of, 3) if of else 0.0


def cell_table(entries: list[dict]) -> list[dict]:
    by_cell: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for entry in entries:
        for cell in entry["cells"]:
            by_cell[(entry["notebook"], cell["grade_id"])].append(cell)
    rows = []
    for (notebook, grade_id), cells in by_cell.items():
        handed = [c for c in cells if c["status"] != "missing-notebook"]
        points = [c["points"] for c in handed]
        maximum = max(c["max_points"] for c in cells)
        status = Counter(c["status"] for c in handed)
        rows.append({
            "notebook": notebook, "cell": grade_id, "max_points": maximum, "students": len(handed),
            "not_handed_in": len(cells) - len(handed),
            "mean": round(statistics.fmean(points), 3) if points else None,
            "median": statistics.median(points) if points else None,
            "full_marks": _share(sum(p >= maximum for p in points), len(handed)),
            "not_written": _share(sum(NOT_WRITTEN in c.get("message", "") for c in handed), len(handed)),
            "crashed": status["crashed"], "timeout": status["timeout"],
            "histogram": _histogram(points, maximum)})
    return rows


def mistake_table(entries: list[dict], students: list[str]) -> list[dict]:
    found: dict[tuple, dict] = {}
    for entry in entries:
        for cell in entry["cells"]:
            if cell["status"] != "failed" or NOT_WRITTEN in cell.get("message", ""):
                continue
            kind, label = failure_group(cell)
            row = found.setdefault((entry["notebook"], cell["grade_id"], kind, label), {
                "notebook": entry["notebook"], "cell": cell["grade_id"], "kind": kind, "mistake": label,
                "students": 0, "example": anonymised(cell.get("message", ""), students)})
            row["students"] += 1
    return sorted(found.values(), key=lambda r: (r["notebook"], r["cell"], -r["students"], r["mistake"]))


def hidden_only_table(entries: list[dict]) -> list[dict]:
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for entry in entries:
        for cell in entry["cells"]:
            if cell.get("hidden_only"):
                found[(entry["notebook"], cell["grade_id"])].append(entry["student"])
    return [{"notebook": n, "cell": c, "students": len(names), "who": " ".join(sorted(names))}
            for (n, c), names in sorted(found.items())]


def copy_table(entries: list[dict]) -> list[dict]:
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for entry in entries:
        for answer in cell_notes(entry.get("flags", []) + entry.get("copies", [])):
            found[(entry["notebook"], answer)].append(entry["student"])
    return [{"notebook": n, "answer_cell": a, "students": len(names), "who": " ".join(sorted(names)),
             "reports": " ".join(f"reports/{safe(s)}.txt" for s in sorted(names))}
            for (n, a), names in sorted(found.items())]


def timing_table(entries: list[dict]) -> list[dict]:
    seconds: dict[str, list[float]] = defaultdict(list)
    for entry in entries:
        if entry.get("seconds") is not None:
            seconds[entry["notebook"]].append(entry["seconds"])
    return [{"notebook": n, "graded": len(s), "mean_seconds": round(statistics.fmean(s), 1),
             "median_seconds": round(statistics.median(s), 1), "max_seconds": max(s),
             "total_seconds": round(sum(s), 1)} for n, s in sorted(seconds.items())]


def student_rows(entries: list[dict]) -> dict:
    """The heat map: each student's share of each test cell's points, best total first."""
    columns = sorted({(e["notebook"], c["grade_id"]) for e in entries for c in e["cells"]})
    shares: dict[str, dict] = defaultdict(dict)
    totals: Counter = Counter()
    for entry in entries:
        for cell in entry["cells"]:
            shares[entry["student"]][(entry["notebook"], cell["grade_id"])] = \
                cell["points"] / cell["max_points"] if cell["max_points"] else 0.0
            totals[entry["student"]] += cell["points"]
    order = sorted(shares, key=lambda s: (-totals[s], s))
    return {"columns": [f"{n}/{c}" for n, c in columns], "students": order,
            "totals": [totals[s] for s in order],
            "shares": [[round(shares[s].get(col, 0.0), 3) for col in columns] for s in order]}


def figures(entries: list[dict]) -> dict:
    """Every table of the insights, from results.json's entries."""
    students = sorted({e["student"] for e in entries})
    return {"students": len(students), "notebooks": len({e["notebook"] for e in entries}),
            "cells": cell_table(entries), "mistakes": mistake_table(entries, students),
            "hidden_only": hidden_only_table(entries), "copies": copy_table(entries),
            "timing": timing_table(entries), "heat_map": student_rows(entries)}


def write_tables(out: Path, found: dict) -> None:
    """OUT/insights.json and OUT/insights/<table>.csv (the histogram as one column per bin)."""
    (out / "insights.json").write_text(json.dumps(found, indent=1))
    folder = out / "insights"
    folder.mkdir(exist_ok=True)
    for table in TABLES:
        rows = [_flat(row) for row in found[table]]
        with open(folder / f"{table}.csv", "w", newline="") as f:
            if rows:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)


def _flat(row: dict) -> dict:
    if "histogram" not in row:
        return row
    flat = {k: v for k, v in row.items() if k != "histogram"}
    flat.update({f"bin_{i}": n for i, n in enumerate(row["histogram"])})
    return flat


def write_insights(out: Path, entries: list[dict] | None = None) -> Path:
    """The page, the JSON and the CSVs for the class graded into `out`; returns the page's path."""
    from graders.harness.insights_page import page

    try:
        found = figures(load_entries(out) if entries is None else entries)
    except (KeyError, TypeError, ZeroDivisionError) as err:
        raise InsightsError(f"{out / 'results.json'} holds an entry it cannot count "
                            f"({type(err).__name__}: {err})") from None
    write_tables(out, found)
    path = out / "insights.html"
    path.write_text(page(found))
    return path


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m graders.harness.insights", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?", default=Path("grading"),
                        help="the output folder of `make grade`, holding results.json (default: grading)")
    args = parser.parse_args(argv)
    try:
        path = write_insights(args.out)
    except InsightsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"insights: {path} (tables: {args.out / 'insights.json'}, {args.out / 'insights'}/*.csv)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
