"""Grading speed and memory, printed (not a test): `python benchmarks/bench_grading.py`.

1. One perfect submission, notebook by notebook (each in a fresh process), with a warm
   activation cache: wall time, peak memory of the learner's kernel and of the judging
   process. Targets: notebooks 01-06 together <= 45 s; 00-06 and 08 <= 90 s; 07 <= 3 min;
   09 <= 30 s; 10 <= 30 s; 11 <= 20 s; 12 <= 20 s; 13 <= 30 s (its two training runs included);
   14 <= 45 s (its RL runs included).
   Then the same submissions through the class pipeline, which grades their notebooks in
   parallel on the default worker pool: what an instructor waits for one submission.
2. A class of N perfect submissions of 01-06 graded with 1 worker and with 2 workers, in one
   run (target speed-up >= 1.6x with 30 submissions: --class-size 30).
3. What writing nbgrader's gradebook adds per graded notebook (scores, comments, late penalty,
   the autograded notebook and the feedback page in the course folder): target <= 0.2 s.
   `--gradebook-only` measures this alone, `--class-only` the speed-up alone.
4. `--against REV [--notebooks ...]`: what this tree's grading costs against another revision's
   (the design before a change): each notebook's perfect submission graded in both trees in
   turn, `--rounds` times after one warming run each, every run in a fresh process; the ratio of
   the medians. Target <= 1.15 (sealing the answer may cost at most 15% per notebook).

Every pipeline run writes into a freshly released nbgrader course, as `make grade` does.
"""
import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _grade_one(name: str, queue) -> None:
    import nbformat

    from graders.course import example_class
    from graders.harness import grading

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, f"{name}.ipynb")
        nbformat.write(example_class.submission(name, True), path)
        start = time.perf_counter()
        result, _ = grading.grade_notebook("bench", name, path, Path(folder, "work"))
        elapsed = time.perf_counter() - start
    kernel_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    judge_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put((elapsed, kernel_peak, judge_peak, result.score, sum(c.max_points for c in result.cells)))


def per_notebook(names: list[str]) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    times = {}
    print(f"{'notebook':24} {'wall s':>8} {'kernel MB':>10} {'judge MB':>9} {'points':>8}")
    for name in names:
        queue = context.Queue()
        process = context.Process(target=_grade_one, args=(name, queue))
        process.start()
        process.join()
        if queue.empty():  # it died (e.g. killed for memory): say so rather than wait forever
            print(f"{name:24} grading process died with exit code {process.exitcode}", flush=True)
            continue
        elapsed, kernel_mb, judge_mb, score, maximum = queue.get()
        times[name] = elapsed
        print(f"{name:24} {elapsed:8.1f} {kernel_mb:10.0f} {judge_mb:9.0f} {score:>4g}/{maximum:<3g}", flush=True)
    return times


def verdict(label: str, seconds: float, target: float) -> None:
    status = "PASS" if seconds <= target else "over"
    print(f"{label:45} {seconds:7.1f} s   target <= {target:5.0f} s   {status}")


def _perfect_class(folder: str, size: int, names: list[str]) -> Path:
    import nbformat

    from graders.course import example_class

    submissions = Path(folder, "class")
    for n in range(size):
        for name in names:
            target = submissions / f"student{n:03d}" / f"{name}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(example_class.submission(name, True), target)
    return submissions


def _graded_class_wall(submissions: Path, out: Path, names: list[str], workers: int, course: Path) -> float:
    from graders.harness import classroom, grading

    start = time.perf_counter()
    classroom.grade_class(submissions, out, names, workers, None, grading.TimeLimits(), course)
    return time.perf_counter() - start


def _released_course(folder: str, names: list[str]) -> Path:
    from graders.course.notebooks import release

    release(Path(folder, "course"), names)
    return Path(folder, "course")


