"""The reference GPT-2 small, as a TransformerLens 4 `TransformerBridge`.

One setting picks the weights: the argument `source`, else `$GPT2_COURSE_WEIGHTS`, else `auto`.
- `pretrained`: the real openai-community/gpt2, from `$GPT2_COURSE_PRETRAINED_DIR` (a folder in
  Hugging Face format) or the local Hugging Face cache. Never downloads: `python -m
  graders.reference.model download` does that, once, on a machine with internet.
- `synthetic`: the deterministic stand-in of :mod:`graders.reference.synthetic`, generated once into the
  course cache and checked against its sha256 fingerprint on every load.
- `auto`: pretrained when it is on disk, otherwise synthetic; one line says which.

Both go through the same path: a Hugging Face `GPT2LMHeadModel` booted into a bridge in
compatibility mode with no weight processing, so the hooks see the plain GPT-2 forward.
"""
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from graders.reference import synthetic
from graders.reference.paths import atomic_folder, atomic_write, building, cache_dir

SOURCE_ENV = "GPT2_COURSE_WEIGHTS"
PRETRAINED_DIR_ENV = "GPT2_COURSE_PRETRAINED_DIR"
HUB_NAME = "openai-community/gpt2"
SOURCES = ("auto", "pretrained", "synthetic")


class ReferenceUnavailable(RuntimeError):
    """The requested reference weights are not on this machine."""


@dataclass(frozen=True)
class Reference:
    bridge: "object"        # transformer_lens.model_bridge.TransformerBridge
    hf_model: "object"      # the transformers GPT2LMHeadModel inside the bridge
    state_dict: dict        # its Hugging Face-named weights, taken before the bridge wrapped it
    tokenizer: "object"     # Hugging Face tokenizer (prepends BOS)
    source: str             # "pretrained" or "synthetic"
    fingerprint: str        # sha256 over the weights
    label: str              # one line saying which weights these are


def _chosen_source(source: str | None) -> str:
    chosen = (source or os.environ.get(SOURCE_ENV) or "auto").strip().lower()
    if chosen not in SOURCES:
        raise ValueError(
            f"Unknown reference source {chosen!r} (from the argument or ${SOURCE_ENV}); "
            f"choose one of {', '.join(SOURCES)}."
        )
    return chosen


def _quiet_transformers() -> None:
    """Hugging Face's progress bars and warnings off: they go to stderr, which nbgrader punishes,
    and a waiting check has one progress line of its own (graders.judging.progress.busy)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _load_hf(where):
    import torch
    from transformers import GPT2LMHeadModel

    _quiet_transformers()
    return GPT2LMHeadModel.from_pretrained(
        where, local_files_only=True, attn_implementation="eager", dtype=torch.float32
    )


def fresh_hf_model(source: str):
    """A new GPT2LMHeadModel (eager, fp32) with the reference's weights, for benchmarks: the
    reference's own model is wrapped by TransformerLens."""
    if source == "synthetic":
        _synthetic_model()                       # makes sure the folder exists and is intact
        return _load_hf(cache_dir() / f"synthetic-gpt2-v{synthetic.VERSION}").eval()
    return _pretrained_model()[0].eval()


def _pretrained_model():
    """The real GPT-2 from a named folder or the Hugging Face cache, without network access."""
    folder = os.environ.get(PRETRAINED_DIR_ENV)
    where = folder or HUB_NAME
    try:
        model = _load_hf(where)
    except Exception as err:  # missing (OSError), half-copied (SafetensorError), ...
        raise ReferenceUnavailable(
            f"The pretrained GPT-2 weights are not on this machine (looked in "
            f"{folder or 'the Hugging Face cache'}). With internet, run "
            f"`.venv/bin/python -m graders.reference.model download`; offline, copy a Hugging Face "
            f"folder of {HUB_NAME} here and set ${PRETRAINED_DIR_ENV} to it. Or use the "
            f"synthetic reference: ${SOURCE_ENV}=synthetic."
        ) from err
    digest = synthetic.fingerprint(model.state_dict())
    return model, digest, f"pretrained GPT-2 small ({where}, sha256 {digest[:12]})"


def _synthetic_model():
    """The synthetic reference from the cache, (re)generated when missing or corrupt."""
    folder = cache_dir() / f"synthetic-gpt2-v{synthetic.VERSION}"
    expected = synthetic.expected_fingerprint()
    for attempt in range(2):
        if attempt or not (folder / "config.json").is_file():
            print(f"Generating the synthetic GPT-2 reference in {folder} (once) ...")
            _quiet_transformers()
            with building("generating the synthetic reference GPT-2, once"):
                atomic_folder(folder, synthetic.write_synthetic, replace_broken=attempt > 0)
        try:
            model = _load_hf(folder)
        except Exception:  # unreadable or truncated files (OSError, SafetensorError, ...)
            continue
        if synthetic.fingerprint(model.state_dict()) == expected:
            return model, expected, _synthetic_label(expected)
    raise RuntimeError(
        f"The synthetic reference generated in {folder} does not match the committed "
        f"fingerprint {expected[:12]} (data/synthetic_gpt2.json): numpy produced different "
        "numbers on this platform. Please report it with `pip freeze`."
    )


