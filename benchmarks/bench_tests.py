"""How long the two tiers of the test suite take, printed (not a test): `python benchmarks/bench_tests.py`.

Runs `make lint`, then each tier's pytest run exactly as make runs it, one after the other
(`make -o lint test-fast`, `make -o lint test`: `-o lint` skips the lint already timed), and
prints each wall time against its budget on 2 cores (lint + test-fast <= 3 min; lint + test
<= 19 min, what it took before notebooks 11 and 12), the summary line pytest ended with, the
tests that failed, and the 10 slowest test phases of the tier, read from pytest's --durations
lines. Timings depend on the machine and its load: the load average is printed before and
after each run. Uses the course cache as it is (weights, activations).

    python benchmarks/bench_tests.py [--tiers fast full]
"""
import argparse
import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = {"fast": ("test-fast", 3 * 60), "full": ("test", 19 * 60)}
DURATION = re.compile(r"^\s*(\d+\.\d+)s (setup|call|teardown)\s+(\S.*)$")
SUMMARY = re.compile(r"^=*\s*\d+ (passed|failed).* in [\d.]+s")


def load() -> str:
    return " ".join(f"{figure:.2f}" for figure in os.getloadavg())


def run(target: list[str]) -> tuple[float, int, str]:
    """Wall seconds, exit code and output of `make <target>` in the repository."""
    start = time.perf_counter()
    done = subprocess.run(["make", "--no-print-directory", *target], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return time.perf_counter() - start, done.returncode, done.stdout


def slowest(output: str, count: int = 10) -> list[str]:
    """The first `count` --durations lines: pytest lists them slowest first."""
    return [line.strip() for line in output.splitlines() if DURATION.match(line)][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiers", nargs="+", choices=sorted(TIERS), default=["fast", "full"])
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average (1, 5, 15 min) before: {load()}", flush=True)
    lint_seconds, code, output = run(["lint"])
    print(f"{'make lint':28} {lint_seconds:7.1f} s   {'clean' if code == 0 else 'FINDINGS'}", flush=True)
    if code:
        print("\n".join(line for line in output.splitlines() if re.match(r"^Found \d+ error", line)))
    for tier in args.tiers:
        target, budget = TIERS[tier]
        seconds, code, output = run(["-o", "lint", target])
        total = lint_seconds + seconds
        summary = next((line.strip("= ") for line in reversed(output.splitlines()) if SUMMARY.match(line)),
                       f"no pytest summary (make exited with {code})")
        status = "PASS" if total <= budget and code == 0 else "over" if code == 0 else "FAILED"
        print(f"\n{'make ' + target:28} {seconds:7.1f} s   with the lint {total:7.1f} s   "
              f"target <= {budget / 60:.0f} min   {status}\n  {summary}\n  load average after: {load()}")
        for line in output.splitlines():
            if line.startswith(("FAILED", "ERROR")):
                print(f"  {line}")
        print("  slowest:")
        for line in slowest(output):
            print(f"    {line}")


if __name__ == "__main__":
    main()
