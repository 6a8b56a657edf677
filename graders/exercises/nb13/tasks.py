"""Notebook 13's data and models: instructions with exactly checkable answers (the letter after a
letter, the number after a number), a base model the course pretrained on them as plain text, and
the token batches of the finetuning and preference runs, made in the grading process (a kernel
receives them as inputs: they are encoded with the course's chat template).

The tasks are lookups a two-layer model learns within the budget; 07's reversal, whose answer
depends on where each letter is, needs far more steps once the question can sit anywhere in a
conversation (measured while designing this notebook: this model pretrained 800 steps on plain
three-letter reversals mixed with additions reversed 7% of held-out ones). In the plain documents,
asides of different lengths follow the question, so that the distance from the asked letter to the
answer varies, as it does once a template puts markers between them.
"""
from __future__ import annotations

import json
import math
import random
import string
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from graders.exercises.nb13.chat import CHAT_VOCAB, IM_END_ID, chat_encoding, prompt_tokens
from graders.exercises.nb13.gpt import GPT, GPTConfig, seeded_gpt
from graders.reference.vocab import CompactVocab
from graders.marks import course_answer

VERSION = "3"                          # part of the cached models' file names: bump when the recipe changes
LETTERS = string.ascii_lowercase[:-1]  # a..y: each has a next letter
QUESTIONS = ([(f"the letter after {x}", chr(ord(x) + 1)) for x in LETTERS]
             + [(f"the number after {n}", str(n + 1)) for n in range(30)])
HELD_OUT = QUESTIONS[1::4]             # never in a finetuning or preference batch
TRAINING = [q for i, q in enumerate(QUESTIONS) if i % 4 != 1]
SEQ = 16                               # every conversation fits, padded
PRETRAIN = dict(steps=1500, batch=32, seq=48, lr=3e-3, warmup=50)
SFT = dict(steps=400, batch=16, seed=1)     # the recipe (r, alpha, lr) is reference.finetune's


