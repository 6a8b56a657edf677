"""A compact vocabulary: GPT-2's BPE tokens, but rows only for the tokens a corpus uses.

Why: tiny Shakespeare's training split uses 11,265 of GPT-2's 50,257 token ids. A model trained
on it with the full vocabulary spends most of its parameters and most of its compute on the
embedding and unembedding rows of tokens it never sees (the unembedding's
`[batch, posn, d_model] @ [d_model, d_vocab]` matmul dominates a small model's step), and those
rows only learn to be improbable. Keeping the tokenizer (the same BPE merges, the same text
pieces) but renumbering the tokens that occur gives the model 11,266 rows instead: one per token
seen in training, plus one explicit **unknown** id standing for every token never seen.

`CompactVocab` is the map: old (GPT-2) id -> new id for encoding, new id -> old id for decoding.
`CompactTokenizer` wraps a GPT-2 encoding so that `encode_ordinary` / `decode` speak new ids,
which is all notebooks 07 and 08 need from a tokenizer. The map is saved with the trained model
(`graders.reference.data.save_model(model, name, vocab=...)`) because a model is meaningless
without the numbering it was trained with.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

GPT2_VOCAB = 50257
UNKNOWN_TEXT = "\N{REPLACEMENT CHARACTER}"   # how decoding shows the unknown id


@dataclass(frozen=True)
class CompactVocab:
    """The old ids kept, in increasing order: new id i < len(kept) is old id kept[i]; new id
    len(kept) is the unknown token, which every other old id maps to."""
    kept: tuple[int, ...]
    n_full: int = GPT2_VOCAB

    @classmethod
    def from_ids(cls, ids: torch.Tensor, n_full: int = GPT2_VOCAB) -> "CompactVocab":
        """The vocabulary of the old ids that occur in `ids` (e.g. a training split)."""
        return cls(tuple(int(i) for i in torch.unique(ids.flatten()).tolist()), n_full)

    def __post_init__(self):
        kept = list(self.kept)
        if kept != sorted(set(kept)) or (kept and not 0 <= kept[0] <= kept[-1] < self.n_full):
            raise ValueError("CompactVocab.kept must be distinct old ids in increasing order, "
                             f"each in [0, {self.n_full})")

    @property
    def d_vocab(self) -> int:
        """Rows the model needs: the kept tokens plus the unknown one."""
        return len(self.kept) + 1

    @property
    def unknown(self) -> int:
        """The new id of every token not kept."""
        return len(self.kept)

    @property
    def old_to_new(self) -> torch.Tensor:
        """A lookup table [n_full]: the new id of every old id (unknown for those not kept)."""
        table = torch.full((self.n_full,), self.unknown, dtype=torch.long)
        table[torch.tensor(self.kept, dtype=torch.long)] = torch.arange(len(self.kept))
        return table

    def encode_ids(self, old: torch.Tensor) -> torch.Tensor:
        """Old ids -> new ids, same shape; ids never seen become `unknown`."""
        old = torch.as_tensor(old, dtype=torch.long)
        if old.numel() and not (0 <= int(old.min()) and int(old.max()) < self.n_full):
            raise ValueError(f"old ids must lie in [0, {self.n_full})")
        return self.old_to_new[old]

    def decode_ids(self, new: torch.Tensor) -> torch.Tensor:
        """New ids -> old ids, same shape; `unknown` becomes -1 (it has no GPT-2 token)."""
        new = torch.as_tensor(new, dtype=torch.long)
        if new.numel() and not (0 <= int(new.min()) and int(new.max()) <= self.unknown):
            raise ValueError(f"new ids must lie in [0, {self.unknown}]")
        back = torch.cat([torch.tensor(self.kept, dtype=torch.long), torch.tensor([-1])])
        return back[new]

    def to_json(self) -> str:
        return json.dumps({"n_full": self.n_full, "kept": list(self.kept)})

    @classmethod
    def from_json(cls, text: str) -> "CompactVocab":
        data = json.loads(text)
        return cls(tuple(data["kept"]), data["n_full"])


class CompactTokenizer:
    """GPT-2's BPE, speaking a `CompactVocab`'s ids: the same text pieces, renumbered.

    Has the three things the notebooks use of a tiktoken encoding: `encode_ordinary(text)` (new
    ids, unseen tokens as `unknown`), `decode(ids)` (the unknown id shows as U+FFFD) and
    `eot_token` (GPT-2's end-of-text in new ids: `unknown` unless the corpus contains it).
    """

    def __init__(self, encoding, vocab: CompactVocab):
        self.encoding, self.vocab = encoding, vocab
        self._table = vocab.old_to_new
        self.n_vocab = vocab.d_vocab
        self.eot_token = int(self._table[encoding.eot_token])

    def encode_ordinary(self, text: str) -> list[int]:
        return self._table[torch.tensor(self.encoding.encode_ordinary(text), dtype=torch.long)].tolist()

    def decode(self, ids) -> str:
        old = self.vocab.decode_ids(torch.as_tensor(list(ids), dtype=torch.long)).tolist()
        pieces, run = [], []
        for token in old:                  # decode runs of known tokens together (multi-byte text)
            if token >= 0:
                run.append(token)
                continue
            pieces += [self.encoding.decode(run), UNKNOWN_TEXT]
            run = []
        return "".join(pieces + [self.encoding.decode(run)])
