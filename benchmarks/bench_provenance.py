"""What the integrity checks of a grading kernel cost, printed (not a test):
`python benchmarks/bench_provenance.py [--base REV] [--runs N] [NOTEBOOK ...]`.

Grades one perfect submission of each notebook (as bench_grading.py does: a fresh process, the
class pipeline's grade_notebook, confined when run as root) with this checkout and with the
checkout at REV (default: the commit before the provenance check and the kernel view),
alternately, N times each, and prints each one's median wall time and the ratio of the pairs'
medians (the machine's drift cancels in the pairing). Target: no notebook more than 10% slower.
"""
import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "afabe8a"   # main before the provenance watch and the kernel views (graders.integrity)
GRADE_ONE = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import nbformat
from graders.course import example_class
from graders.harness import grading
assert grading.__file__.startswith(sys.argv[1]), grading.__file__
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder, sys.argv[2] + ".ipynb")
    nbformat.write(example_class.submission(sys.argv[2], True), path)
    result, _ = grading.grade_notebook("bench", sys.argv[2], path, Path(folder, "work"))
    print(result.score, sum(c.max_points for c in result.cells))
"""


def grade(checkout: Path, notebook: str, env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", GRADE_ONE, str(checkout), notebook],
                          capture_output=True, text=True, check=True, env=env)
    return time.perf_counter() - start, done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", default=["01_layernorm", "06_gpt2", "07_training", "10_modern_decoder"])
    parser.add_argument("--base", default=BEFORE)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from graders.reference import data

    env = dict(os.environ)   # the other checkout has no ../shared beside it: name the file for both
    with contextlib.suppress(data.DataFileError):
        env.setdefault(data.SHAKESPEARE_ENV, str(data.tinyshakespeare_path(download=False)))
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
                       check=True, capture_output=True)
        try:
            print(f"{'notebook':22} {'this checkout':>14} {'at ' + args.base:>14} {'ratio':>7}  scores")
            for notebook in args.notebooks:
                times: dict[str, list[float]] = {"now": [], "base": []}
                scores = {}
                for _ in range(args.runs):
                    for name, checkout in (("now", ROOT), ("base", base)):
                        seconds, scores[name] = grade(checkout, notebook, env)
                        times[name].append(seconds)
                now, before = statistics.median(times["now"]), statistics.median(times["base"])
                print(f"{notebook:22} {now:13.1f}s {before:13.1f}s {now / before:7.3f}  "
                      f"{scores['now']} / {scores['base']}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)


if __name__ == "__main__":
    main()
