"""The reference in use, and its weights under the course's names, loaded once per process.

Which reference (pretrained or synthetic) is decided by graders.reference.model.identify; a
grading kernel is told instead (`PINNED_ENV`), since it can see neither the grader's Hugging
Face cache nor the reference model's files, only the course weights.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

if TYPE_CHECKING:
    import torch

PINNED_ENV = "GPT2_COURSE_REFERENCE_ID"


@lru_cache(maxsize=1)
def reference_id():
    """Which reference grades this session (printed once), found without loading the model."""
    from graders.reference.model import ReferenceId, identify

    pinned = os.environ.get(PINNED_ENV)
    chosen = ReferenceId(**json.loads(pinned)) if pinned else identify()
    print(f"Reference: {chosen.label}")
    return chosen


def pinned_env() -> dict[str, str]:
    """The environment that tells a grading kernel which reference the judge uses."""
    from dataclasses import asdict

    return {PINNED_ENV: json.dumps(asdict(reference_id()))}


def reference():
    """The reference model itself (loaded once per process)."""
    from graders.reference.model import load_reference

    return load_reference(reference_id().source, quiet=True)


def weights_file() -> Path:
    """All reference weights under course names, snapshotted once per weights fingerprint."""
    from graders.reference.paths import atomic_write, building, cache_dir

    path = cache_dir("course-weights") / f"{reference_id().fingerprint}.safetensors"
    if not path.is_file():
        from safetensors.torch import save_file

        from graders.reference.weights import course_weights

        model = reference()
        with building("saving the reference's weights under the course's names, once"):
            atomic_write(path, lambda temporary: save_file(course_weights(model), temporary))
    return path


@lru_cache(maxsize=1)
def weights() -> dict[str, torch.Tensor]:
    """All reference weights under the course's names."""
    from safetensors.torch import load_file

    return load_file(weights_file())


def part(prefix: str) -> dict[str, torch.Tensor]:
    """The reference weights under `prefix` (e.g. "blocks.3.attn"), read alone from disk."""
    from safetensors import safe_open

    from graders.reference.weights import component

    with safe_open(weights_file(), framework="pt") as f:
        return component(f, prefix)


def course_component(name: str, prefix: str | None = None, cfg=None):
    """The course's own `name` (graders.reference.components), built with `cfg` (default: GPT-2
    small's), with the reference weights under `prefix` (all of them when None): how a judge
    computes the expected output on an input that no file holds."""
    from graders.reference import components
    from graders.reference.config import Config
    from graders.reference.weights import load_strict

    module = getattr(components, name)(cfg or Config())
    return load_strict(module, part(prefix) if prefix else weights(), name).eval()