def _boot(hf_model):
    from transformer_lens.model_bridge import TransformerBridge

    from graders.reference.tokenizer import hf_tokenizer

    hf_model.eval()
    bridge = TransformerBridge.boot_transformers(
        HUB_NAME, hf_model=hf_model, tokenizer=hf_tokenizer(), device="cpu"
    )
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return bridge


@dataclass(frozen=True)
class ReferenceId:
    """Which reference is in use, found without loading the model (cheap: for every kernel)."""
    source: str
    fingerprint: str
    label: str


def _pretrained_folder() -> Path | None:
    """The local folder holding the pretrained GPT-2, if there is one."""
    named = os.environ.get(PRETRAINED_DIR_ENV)
    if named:
        if not (Path(named) / "config.json").is_file():
            raise ReferenceUnavailable(
                f"${PRETRAINED_DIR_ENV} is {named}, which holds no GPT-2 weights (no config.json): "
                f"correct the folder, or unset ${PRETRAINED_DIR_ENV} to use the Hugging Face cache "
                "or the synthetic reference.")
        return Path(named)
    from huggingface_hub import constants

    # try_to_load_from_cache answers None without this folder; importing it costs 0.4 s.
    if not (Path(constants.HF_HUB_CACHE) / f"models--{HUB_NAME.replace('/', '--')}").is_dir():
        return None
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(HUB_NAME, "config.json")
    return Path(hit).parent if isinstance(hit, str) else None


def _pretrained_fingerprint(folder: Path) -> str:
    """The weights' fingerprint, computed once per set of weight files and remembered."""
    import hashlib

    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    stamp = json.dumps([(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files])
    record = cache_dir("fingerprints") / f"{hashlib.sha256(stamp.encode()).hexdigest()}.json"
    if record.is_file():
        return json.loads(record.read_text())["sha256"]
    _, digest, _ = _pretrained_model()
    atomic_write(record, lambda temporary: temporary.write_text(json.dumps({"sha256": digest, "files": stamp})))
    return digest


@lru_cache(maxsize=None)
def identify(source: str | None = None) -> ReferenceId:
    """Which reference `load_reference(source)` would load, without loading it."""
    chosen = _chosen_source(source)
    if chosen in ("auto", "pretrained"):
        folder = _pretrained_folder()
        if folder is not None:
            digest = _pretrained_fingerprint(folder)
            return ReferenceId("pretrained", digest, f"pretrained GPT-2 small ({folder}, sha256 {digest[:12]})")
        if chosen == "pretrained":
            _pretrained_model()  # raises ReferenceUnavailable with the how-to
    digest = synthetic.expected_fingerprint()
    return ReferenceId("synthetic", digest, _synthetic_label(digest))


def _synthetic_label(digest: str) -> str:
    return f"synthetic GPT-2-small-shaped reference (seed {synthetic.SEED}, sha256 {digest[:12]})"


@lru_cache(maxsize=None)
def load_reference(source: str | None = None, quiet: bool = False) -> Reference:
    """The reference model, its tokenizer, and a label saying which weights they are."""
    with building("loading the reference GPT-2"):
        return _loaded(_chosen_source(source), quiet)


def _loaded(chosen: str, quiet: bool) -> Reference:
    if chosen == "auto":
        _pretrained_folder()   # a mistyped $GPT2_COURSE_PRETRAINED_DIR is an error, not a fallback
        try:
            model, digest, label = _pretrained_model()
            chosen = "pretrained"
        except ReferenceUnavailable:
            model, digest, label = _synthetic_model()
            chosen = "synthetic"
    elif chosen == "pretrained":
        model, digest, label = _pretrained_model()
    else:
        model, digest, label = _synthetic_model()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    bridge = _boot(model)
    if not quiet:
        print(f"Reference: {label}")
    return Reference(
        bridge=bridge, hf_model=model, state_dict=state, tokenizer=bridge.tokenizer, source=chosen,
        fingerprint=digest, label=label,
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m graders.reference.model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["show", "download"],
                        help="show: load the reference and print which it is; "
                             "download: fetch the real GPT-2 into the Hugging Face cache (online)")
    args = parser.parse_args(argv)
    if args.command == "download":
        from transformers import GPT2LMHeadModel

        GPT2LMHeadModel.from_pretrained(HUB_NAME)
        print(f"Downloaded {HUB_NAME}; `auto` now uses it.")
        return 0
    reference = load_reference()
    print(f"source={reference.source} fingerprint={reference.fingerprint}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