def wrong_answer(question: str, answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: the asked letter or number itself, or one step too far (those of
    them that answer some question, so that the model has seen them written)."""
    asked = question.rsplit(" ", 1)[1]
    too_far = str(int(answer) + 1) if answer.isdigit() else chr(ord(answer) + 1)
    return rng.choice([a for a in (asked, too_far) if a in {a for _, a in QUESTIONS}])


@lru_cache(maxsize=1)
def vocab() -> CompactVocab:
    """The tokens of every question and answer, plain and in conversations, in the model's ids."""
    encoding, ids = chat_encoding(), set()
    for question, answer in QUESTIONS:
        for aside in ASIDES:
            ids.update(_plain(question, answer, aside))
        ids.update(prompt_tokens([{"role": "user", "content": question}]))
        ids.update(encoding.encode_ordinary(answer) + [IM_END_ID])
    return CompactVocab(tuple(sorted(ids)), n_full=CHAT_VOCAB)


@lru_cache(maxsize=1)
def model_ids() -> dict[int, int]:
    """GPT-2 id (with the chat markers) -> the model's id, for the tokens the model knows."""
    return {old: new for new, old in enumerate(vocab().kept)}


def config() -> GPTConfig:
    return GPTConfig(d_vocab=vocab().d_vocab, n_ctx=PRETRAIN["seq"], d_model=64, n_layers=2, n_heads=4)


# What a plain document may add after its question, so that the base model learns to find the
# asked letter or number by what precedes it ("after"), not by how far back it is.
ASIDES = ("", "?", " please", "? Thanks.", ", in one word please", " - answer with one token, no more")


def _plain(question: str, answer: str, aside: str = "") -> list[int]:
    return chat_encoding().encode_ordinary(f"{question}{aside}\n{answer}\n\n")


@course_answer("chat_tokens")
def example(question: str, answer: str) -> tuple[list[int], list[int]]:
    """(prompt, response) of a one-question conversation, in the model's ids: the response is the
    answer and <|im_end|>."""
    table = model_ids()
    response = chat_encoding().encode_ordinary(answer) + [IM_END_ID]
    return [table[t] for t in prompt_tokens([{"role": "user", "content": question}])], [table[t] for t in response]


@course_answer("chat_tokens")
def padded(rows: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) [len(rows), SEQ]: prompt + response + padding; labels are the response's
    tokens, -100 on the prompt and the padding (the padding token is <|im_end|>'s id)."""
    pad = model_ids()[IM_END_ID]
    tokens = torch.full((len(rows), SEQ), pad)
    labels = torch.full((len(rows), SEQ), -100)
    for i, (prompt, response) in enumerate(rows):
        n = len(prompt) + len(response)
        tokens[i, :n] = torch.tensor(prompt + response)
        labels[i, len(prompt):n] = torch.tensor(response)
    return tokens, labels


def sft_batches(seed: int, steps: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) [steps, batch, SEQ] drawn from TRAINING."""
    rng = random.Random(seed)
    made = [padded([example(*rng.choice(TRAINING)) for _ in range(batch)]) for _ in range(steps)]
    return torch.stack([t for t, _ in made]), torch.stack([lab for _, lab in made])


def preference_batches(seed: int, steps: int, batch: int, questions=TRAINING) -> dict[str, torch.Tensor]:
    """Pairs of one prompt with its right answer (chosen) and a plausible wrong one (rejected):
    chosen_tokens, chosen_mask, rejected_tokens, rejected_mask [steps, batch, SEQ] (the masks are
    True on the response's tokens)."""
    rng = random.Random(seed)
    chosen, rejected = [], []
    for _ in range(steps):
        pairs = [rng.choice(questions) for _ in range(batch)]
        chosen.append(padded([example(q, a) for q, a in pairs]))
        rejected.append(padded([example(q, wrong_answer(q, a, rng)) for q, a in pairs]))
    return {f"{kind}_{what}": torch.stack([t if what == "tokens" else lab != -100 for t, lab in made])
            for kind, made in (("chosen", chosen), ("rejected", rejected)) for what in ("tokens", "mask")}


def answers(model: torch.nn.Module, questions=HELD_OUT) -> list[str]:
    """The model's greedy answer to each question, up to its <|im_end|> (or 4 tokens); an answer
    that does not end with <|im_end|> is shown with what followed."""
    from graders.exercises.nb13.gpt import greedy

    stop = model_ids()[IM_END_ID]
    found = greedy(model, [example(q, a)[0] for q, a in questions], stop, 4)
    return [decode(tokens) for tokens in found]


def decode(tokens: list[int]) -> str:
    old = vocab().decode_ids(torch.tensor(tokens, dtype=torch.long)).tolist()
    return chat_encoding().decode([t for t in old if t >= 0])


def exact_match(said: list[str], questions=HELD_OUT) -> float:
    return sum(s == f"{a}<|im_end|>" for s, (_, a) in zip(said, questions)) / len(questions)


# --- The course's models: pretrained once, then kept in the course cache ------------------------

def _pretrain_batch(rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain text: question, newline, answer, blank line, one after another from a random
    offset; only the answers and the blank lines after them are learned (what a document's
    reader could not know)."""
    table, rows, learned = model_ids(), [], []
    seq = PRETRAIN["seq"]
    for _ in range(PRETRAIN["batch"]):
        tokens, mask = [], []
        while len(tokens) < seq + 21:
            (question, answer), aside = rng.choice(QUESTIONS), rng.choice(ASIDES)
            document = [table[t] for t in _plain(question, answer, aside)]
            asked = len(chat_encoding().encode_ordinary(question + aside + "\n"))
            tokens += document
            mask += [False] * asked + [True] * (len(document) - asked)
        start = rng.randint(0, 20)
        rows.append(tokens[start:start + seq + 1])
        learned.append(mask[start:start + seq + 1])
    return torch.tensor(rows), torch.tensor(learned)


def pretrain() -> GPT:
    """The base model: seeded, trained on plain text only (one thread, so always the same)."""
    from graders.exercises.nb07.runs import one_thread

    model, rng = seeded_gpt(config(), 0), random.Random(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN["lr"], weight_decay=0.0)
    steps = PRETRAIN["steps"]
    with one_thread():
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = PRETRAIN["lr"] * min(1, (step + 1) / PRETRAIN["warmup"]) * (
                    0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
            tokens, learned = _pretrain_batch(rng)
            targets = tokens[:, 1:].where(learned[:, 1:], -100)
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), targets.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


MODELS_RECORD = Path(__file__).resolve().parents[3] / "data" / "post_training_models.json"


def expected_fingerprint(name: str) -> str:
    """The committed fingerprint of the course's model `name`: every machine builds these bits."""
    return json.loads(MODELS_RECORD.read_text())[f"{name}-v{VERSION}"]


def cached_file(name: str) -> Path:
    """Where the course cache keeps the course's model `name`."""
    from graders.reference.paths import cache_dir

    return cache_dir("post-training") / f"{name}-v{VERSION}.pt"


def _cached(name: str, make) -> GPT:
    """The course's model `name` from the course cache, built by `make` when missing or not the
    committed one (a truncated file, an older recipe): the same weights on every machine."""
    from graders.reference.paths import atomic_write
    from graders.reference.synthetic import fingerprint

    path, expected = cached_file(name), expected_fingerprint(name)
    if path.is_file():
        try:
            model = loaded(torch.load(path, weights_only=True))
            if fingerprint(model.state_dict()) == expected:
                return model
        except (OSError, RuntimeError, ValueError, EOFError):
            pass
    model = make()
    built = fingerprint(model.state_dict())
    if built != expected:
        raise RuntimeError(f"Notebook 13's {name} model built on this machine (sha256 {built[:12]}) is not the "
                           f"committed one ({expected[:12]}, {MODELS_RECORD.name}): torch computed other numbers "
                           "here, and grades of 13 would differ from other machines'. Please report it with "
                           "`pip freeze` and `lscpu`.")
    try:
        atomic_write(path, lambda temporary: torch.save(model.state_dict(), temporary))
    except OSError:
        pass   # a read-only cache: make it again next time
    return model


@lru_cache(maxsize=1)
def base_weights() -> dict[str, torch.Tensor]:
    """The base model's weights (pretrained once on one thread, then read from the course cache;
    `benchmarks/bench_post_training.py --parts base` times it)."""
    return {k: v.clone() for k, v in _cached("base", pretrain).state_dict().items()}


def loaded(weights: dict[str, torch.Tensor]) -> GPT:
    """A GPT holding `weights`, in eval mode, built without drawing from torch's global generator
    (whatever the caller seeded, its next draws are the same with or without this call)."""
    with torch.random.fork_rng():
        model = GPT(config())
    model.load_state_dict(weights)
    return model.eval()


def base_model() -> GPT:
    return loaded(base_weights())


@course_answer("finetune")
def finetune_course() -> GPT:
    """The course's finetuning of the base model (its LoRA, its loss), merged: the start of the
    preference run."""
    from graders.exercises.nb13 import reference as ref
    from graders.exercises.nb07.runs import one_thread

    tokens, labels = sft_batches(SFT["seed"], SFT["steps"], SFT["batch"])
    batches, base = iter(zip(tokens, labels)), base_model()
    with one_thread(), torch.random.fork_rng():
        torch.manual_seed(SFT["seed"])     # LoRA's A is drawn from it: the same model whatever ran first
        return ref.finetune(base, lambda: next(batches), SFT["steps"])


@lru_cache(maxsize=1)
def sft_weights() -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in _cached("sft", finetune_course).state_dict().items()}


def sft_model() -> GPT:
    return loaded(sft_weights())
