"""Grade a whole class: `python -m graders.harness.classroom --help` (what `make grade` runs).

Submissions may be laid out as nbgrader's `submitted/<student>/<assignment>/<nb>.ipynb`, as
plain `<student>/<nb>.ipynb` folders, or as `<student>.zip` files. Each (student, notebook)
is graded by `graders.harness.grading` on a Dask cluster: a local one with one worker per core by
default, or the scheduler named by `--scheduler` (the same code path). One submission's
failure never stops the class. Outputs, all rewritten on every run (same input, same output):

    OUT/grades.csv                 one row per student: points per test cell, total, maximum
    OUT/reports/<student>.txt      why each point was lost
    OUT/feedback/<student>/<nb>.html  the executed notebook with verdicts, no hidden tests
    OUT/results.json               everything above, machine-readable
"""
from __future__ import annotations

import csv
import json
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from graders.course.notebooks import notebook_names


# --- Finding the submissions -----------------------------------------------------------------

def discover(submissions: Path, names: list[str]) -> dict[str, dict[str, tuple[Path | None, list[str]]]]:
    """{student: {notebook: (path or None, flags)}} for every student found under `submissions`."""
    root = submissions / "submitted" if (submissions / "submitted").is_dir() else submissions
    students: dict[str, list[Path]] = {}
    unpacked = Path(tempfile.mkdtemp(prefix="gpt2-submissions-"))
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            students[entry.name] = sorted(entry.rglob("*.ipynb"))
        elif entry.suffix == ".zip":
            target = unpacked / entry.stem
            with zipfile.ZipFile(entry) as archive:
                for member in archive.namelist():
                    if member.endswith(".ipynb") and ".." not in Path(member).parts and not member.startswith("/"):
                        destination = target / Path(member).name
                        destination.parent.mkdir(parents=True, exist_ok=True)
                        destination.write_bytes(archive.read(member))
            students[entry.stem] = sorted(target.glob("*.ipynb"))
    found = {}
    for student, files in students.items():
        files = [f for f in files if ".ipynb_checkpoints" not in f.parts]
        by_name = {f.stem: f for f in files}
        found[student] = {}
        for name in names:
            if name in by_name:
                found[student][name] = (by_name[name], [])
                continue
            renamed = _renamed(name, [f for f in files if f.stem not in names])
            if renamed:
                found[student][name] = (renamed, [f"submitted as {renamed.name} (renamed): graded as {name}.ipynb"])
            else:
                found[student][name] = (None, [f"{name}.ipynb is missing from the submission"])
    return found


def _renamed(name: str, candidates: list[Path]) -> Path | None:
    """A notebook under another file name whose nbgrader cell ids are this notebook's."""
    from graders.harness.cells import nbgrader_meta, source_notebook

    wanted = {nbgrader_meta(c).get("grade_id") for c in source_notebook(name).cells} - {None}
    for path in candidates:
        try:
            cells = json.loads(path.read_text()).get("cells", [])
        except (OSError, ValueError):
            continue
        ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in cells} - {None}
        if ids and len(ids & wanted) >= max(1, len(wanted) // 2):
            return path
    return None


# --- One task: runs on a Dask worker --------------------------------------------------------

def grade_task(student: str, name: str, path: str | None, flags: list[str], limits) -> dict:
    """Grade one notebook of one student; never raises (a grader crash is reported as such)."""
    from graders.harness import grading
    from graders.harness.cells import nbgrader_meta, source_notebook, test_cells
    from graders.harness.execute import scratch_dir

    try:
        with scratch_dir() as workdir:
            result, executed = grading.grade_notebook(
                student, name, Path(path) if path else None, workdir, limits, flags)
        return {"result": result.to_json(), "feedback": _feedback_html(result, executed)}
    except Exception as err:  # the grader's own failure: reported, never silently zero
        source = source_notebook(name)
        cells = [{"grade_id": nbgrader_meta(c)["grade_id"], "points": 0.0,
                  "max_points": float(nbgrader_meta(c).get("points", 0)), "status": "error",
                  "message": f"the grader failed on this notebook: {type(err).__name__}: {err}"}
                 for c in test_cells(source)]
        return {"result": {"student": student, "notebook": name, "flags": flags, "cells": cells},
                "feedback": None}


def _feedback_html(result, executed) -> str | None:
    """The executed notebook for the student: verdicts under each test, hidden tests removed."""
    if executed is None:
        return None
    import nbformat
    from nbconvert import HTMLExporter

    from graders.harness.cells import is_test_cell, nbgrader_meta, released_source

    verdicts = {c.grade_id: c for c in result.cells}
    for cell in executed.cells:
        if is_test_cell(cell):
            verdict = verdicts.get(nbgrader_meta(cell)["grade_id"])
            cell["source"] = released_source(cell)
            text = (f"{verdict.status.upper()}: {verdict.points:g} / {verdict.max_points:g} points\n"
                    + (verdict.message + "\n" if verdict.message else "")) if verdict else ""
            cell["outputs"] = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    header = nbformat.v4.new_markdown_cell(
        f"# Feedback: {result.notebook} — {result.student}\n\n"
        f"**Score: {result.score:g} / {sum(c.max_points for c in result.cells):g}**\n\n"
        + "".join(f"- {flag}\n" for flag in result.flags))
    executed.cells.insert(0, header)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(executed)
    return body


# --- The class ---------------------------------------------------------------------------

def grade_class(submissions: Path, out: Path, names: list[str], workers: int,
                scheduler: str | None, limits) -> list[dict]:
    """Grade every submission found in `submissions` on the worker pool; write the outputs.

    `limits` is a graders.harness.execute.TimeLimits (seconds per ordinary and per training cell)."""
    from distributed import Client, LocalCluster, as_completed
    from tqdm import tqdm

    found = discover(submissions, names)
    tasks = [(student, name, str(path) if path else None, flags)
             for student, notebooks in sorted(found.items())
             for name, (path, flags) in notebooks.items()]
    if scheduler:
        client = Client(scheduler)
    else:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               memory_limit=0, dashboard_address=":0")
        client = Client(cluster)
    results = []
    try:
        futures = [client.submit(grade_task, s, n, p, f, limits, pure=False, key=f"grade-{s}-{n}")
                   for s, n, p, f in tasks]
        for future in tqdm(as_completed(futures), total=len(futures), desc="grading", unit="notebook",
                           file=sys.stdout):
            results.append(future.result())
    finally:
        client.close()
        if not scheduler:
            cluster.close()
    write_outputs(out, results, names)
    return results


