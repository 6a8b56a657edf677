"""Benchmark of a new learner's first check: notebook 01's LayerNorm check on an empty course
cache, in a fresh python3 kernel as JupyterLab runs it (the released setup cell, the solution's
answer cell, then the test cell). On an empty cache that check generates the synthetic reference
GPT-2, loads it, runs it on the check's text and saves its weights under the course's names.
Prints what the check cell printed, then one line

    01's first check on an empty course cache: T s (setup cell S s); <processor>, <n> cores, load average L

whose T is the time docs/benchmarks.md states, with these conditions. The cache is a temporary folder
(`$GPT2_COURSE_CACHE`), so the course's own cache is left alone; the reference is the synthetic
one (`$GPT2_COURSE_WEIGHTS=synthetic`), as on a machine without the real GPT-2.

    python benchmarks/bench_first_check.py
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
NOTEBOOK = "01_layernorm"


def processor() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown processor"


def cells():
    """The released setup cell, the solution's answer, the test cell: what a learner runs first."""
    import nbformat

    from graders.course.example_class import submission

    notebook = submission(NOTEBOOK, solved=True)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    answer = next(c for c in code if c.metadata.get("nbgrader", {}).get("solution"))
    test = next(c for c in code if c.metadata.get("nbgrader", {}).get("grade"))
    notebook.cells = [code[0], answer, test]
    return nbformat.from_dict(notebook)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from nbclient import NotebookClient

    notebook = cells()
    with tempfile.TemporaryDirectory() as cache:
        os.environ.update(GPT2_COURSE_CACHE=cache, GPT2_COURSE_WEIGHTS="synthetic")
        client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT)}})
        load = os.getloadavg()[0]
        seconds = []
        with client.setup_kernel():
            for index, cell in enumerate(notebook.cells):
                start = time.time()
                client.execute_cell(cell, index)
                seconds.append(time.time() - start)
    for output in notebook.cells[-1].outputs:   # its progress line is emptied when it ends
        text = output.get("text", "").rstrip() or output.get("data", {}).get("text/plain", "")
        if text:
            print(text)
    print(f"01's first check on an empty course cache: {seconds[-1]:.0f} s (setup cell {seconds[0]:.0f} s); "
          f"{processor()}, {os.cpu_count()} cores, load average {load:.1f}")


if __name__ == "__main__":
    main()