def one_submission(names: list[str]) -> float:
    """What an instructor waits for one submission: `make grade`'s pipeline, default workers."""
    with tempfile.TemporaryDirectory() as folder:
        course = _released_course(folder, names)
        wall = _graded_class_wall(_perfect_class(folder, 1, names), Path(folder, "out"), names,
                                  multiprocessing.cpu_count(), course)
    print(f"one submission of {len(names)} notebooks through the grading pipeline "
          f"({multiprocessing.cpu_count()} workers, cluster start included): {wall:.1f} s")
    return wall


def class_speedup(size: int, names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        submissions = _perfect_class(folder, size, names)
        walls = {workers: _graded_class_wall(submissions, Path(folder, f"out{workers}"), names, workers,
                                             _released_course(f"{folder}/{workers}", names))
                 for workers in (1, 2)}
    print(f"class of {size} x {len(names)} notebooks: 1 worker {walls[1]:.0f} s, 2 workers "
          f"{walls[2]:.0f} s, speed-up {walls[1] / walls[2]:.2f}x (target >= 1.6x)")


def gradebook_overhead(names: list[str], students: int = 10) -> float:
    """Seconds per notebook that recording a graded notebook in nbgrader's course takes: each of
    `names` graded once (a perfect submission), then recorded for `students` students."""
    import hashlib

    import nbformat

    from graders.course import example_class
    from graders.harness import classroom, grading
    from graders.harness.gradebook import CourseGradebook
    from graders.harness.intake import Submission

    with tempfile.TemporaryDirectory() as folder:
        course, graded = _released_course(folder, names), {}
        for name in names:
            path = Path(folder, f"{name}.ipynb")
            nbformat.write(example_class.submission(name, True), path)
            submission = Submission("bench", name, path, path.name,
                                    sha256=hashlib.sha256(path.read_bytes()).hexdigest())
            graded[name] = (submission, classroom.grade_task(submission, grading.TimeLimits()))
        gradebook = CourseGradebook(course, names)
        start = time.perf_counter()
        for number in range(students):
            for name, (submission, done) in graded.items():
                submission.student = f"student{number:03d}"
                gradebook.record(submission, done["entry"]["cells"], done["notebook"], done["feedback"])
        seconds = (time.perf_counter() - start) / (students * len(names))
        gradebook.close()
    status = "PASS" if seconds <= 0.2 else "over"
    print(f"{'writing the nbgrader gradebook, per notebook':45} {seconds:7.3f} s   target <= 0.2 s   "
          f"{status} ({students} students x {len(names)} notebooks)")
    return seconds


GRADE_ONE = """
import sys, tempfile, time
from pathlib import Path
import nbformat
from graders.course import example_class
from graders.harness import grading
name = sys.argv[1]
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder, name + ".ipynb")
    nbformat.write(example_class.submission(name, True), path)
    start = time.perf_counter()
    result, _ = grading.grade_notebook("bench", name, path, Path(folder, "work"))
    print(time.perf_counter() - start, result.score, sum(c.max_points for c in result.cells))
"""


def _graded_in(tree: Path, name: str) -> float:
    """Seconds to grade `name`'s perfect submission with the graders of `tree`, in a fresh process."""
    import os
    import subprocess

    from graders.reference.data import SHAKESPEARE_ENV, tinyshakespeare_path

    env = {**os.environ, "PYTHONPATH": str(tree), SHAKESPEARE_ENV: str(tinyshakespeare_path(download=False))}
    done = subprocess.run([sys.executable, "-c", GRADE_ONE, name], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"grading {name} in {tree} failed:\n{done.stderr[-2000:]}")
    seconds, score, maximum = done.stdout.split()[-3:]
    if float(score) != float(maximum):
        raise SystemExit(f"{name} in {tree}: a perfect submission scored {score}/{maximum}")
    return float(seconds)


def paired_cost(names: list[str], against: str, rounds: int) -> None:
    import statistics
    import subprocess

    with tempfile.TemporaryDirectory() as folder:
        other = Path(folder, "other")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other), against], check=True,
                       capture_output=True)
        try:
            print(f"grading cost against {against} ({rounds} paired rounds after a warming run; medians)")
            print(f"{'notebook':24} {against[:10]:>10} {'this tree':>10} {'ratio':>7}")
            for name in names:
                if not (other / "solutions" / f"{name}.ipynb").is_file():
                    print(f"{name:24} not in {against}")
                    continue
                times = {other: [], ROOT: []}
                for tree in times:
                    _graded_in(tree, name)
                for _ in range(rounds):
                    for tree in times:
                        times[tree].append(_graded_in(tree, name))
                before, now = (statistics.median(times[t]) for t in (other, ROOT))
                status = "PASS" if now <= 1.15 * before else "over"
                print(f"{name:24} {before:10.1f} {now:10.1f} {now / before:6.2f}x  target <= 1.15x  {status}",
                      flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], capture_output=True)


