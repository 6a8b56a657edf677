"""BPE training speed, printed (not a test): `python benchmarks/bench_tokenizer.py`.

The course's trainer (graders.exercises.nb11.reference: counts updated only where a merge
changes them, a heap for the most frequent pair) on the whole of tiny Shakespeare, and on the
speed check's training (notebook 11: 500 merges of the first 200,000 characters): its time, with
and without the profiler a check runs the learner's code under, and the time of the trainer a
learner writes first (naive.py: every merge recounts every pair), with their ratio. The check
allows CEILING_FACTOR times the course trainer's profiled time: the ratio says how far past that
the naive trainer is.
"""
import argparse
import cProfile
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(train, text: str, n_merges: int, profiled: bool = False) -> float:
    profiler = cProfile.Profile(builtins=False)
    start = time.perf_counter()
    if profiled:
        profiler.enable()
    train(text, n_merges)
    if profiled:
        profiler.disable()
    return time.perf_counter() - start


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from graders.exercises.nb11 import reference, training
    from graders.exercises.nb11.naive import naive_train
    from graders.reference.data import load_tinyshakespeare

    shakespeare = load_tinyshakespeare()
    print(f"course trainer, all of tiny Shakespeare ({len(shakespeare):,} characters), 1,000 merges: "
          f"{timed(reference.train_bpe, shakespeare, 1_000):.2f} s")
    text, n = training.speed_corpus(), training.SPEED_MERGES
    course, profiled = timed(reference.train_bpe, text, n), timed(reference.train_bpe, text, n, profiled=True)
    naive = timed(naive_train, text, n)
    ceiling = max(training.CEILING_FACTOR * profiled, training.CEILING_FLOOR)
    print(f"the speed check's training ({len(text):,} characters, {n} merges): course trainer {course:.2f} s "
          f"({profiled:.2f} s profiled, ceiling {ceiling:.1f} s); "
          f"naive trainer {naive:.2f} s: {naive / course:.0f}x the course trainer")


if __name__ == "__main__":
    main()
