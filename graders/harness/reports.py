"""The plain-files view of a class's results: grades.csv and one text report per student.

Both are rebuilt from OUT/results.json (graders.harness.results), so they always agree with
it and with nbgrader's gradebook, which receives the same verdicts.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

from graders.layout import notebook_names


def safe(name: str) -> str:
    """A student's name as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def write_grades_csv(out: Path, results) -> None:
    """One row per student, one column per test cell of every notebook graded so far."""
    from graders.harness.cells import nbgrader_meta, points_of, source_notebook, test_cells

    graded = {notebook for _, notebook in results.entries}
    columns = [(name, nbgrader_meta(c)["grade_id"], points_of(c))
               for name in notebook_names() if name in graded for c in test_cells(source_notebook(name))]
    maximum = sum(points for _, _, points in columns)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student"] + [f"{n}/{g}" for n, g, _ in columns] + ["total", "max"])
        for student in results.students():
            cells = {(name, c["grade_id"]): c["points"]
                     for name, entry in results.of(student).items() for c in entry["cells"]}
            row = [cells.get((n, g), 0.0) for n, g, _ in columns]
            writer.writerow([student] + [f"{p:g}" for p in row] + [f"{sum(row):g}", f"{maximum:g}"])


def write_report(out: Path, student: str, results) -> None:
    """reports/<student>.txt: per notebook the score, the notes, and why each point was lost."""
    lines = [f"Grading report for {student}", ""]
    for name, entry in sorted(results.of(student).items()):
        got = sum(c["points"] for c in entry["cells"])
        total = sum(c["max_points"] for c in entry["cells"])
        lines.append(f"{name}: {got:g} / {total:g}")
        lines += [f"  note: {note}" for note in entry.get("notes", []) + entry["flags"] + entry.get("copies", [])]
        for cell in entry["cells"]:
            if cell["points"] < cell["max_points"]:
                message = cell["message"].replace("\n", "\n      ")
                lines.append(f"  - {cell['grade_id']}: lost {cell['max_points'] - cell['points']:g} "
                             f"({cell['status']}): {message}")
        lines.append("")
    (out / "reports").mkdir(parents=True, exist_ok=True)
    (out / "reports" / f"{safe(student)}.txt").write_text("\n".join(lines))
