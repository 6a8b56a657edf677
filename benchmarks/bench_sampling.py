"""Generation speed: the solution's KV cache vs no cache, and vs transformers' generate.

The solution's functions are taken from the answer cells of solutions/08_sampling.ipynb. All
three run greedy decoding of 200 new tokens after the 35-token reference text, on the
GPT-2-small-shaped reference weights, in one process (so the ratios share the machine's state).
Targets: the KV cache >= 5x faster than no cache; the solution's uncached generation within 2x
of GPT2LMHeadModel.generate(use_cache=False).

With --demo, it runs instead 08's timing cell ("How much does the cache save?") as the notebook
runs it: the setup cell (its model: 07's if saved, else the reference GPT-2), the solution's
answer cells, then the cell, which times both on one thread. It prints what the cell prints, then
one line with the conditions of the figures the notebook states:

    08's cache timing: <model>; <processor>, <n> cores, load average L
"""
import argparse
import io
import math
import os
import time
from contextlib import redirect_stdout

import nbformat
import torch
from jaxtyping import Float, Int
from torch import Tensor

from graders.course.notebooks import SOLUTIONS
from graders.judging.cases import Case
from graders.reference import components, store
from graders.reference import model as reference
from graders.reference.config import Config
from graders.reference.weights import load_strict

N_NEW = 200
CACHE_TARGET = 5.0
HF_TARGET = 2.0


def solution_functions() -> dict:
    """The answer cells of the sampling notebook, executed: the solution's own functions."""
    namespace = {"torch": torch, "math": math, "Tensor": Tensor, "Float": Float, "Int": Int}
    notebook = nbformat.read(SOLUTIONS / "08_sampling.ipynb", as_version=4)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            exec(compile(cell.source, cell.metadata["nbgrader"]["grade_id"], "exec"), namespace)
    return namespace


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def notebook_demo() -> None:
    """08's timing cell, after its setup cell and the solution's answers, as the notebook runs it."""
    os.environ.setdefault("MPLBACKEND", "Agg")           # the setup cell draws a chart
    from bench_demo_10 import processor

    cells = [c for c in nbformat.read(SOLUTIONS / "08_sampling.ipynb", as_version=4).cells if c.cell_type == "code"]
    demo = next(c.source for c in cells if "generate_with_cache(model, ids, 2)" in c.source)
    namespace: dict = {"__name__": "__main__"}
    setup = io.StringIO()
    with redirect_stdout(setup):
        for cell in cells[:1] + [c for c in cells if c.metadata.get("nbgrader", {}).get("solution")]:
            exec(compile(cell.source, "08_sampling", "exec"), namespace)
    namespace["ready"] = lambda *answers: True    # the checks of these answers pass (make solutions)
    load = os.getloadavg()[0]
    exec(compile(demo, "08_sampling", "exec"), namespace)
    print(f"08's cache timing: {namespace['model_name']}; {processor()}, {os.cpu_count()} cores, "
          f"load average {load:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", action="store_true", help="run 08's timing cell as the notebook does")
    if parser.parse_args().demo:
        notebook_demo()
        return 0
    ref = store.reference()
    print(f"Reference: {ref.label}; {torch.get_num_threads()} threads")
    model = load_strict(components.DemoTransformer(Config()), store.weights()).eval()
    hf = reference.fresh_hf_model(ref.source)
    solution = solution_functions()
    prompt = Case().tokens()
    with torch.no_grad():
        solution["generate_with_cache"](model, prompt, 2)           # warm-up
        cached, t_cached = timed(lambda: solution["generate_with_cache"](model, prompt, N_NEW))
        uncached, t_uncached = timed(lambda: solution["generate"](
            model, prompt, N_NEW, None, temperature=0.0))
        hf_out, t_hf = timed(lambda: hf.generate(
            prompt, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, use_cache=False,
            pad_token_id=50256, attention_mask=torch.ones_like(prompt)))
    rate = {name: N_NEW / t for name, t in
            (("cached", t_cached), ("uncached", t_uncached), ("hf", t_hf))}
    speedup, vs_hf = t_uncached / t_cached, t_uncached / t_hf
    print(f"{N_NEW} greedy tokens after a {prompt.shape[1]}-token prompt:")
    print(f"  solution with KV cache    {t_cached:7.1f} s  {rate['cached']:6.1f} tokens/s")
    print(f"  solution without cache    {t_uncached:7.1f} s  {rate['uncached']:6.1f} tokens/s")
    print(f"  transformers, no cache    {t_hf:7.1f} s  {rate['hf']:6.1f} tokens/s")
    print(f"  same tokens: cached vs uncached {torch.equal(cached, uncached)}, "
          f"uncached vs transformers {torch.equal(uncached, hf_out)}")
    print(f"KV-cache speed-up {speedup:.1f}x (target >= {CACHE_TARGET}x): "
          f"{'met' if speedup >= CACHE_TARGET else 'NOT met'}")
    print(f"uncached vs transformers {vs_hf:.2f}x (target <= {HF_TARGET}x): "
          f"{'met' if vs_hf <= HF_TARGET else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
