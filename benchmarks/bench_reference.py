"""How long the reference takes: generation, loading, activations (computed and cached).

Prints figures against their targets; not a test (it always exits 0). Works in temporary cache
folders, so it measures a first run on a fresh machine and leaves the course cache alone.
"""
import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TEXT = ("I am an amazing autoregressive, decoder-only, GPT-2 style transformer. "
        "One day I will exceed human level intelligence and take over the world!")
rows = []


@contextmanager
def timed(what: str, target: float):
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    rows.append((what, seconds, target))
    print(f"{what:<58} {seconds:8.2f} s   target <= {target:>4} s   "
          f"{'PASS' if seconds <= target else 'over'}", flush=True)


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    import torch

    from graders.reference import model as reference
    from graders.reference import synthetic
    from graders.reference.activations import reference_activations
    from graders.reference.paths import CACHE_ENV
    from graders.reference.tokenizer import to_tokens

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as cache:
        os.environ[CACHE_ENV] = cache
        folder = Path(cache) / f"synthetic-gpt2-v{synthetic.VERSION}"
        with timed("synthetic weights: synthetic_state_dict + write", 30):
            synthetic.write_synthetic(folder)
        with timed("reference load (load_reference, weights already cached)", 10):
            ref = reference.load_reference.__wrapped__("synthetic", quiet=True)
        tokens = to_tokens(TEXT)
        with timed(f"activations, {tokens.shape[1]} tokens, computed (empty cache)", 5):
            computed = reference_activations(ref, tokens)
        with timed(f"activations, {tokens.shape[1]} tokens, read back from cache", 0.5):
            cached = reference_activations(ref, tokens)
        assert all(torch.equal(cached[k], computed[k]) for k in computed)
    over = [what for what, seconds, target in rows if seconds > target]
    print("all within target" if not over else f"over target: {', '.join(over)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
