"""Forward time of the course's DemoTransformer vs transformers' GPT2LMHeadModel (eager), same weights.

Both run on the 35-token reference text and on a batch of 4 x 128 random tokens, in one process.
Target: the course model within 1.5x of GPT2LMHeadModel.
"""
import argparse
import time

import torch

from graders.judging.cases import Case
from graders.reference import components, store
from graders.reference import model as reference
from graders.reference.config import Config
from graders.reference.weights import load_strict

TARGET = 1.5


def best_of(fn, tokens, repeats=3):
    with torch.no_grad():
        fn(tokens)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(tokens)
            times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    torch.manual_seed(0)
    ref = store.reference()
    print(f"Reference: {ref.label}")
    ours = load_strict(components.DemoTransformer(Config()), store.weights()).eval()
    hf = reference.fresh_hf_model(ref.source)
    cases = {"reference text [1, 35]": Case().tokens(),
             "random tokens [4, 128]": torch.randint(0, Config().d_vocab, (4, 128))}
    worst = 0.0
    for name, tokens in cases.items():
        with torch.no_grad():
            same = torch.allclose(ours(tokens), hf(tokens).logits, atol=1e-3, rtol=1e-3)
        t_ours = best_of(ours, tokens)
        t_hf = best_of(lambda t: hf(t).logits, tokens)
        ratio = t_ours / t_hf
        worst = max(worst, ratio)
        print(f"{name:>24}: DemoTransformer {1000 * t_ours:8.1f} ms | GPT2LMHeadModel {1000 * t_hf:8.1f} ms "
              f"| ratio {ratio:.2f}x (target <= {TARGET}x) | same logits: {same}")
    print(f"worst ratio {worst:.2f}x: {'within' if worst <= TARGET else 'OUTSIDE'} the {TARGET}x target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