def main() -> None:
    from graders.course.notebooks import notebook_names
    from graders.harness.classroom import graded_notebooks

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--class-size", type=int, default=4)
    parser.add_argument("--skip-class", action="store_true")
    parser.add_argument("--gradebook-only", action="store_true",
                        help="only measure what writing nbgrader's gradebook adds per notebook")
    parser.add_argument("--class-only", action="store_true",
                        help="only measure the class's speed-up from 1 to 2 workers")
    parser.add_argument("--against", metavar="REV", help="the revision to measure this grading cost against")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per notebook with --against")
    parser.add_argument("--notebooks", nargs="+", help="with --against: only these notebooks")
    args = parser.parse_args()
    names = graded_notebooks()
    if args.against:
        paired_cost(args.notebooks or names, args.against, args.rounds)
        return
    core = [n for n in names if n[:2] <= "06"]
    if args.gradebook_only:
        gradebook_overhead(core)
        return
    if args.class_only:
        class_speedup(args.class_size, core)
        return
    ungraded = sorted(set(notebook_names()) - set(names))
    print(f"{multiprocessing.cpu_count()} CPUs; warm caches; each notebook graded in a fresh process; "
          f"not graded (no test cells, nothing to time): {', '.join(ungraded) or 'none'}")
    per_notebook(names[:1])  # warms every cache (reference weights snapshot, activations)
    times = per_notebook(names)
    without_training = [n for n in names if n[:2] not in ("07", "09", "10", "11", "12", "13", "14")]
    verdict("notebooks 01-06, one after another", sum(times.get(n, float("nan")) for n in core), 45)
    verdict("notebooks 01-06, one submission as `make grade` runs it", one_submission(core), 45)
    verdict("notebooks 00-06 and 08, one after another",
            sum(times.get(n, float("nan")) for n in without_training), 90)
    verdict("notebooks 00-06 and 08, one submission as `make grade` runs it",
            one_submission(without_training), 90)
    if "07_training" in times:
        verdict("notebook 07", times["07_training"], 180)
    if "09_transformer_family" in times:
        verdict("notebook 09", times["09_transformer_family"], 30)
    if "10_modern_decoder" in times:
        verdict("notebook 10", times["10_modern_decoder"], 30)
    if "11_tokenizer" in times:
        verdict("notebook 11", times["11_tokenizer"], 20)
    if "12_training_step" in times:
        verdict("notebook 12", times["12_training_step"], 20)
    if "13_post_training" in times:     # its two training runs (finetuning, a preference run) included
        verdict("notebook 13", times["13_post_training"], 30)
    if "14_rl_verifiable_rewards" in times:   # its RL runs (the check's two, the demonstrations') included
        verdict("notebook 14", times["14_rl_verifiable_rewards"], 45)
    gradebook_overhead(core)
    if not args.skip_class:
        class_speedup(args.class_size, core)


if __name__ == "__main__":
    main()
