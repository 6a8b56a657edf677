"""What every notebook's grader shares: the reference, its weights, and the grading cases."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from graders.config import Config

REFERENCE_TEXT = ("I am an amazing autoregressive, decoder-only, GPT-2 style transformer. "
                  "One day I will exceed human level intelligence and take over the world!")


@dataclass(frozen=True)
class Case:
    """The inputs of one check. Visible checks use the defaults; hidden tests vary them."""
    text: str | None = REFERENCE_TEXT   # a text, or None for random tokens from `seed`
    seed: int = 0
    batch: int = 1
    seq: int = 20                       # length of random token sequences
    block: int = 0                      # which transformer block's weights and activations

    def tokens(self) -> torch.Tensor:
        if self.text is not None:
            from graders.tokenizer import to_tokens

            return to_tokens([self.text] * self.batch)
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, Config().d_vocab, (self.batch, self.seq), generator=generator)

    def describe(self) -> str:
        what = "the reference text" if self.text == REFERENCE_TEXT else (
            f"text {self.text[:30]!r}" if self.text else f"random inputs (seed {self.seed})")
        return f"{what}, batch {self.batch}" + (f", block {self.block}" if self.block else "")


@lru_cache(maxsize=1)
def reference_id():
    """Which reference grades this session (printed once), found without loading the model."""
    from graders.reference import identify

    chosen = identify()
    print(f"Reference: {chosen.label}")
    return chosen


def reference():
    """The reference model itself (loaded once per process)."""
    from graders.reference import load_reference

    return load_reference(reference_id().source, quiet=True)


def _weights_file():
    """All reference weights under course names, snapshotted once per weights fingerprint."""
    from graders.paths import atomic_write, cache_dir

    path = cache_dir("course-weights") / f"{reference_id().fingerprint}.safetensors"
    if not path.is_file():
        from safetensors.torch import save_file

        from graders.weights import course_weights

        atomic_write(path, lambda temporary: save_file(course_weights(reference()), temporary))
    return path


@lru_cache(maxsize=1)
def weights() -> dict[str, torch.Tensor]:
    """All reference weights under the course's names."""
    from safetensors.torch import load_file

    return load_file(_weights_file())


def part(prefix: str) -> dict[str, torch.Tensor]:
    """The reference weights under `prefix` (e.g. "blocks.3.attn"), read alone from disk."""
    from safetensors import safe_open

    head = prefix.rstrip(".") + "."
    with safe_open(_weights_file(), framework="pt") as f:
        found = {k[len(head):]: f.get_tensor(k) for k in f.keys() if k.startswith(head)}
    if not found:
        raise KeyError(f"No reference weights under {prefix!r}.")
    return found


def activations(case: Case) -> dict[str, torch.Tensor]:
    from graders.activations import reference_activations

    return reference_activations(reference_id(), case.tokens())


def rand_float(seed: int, *shape: int) -> torch.Tensor:
    """Random fp32 input for shape checks, as in the classic rand_float_test."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def rand_int(seed: int, *shape: int) -> torch.Tensor:
    """Random token ids for shape checks, as in the classic rand_int_test."""
    return torch.randint(100, 1000, shape, generator=torch.Generator().manual_seed(seed))


def loaded(what: str, cls, prefix: str, cfg: Config | None = None):
    """The learner's module built with `cfg` and strictly loaded with the reference `prefix`."""
    from graders.engine import CheckFailed, build_module
    from graders.weights import WeightLoadError, load_strict

    module = build_module(what, cls, cfg or Config())
    try:
        return load_strict(module, part(prefix), what)
    except WeightLoadError as err:
        raise CheckFailed(str(err)) from None


EXERCISES: dict[str, "Exercise"] = {}


class Recorder:
    """Autograding mode: checks save what the learner's code produced instead of judging it.

    The instructor's harness turns this on inside the learner's kernel; a clean process that
    never ran learner code judges the saved tensors later. Whatever learner code does to this
    object can only change what gets recorded, never a verdict.
    """
    directory = None
    cell = None
    count = 0

    @classmethod
    def start(cls, directory: str, cell: str) -> None:
        from pathlib import Path

        cls.directory, cls.cell = Path(directory), cell

    @classmethod
    def save(cls, exercise: str, case: "Case", outputs: dict | None, message: str = "") -> None:
        import dataclasses
        import json

        from safetensors.torch import save_file

        cls.count += 1
        stem = cls.directory / f"{cls.count:05d}"
        record = {"cell": cls.cell, "exercise": exercise, "case": dataclasses.asdict(case),
                  "message": message, "tensors": outputs is not None}
        if outputs is not None:
            save_file({k: torch.as_tensor(v).detach().cpu().contiguous().clone()
                       for k, v in outputs.items()}, f"{stem}.safetensors")
        stem.with_suffix(".json").write_text(json.dumps(record))


_LISTING: list | None = None


class listing_checks:
    """Within this block, checks only append (exercise, case) to `into`: nothing runs."""

    def __init__(self, into: list):
        self.into = into

    def __enter__(self):
        global _LISTING
        _LISTING = self.into

    def __exit__(self, *exc):
        global _LISTING
        _LISTING = None


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: `produce` runs learner code, `judge` decides without running it."""
    name: str
    produce: "object"   # (learner object, Case) -> dict[str, Tensor]
    judge: "object"     # (Case, outputs) -> None, raises CheckFailed

    def __post_init__(self):
        EXERCISES[self.name] = self

    def check(self, learner, **case) -> None:
        """Grade `learner` on one case; print a line when it passes, raise with a diagnosis if not."""
        import contextlib
        import sys
        import warnings

        from graders.engine import ok

        from graders.engine import CheckFailed

        chosen = Case(**case)
        if _LISTING is not None:
            import dataclasses

            _LISTING.append((self.name, dataclasses.asdict(chosen)))
            return
        # Library warnings and progress bars go to stdout: nbgrader zeroes a test cell that
        # wrote anything to stderr, even when every check in it passed.
        with contextlib.redirect_stderr(sys.stdout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if Recorder.directory is None:
                self.judge(chosen, self.produce(learner, chosen))
            else:
                try:
                    Recorder.save(self.name, chosen, self.produce(learner, chosen))
                except CheckFailed as failure:
                    Recorder.save(self.name, chosen, None, str(failure))
                print(f"{self.name}: outputs recorded for grading on {chosen.describe()}.")
                return
        ok(f"{self.name}: correct on {chosen.describe()}.")
