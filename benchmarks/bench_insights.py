"""How long a class's insights take once its grades exist, printed (not a test):
`python benchmarks/bench_insights.py` (after `make grade`, whose example class it starts from).

A class of --students generated students: the example class's graded entries (results.json)
repeated with varied answers, each copy under a name of its own, its points in every failed
cell redrawn, its messages' numbers changed and, for one copy in three, its failures swapped for
another student's of the same cell. Timed: graders.harness.insights.write_insights (figures, the
page with its heat map, insights.json and the CSVs), the median of --rounds, in a fresh folder.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def varied_class(entries: list[dict], students: int, seed: int = 0) -> list[dict]:
    """`students` students made of the example class's, each one's answers varied."""
    rng = random.Random(seed)
    bases = sorted({e["student"] for e in entries})
    failures: dict[tuple[str, str], list[dict]] = {}
    for entry in entries:
        for cell in entry["cells"]:
            if cell["status"] == "failed":
                failures.setdefault((entry["notebook"], cell["grade_id"]), []).append(cell)
    made = []
    for number in range(students):
        base, name = bases[number % len(bases)], f"student_{number:03d}"
        for entry in (e for e in entries if e["student"] == base):
            cells = []
            for cell in entry["cells"]:
                cell = dict(cell)
                if cell["status"] == "failed":
                    others = failures.get((entry["notebook"], cell["grade_id"]), [cell])
                    cell.update(rng.choice(others) if number % 3 == 0 else {})
                    cell["points"] = rng.choice([0.0, cell["max_points"] / 2])
                    cell["message"] = re.sub(r"\d+", lambda m: str(int(m.group()) + rng.randint(0, 3)),
                                             cell["message"])
                cells.append(cell)
            seconds = entry.get("seconds")
            made.append(dict(entry, student=name, cells=cells,
                             seconds=None if seconds is None else seconds * rng.uniform(0.8, 1.2)))
    return made


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "grading" / "example_class" / "results.json",
                        help="a graded class's results.json to vary (default: make grade's example class)")
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from graders.harness.insights import InsightsError, load_entries, write_insights

    try:
        entries = load_entries(args.results.parent)
    except InsightsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    generated = varied_class(entries, args.students)
    seconds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder)
            (out / "results.json").write_text(json.dumps(generated))
            start = time.perf_counter()
            write_insights(out)
            seconds.append(time.perf_counter() - start)
    notebooks = len({e["notebook"] for e in generated})
    cells = len({(e["notebook"], c["grade_id"]) for e in generated for c in e["cells"]})
    print(f"insights of {args.students} students x {notebooks} notebooks ({cells} test cells): "
          f"median {statistics.median(seconds):.2f} s of {args.rounds} rounds "
          f"(min {min(seconds):.2f}, max {max(seconds):.2f}); write_insights from results.json to "
          f"page, JSON and CSVs; {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
          f"load average {os.getloadavg()[0]:.1f}, Python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