def write_outputs(out: Path, results: list[dict], names: list[str]) -> None:
    from graders.harness.cells import nbgrader_meta, source_notebook, test_cells

    columns = [(name, nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points", 0)))
               for name in names for c in test_cells(source_notebook(name))]
    by_student: dict[str, dict[str, dict]] = {}
    for item in results:
        by_student.setdefault(item["result"]["student"], {})[item["result"]["notebook"]] = item
    for folder in ("reports", "feedback"):
        shutil.rmtree(out / folder, ignore_errors=True)
    (out / "reports").mkdir(parents=True, exist_ok=True)
    maximum = sum(points for _, _, points in columns)
    with open(out / "grades.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student"] + [f"{n}/{g}" for n, g, _ in columns] + ["total", "max"])
        for student in sorted(by_student):
            cells = {(item["result"]["notebook"], c["grade_id"]): c
                     for item in by_student[student].values() for c in item["result"]["cells"]}
            row = [cells.get((n, g), {"points": 0.0})["points"] for n, g, _ in columns]
            writer.writerow([student] + [f"{p:g}" for p in row] + [f"{sum(row):g}", f"{maximum:g}"])
            _write_report(out / "reports" / f"{_safe(student)}.txt", student, by_student[student], names)
            for name, item in by_student[student].items():
                if item["feedback"]:
                    target = out / "feedback" / _safe(student) / f"{name}.html"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(item["feedback"])
    ordered = sorted((item["result"] for item in results), key=lambda r: (r["student"], r["notebook"]))
    (out / "results.json").write_text(json.dumps(ordered, indent=1, sort_keys=True))


def _write_report(path: Path, student: str, notebooks: dict, names: list[str]) -> None:
    lines = [f"Grading report for {student}", ""]
    for name in names:
        if name not in notebooks:
            continue
        result = notebooks[name]["result"]
        got = sum(c["points"] for c in result["cells"])
        total = sum(c["max_points"] for c in result["cells"])
        lines.append(f"{name}: {got:g} / {total:g}")
        lines += [f"  note: {flag}" for flag in result["flags"]]
        for cell in result["cells"]:
            if cell["points"] < cell["max_points"]:
                message = cell["message"].replace("\n", "\n      ")
                lines.append(f"  - {cell['grade_id']}: lost {cell['max_points'] - cell['points']:g} "
                             f"({cell['status']}): {message}")
        lines.append("")
    path.write_text("\n".join(lines))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def main(argv=None) -> int:
    import argparse
    import os

    from graders.harness.execute import TimeLimits

    parser = argparse.ArgumentParser(prog="python -m graders.harness.classroom", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=Path, required=True, help="folder of submissions")
    parser.add_argument("--out", type=Path, default=Path("grading"), help="output folder (default: grading/)")
    parser.add_argument("--notebooks", nargs="*", default=None,
                        help="notebook names to grade (default: every graded notebook of the course)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="local worker processes (default: number of CPU cores)")
    parser.add_argument("--scheduler", default=None,
                        help="address of a Dask scheduler (tcp://host:8786) to grade on a cluster")
    parser.add_argument("--cell-timeout", type=int, default=TimeLimits.ordinary,
                        help=f"seconds an ordinary cell may run (default {TimeLimits.ordinary})")
    parser.add_argument("--training-cell-timeout", type=int, default=TimeLimits.training,
                        help="seconds a cell tagged `training` may run (notebook 07's budgeted "
                             f"training runs; default {TimeLimits.training})")
    args = parser.parse_args(argv)
    names = args.notebooks or graded_notebooks()
    limits = TimeLimits(args.cell_timeout, args.training_cell_timeout)
    results = grade_class(args.submissions, args.out, names, args.workers, args.scheduler, limits)
    print(f"graded {len({r['result']['student'] for r in results})} students; "
          f"grades in {args.out / 'grades.csv'}, reports in {args.out / 'reports'}")
    return 0


def graded_notebooks() -> list[str]:
    from graders.harness.cells import source_notebook, test_cells

    return [name for name in notebook_names() if test_cells(source_notebook(name))]


if __name__ == "__main__":
    raise SystemExit(main())
