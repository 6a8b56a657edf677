"""Benchmark of notebook 10's training demonstration (the cell that trains a GPT-2-style model and
a modern decoder with the same recipe), run as the notebook runs it: the solution's setup cell,
its answer cells (the solution's own modules), then the demonstration cell, on one thread. Prints
what the cell prints, each line with the seconds since the cell started, then one line

    10's demonstration: T s (first line after F s) on 1 thread; <processor>, <n> cores, load average L

whose T is the time the notebook states, with these conditions. Timings depend on the machine
and its load (the load average is read before the run); the losses do not.

    python benchmarks/bench_demo_10.py
"""
import argparse
import io
import json
import os
import platform
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
NOTEBOOK = ROOT / "solutions" / "10_modern_decoder.ipynb"


class Stamped(io.TextIOBase):
    """stdout with each line prefixed by the seconds since `start`; remembers the first line's."""

    def __init__(self, out, start: float):
        self.out, self.start, self.first, self.pending = out, start, None, ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            elapsed = time.time() - self.start
            self.first = elapsed if self.first is None else self.first
            self.out.write(f"[{elapsed:6.1f} s] {line}\n")
            self.out.flush()
        return len(text)


def processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    source = ["".join(c["source"]) for c in cells]
    demo = next(i for i, s in enumerate(source) if "def train_and_validate" in s)
    answers = source[:1] + [s for c, s in zip(cells[1:], source[1:])
                            if c["metadata"].get("nbgrader", {}).get("solution")]
    namespace: dict = {"__name__": "__main__"}
    for cell in answers:                          # the setup cell and the solution's answers
        exec(compile(cell, str(NOTEBOOK), "exec"), namespace)
    namespace["ready"] = lambda *answers: True    # the checks of these answers pass (make solutions)
    load = os.getloadavg()[0]
    start = time.time()
    stamped = Stamped(sys.stdout, start)
    with redirect_stdout(stamped):
        exec(compile(source[demo], str(NOTEBOOK), "exec"), namespace)
    total = time.time() - start
    print(f"10's demonstration: {total:.0f} s (first line after {stamped.first or total:.1f} s) on 1 thread; "
          f"{processor()}, {os.cpu_count()} cores, load average {load:.1f}")


if __name__ == "__main__":
    main()
