"""Where `make check` spends its time, on a warm course cache: a breakdown.

Runs graders.harness.check on a notebook (default: a solved 01) in this process, with the
kernel's start, its client's readiness and each cell timed from here, then times the imports
a kernel makes (its interpreter start, ipykernel, torch, the notebook's setup cell) in
fresh interpreters. Not a test; figures vary with the machine's load, which it prints.
`python benchmarks/profile_check.py [NOTEBOOK.ipynb]`
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
marks: list[tuple[str, float]] = []


def mark(what: str) -> None:
    marks.append((what, time.perf_counter()))


def instrument() -> None:
    from nbclient import NotebookClient

    for name in ("async_start_new_kernel", "async_start_new_kernel_client", "_async_cleanup_kernel"):
        original = getattr(NotebookClient, name)

        def timed(self, *args, _original=original, _name=name, **kwargs):
            async def go():
                mark(f"{_name} begins")
                result = await _original(self, *args, **kwargs)
                mark(f"{_name} ends")
                return result
            return go()
        setattr(NotebookClient, name, timed)
    original_cell = NotebookClient.async_execute_cell

    async def cell(self, cell, index, **kwargs):
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")[:50]
        mark(f"cell {index} begins ({first})")
        result = await original_cell(self, cell, index, **kwargs)
        mark(f"cell {index} ends")
        return result
    NotebookClient.async_execute_cell = cell


def fresh(code: str, env: dict | None = None) -> float:
    """Seconds a fresh interpreter takes to run `code` (its own start included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path, nargs="?", metavar="NOTEBOOK.ipynb",
                        help="the notebook to check (default: a solved 01)")
    args = parser.parse_args()
    from graders.harness import check  # first: it spares nbformat's slow import
    mark("parent: graders.harness.check imported (nbformat with it)")
    import nbformat
    instrument()
    mark("parent: nbclient imported")
    with tempfile.TemporaryDirectory(prefix="profile-check-") as folder:
        if args.notebook:
            path = args.notebook
        else:
            from graders.course.example_class import submission
            path = Path(folder) / "01_layernorm.ipynb"
            nbformat.write(submission("01_layernorm", solved=True), path)
        mark("parent: notebook ready")
        check.check(path)
    mark("parent: check returned")
    print(f"\nload average {os.getloadavg()}; times from this process's first line "
          f"(interpreter start before it not counted)")
    previous = START
    for what, at in marks:
        print(f"  {at - START:6.2f} s  (+{at - previous:5.2f})  {what}")
        previous = at
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(OMP_NUM_THREADS="1")
    print("\nfresh interpreters, seconds each (median of 3):")
    for what, code in [
        ("python -c pass", "pass"),
        ("import graders.harness.check", "import graders.harness.check"),
        ("import ipykernel.kernelapp", "import ipykernel.kernelapp"),
        ("import torch", "import torch"),
        ("the setup cell of 01's imports",
         "import torch; from jaxtyping import Float; from graders.reference.config import Config;"
         "from graders.exercises import nb01; from graders.judging.progress import progress"),
    ]:
        times = sorted(fresh(code, env) for _ in range(3))
        print(f"  {times[1]:6.2f} s  {what}")


if __name__ == "__main__":
    main()
