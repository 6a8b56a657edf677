"""What a learner waits for, on a warm course cache, against the course's targets.

- the reference cell of 00 (<= 3 s);
- the first check of each of 01-06, solved, in JupyterLab's kernel (<= 2 s);
- `make check` on a solved 01 (<= 6 s, and no `Kernel is running over TCP` line), and on a solved
  06, a whole notebook, against 06's first check cell (what docs/learners.md compares; no target);
- every cell of 00-06 and the graded training checks of 07 that runs longer than 3 s: how long
  the learner waits for its first sign of life (output, notice, progress bar; <= 3 s: a longer
  wait must say what it does), with its longest quiet stretch.

Prints each figure against its target; not a test (it always exits 0). Run it twice after a
change to the reference or its cache: the first run may fill the cache.
`python benchmarks/bench_learner.py [--skip-07]`
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SILENCE = 3.0            # seconds a learner may wait without a sign of life
FIRST_CHECK = 2.0
REFERENCE_CELL = 3.0
MAKE_CHECK = 6.0
OUTPUT_MESSAGES = {"stream", "display_data", "update_display_data", "execute_result", "error",
                   "clear_output", "comm_open", "comm_msg"}
rows: list[tuple[str, float, float]] = []


def report(what: str, seconds: float, target: float, note: str = "") -> None:
    rows.append((what, seconds, target))
    print(f"{what:<62} {seconds:7.2f} s   target <= {target:>3} s   "
          f"{'PASS' if seconds <= target else 'over'}{'   ' + note if note else ''}", flush=True)


def run_timed(notebook, workdir: Path, keep=lambda cell: True) -> list[dict]:
    """Execute `notebook` in the python3 kernel (the one `make lab` gives learners); for each
    code cell run: its index, duration and longest silence (seconds without output)."""
    from nbclient import NotebookClient

    timings: list[dict] = []

    class Timed(NotebookClient):
        def process_message(self, msg, cell, cell_index):
            if msg["msg_type"] in OUTPUT_MESSAGES and timings:
                now = time.perf_counter()
                timings[-1]["gaps"].append(now - timings[-1]["last"])
                timings[-1]["last"] = now
            return super().process_message(msg, cell, cell_index)

    def start(cell, cell_index):
        if cell.cell_type != "code" or not cell.source.strip():
            return
        now = time.perf_counter()
        timings.append({"index": cell_index, "start": now, "last": now, "gaps": []})

    def done(cell, cell_index, execute_reply):
        now, t = time.perf_counter(), timings[-1]
        t["seconds"] = now - t["start"]
        t["first"] = t["gaps"][0] if t["gaps"] else t["seconds"]      # first sign of life
        t["silence"] = max(t["gaps"] + [now - t["last"]])              # longest quiet stretch
        t["source"] = cell.source

    import nbformat
    from jupyter_client.manager import KernelManager

    cells = [c for c in notebook.cells if c.cell_type != "code" or keep(c)]
    batch = nbformat.v4.new_notebook(cells=cells, metadata=notebook.metadata)
    with tempfile.TemporaryDirectory(prefix="bench-kernel-") as sockets:
        manager = KernelManager(kernel_name="python3", transport="ipc", ip=f"{sockets}/kernel")
        Timed(batch, km=manager, timeout=900, allow_errors=True, on_cell_start=start,
              on_cell_executed=done, resources={"metadata": {"path": str(workdir)}}).execute()
    return [t for t in timings if "seconds" in t]


def first_line(source: str) -> str:
    return next((ln for ln in source.splitlines() if ln.strip() and not ln.startswith("#")), "")[:40]


def silences(name: str, timings: list[dict], only=lambda t: True) -> None:
    """Cells that kept the learner waiting more than SILENCE seconds before their first output
    (a notice, a progress bar, a result); the longest quiet stretch is shown alongside."""
    for t in timings:
        if only(t) and t["seconds"] > SILENCE:
            report(f"  {name} cell {t['index']}, first sign of life ({first_line(t['source'])})",
                   t["first"], SILENCE, f"cell took {t['seconds']:.1f} s, longest quiet "
                                        f"stretch {t['silence']:.1f} s")


def notebooks(skip_07: bool) -> None:
    import nbformat

    from graders.course.example_class import submission
    from graders.course.notebooks import EXERCISES
    from graders.harness.cells import is_test_cell

    with tempfile.TemporaryDirectory(prefix="bench-learner-") as folder:
        workdir = Path(folder)
        tour = nbformat.read(EXERCISES / "00_tour.ipynb", as_version=4)
        timings = run_timed(tour, workdir)
        cell = next(t for t in timings if "reference" in t["source"] and "store import" in t["source"])
        report(f"00: the reference cell (cell {cell['index']})", cell["seconds"], REFERENCE_CELL)
        silences("00", timings)
        for name in ["01_layernorm", "02_embeddings", "03_attention", "04_mlp",
                     "05_transformer_block", "06_gpt2"]:
            notebook = submission(name, solved=True)
            timings = run_timed(notebook, workdir)
            first = next(t for t in timings if is_test_cell(notebook.cells[t["index"]]))
            report(f"{name}: first check (cell {first['index']})", first["seconds"], FIRST_CHECK)
            silences(name, timings)
        if not skip_07:
            # The graded training checks; the notebook's own training demos are left out.
            notebook = submission("07_training", solved=True)
            keep = lambda c: is_test_cell(c) or "training" not in c.metadata.get("tags", [])  # noqa: E731
            timings = run_timed(notebook, workdir, keep)
            silences("07_training (graded training checks)", timings,
                     lambda t: is_test_cell(notebook.cells[t["index"]]))


def make_check() -> None:
    import nbformat

    from graders.course.example_class import submission

    with tempfile.TemporaryDirectory(prefix="bench-check-") as folder:
        path = Path(folder) / "01_layernorm.ipynb"
        nbformat.write(submission("01_layernorm", solved=True), path)
        runs = []
        for _ in range(3):  # the median of three: one run on a busy machine says little
            start = time.perf_counter()
            run = subprocess.run(["make", "--no-print-directory", "check", f"NB={path}"],
                                 cwd=ROOT, capture_output=True, text=True)
            runs.append((time.perf_counter() - start, run))
        seconds = sorted(r[0] for r in runs)[1]
        output = "".join(r.stdout + r.stderr for _, r in runs)
        tcp = "Kernel is running over TCP" in output
        report("make check on a solved 01 (median of 3)", seconds, MAKE_CHECK,
               ("exit %d" % max(r.returncode for _, r in runs))
               + ("; prints the TCP warning" if tcp else "")
               + "; load average %.1f" % os.getloadavg()[0])
        if tcp:
            rows.append(("make check prints the TCP warning", 1, 0))
        path = Path(folder) / "06_gpt2.ipynb"
        nbformat.write(submission("06_gpt2", solved=True), path)
        start = time.perf_counter()
        run = subprocess.run(["make", "--no-print-directory", "check", f"NB={path}"], cwd=ROOT,
                             capture_output=True, text=True)
        print(f"{'make check on a solved 06, the whole notebook (one run)':<62} {time.perf_counter() - start:7.2f} s"
              f"   exit {run.returncode}; load average {os.getloadavg()[0]:.1f}; against 06's first check "
              "cell above", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-07", action="store_true", help="leave out notebook 07's graded training checks")
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; warm cache assumed "
          f"(run twice after a cache change)", flush=True)
    notebooks(skip_07=args.skip_07)
    make_check()
    over = [what.strip() for what, seconds, target in rows if seconds > target]
    print("all within target" if not over else f"over target: {'; '.join(over)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
