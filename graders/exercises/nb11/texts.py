"""The hidden texts and training corpora of notebook 11's checks. Sealed in the grading kernels
(marked `@course_answer`, graders.marks): a kernel receives each one only as a check's input."""
from __future__ import annotations

import random
from graders.marks import course_answer


@course_answer("hidden_text")
def hidden_text(seed: int) -> str:
    """One of the hidden texts: prose, code, numbers, whitespace runs, accents, CJK, emoji, and
    GPT-2's special token (by `seed`, cycling)."""
    texts = [
        "The harbour master counted 1,204 boats in 1987; by 2023 there were 86.\n\n"
        "She said she'd row across anyway: \"It's only 3.5 km,\" she laughed.",
        "def tokens_per_second(n_tokens, seconds):\n    if seconds <= 0:\n        raise ValueError('seconds')\n"
        "\n    return n_tokens / seconds   # rate\n\n\tindented_with_a_tab = {\"a\": [1, 2, 3]}\n",
        "Crème brûlée, façade, naïveté, Ærøskøbing and Łódź: déjà vu in São Paulo.   Über    alles?\n\n\n"
        "日本語のテキストも、絵文字も 🙂👍🏽🇫🇷 同じバイトから。",
        "Price: $19.99 (was $24.50) -- 33% off!!!  Call +44 20 7946 0958 before 23:59.<|endoftext|>"
        "A new document starts here, after   three spaces and a tab\t.",
        "WE'LL SEE; THEY'RE HERE, AREN'T THEY? we'll see; they're here, aren't they?\n"
        "    \n  \n3.14159265358979 and 1000000 and 123456789012",
        "Привет, мир! Γειά σου Κόσμε. مرحبا بالعالم. नमस्ते दुनिया.\n"
        "한국어 문장입니다. <|endoftext|><|endoftext|>   tail   ",
    ]
    return texts[seed % len(texts)]


@course_answer("hidden_corpus")
def hidden_corpus(seed: int) -> str:
    """A training corpus from `seed`: words drawn unevenly from a small vocabulary with letter runs
    (`aaa`), repeated letters, contractions and a frequent word outside ASCII (whose characters
    take two or three bytes), so that each training mistake changes the merges. Seed 4's corpus
    is short (24 words): its last merges are of pairs that occur once."""
    rng = random.Random(seed)
    letters = "aabeeilnorstu"
    stems = ["aaa", "baaa", "aaab", "llama", "ssss", "tattoo", "banana", "the", "an", "and", "to", "a",
             "cocoon", "mississippi", "noon", "eerie", "tee", "Ooo", "zzzz", "us", "sea", "seas"]
    stems += ["".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(30)]
    rng.shuffle(stems)
    stems.insert(1, rng.choice(["café", "né", "été", "ñaña", "日本", "über"]))   # the second most frequent
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(stems))]
    words = []
    for _ in range(24 if seed == 4 else 900):
        word = rng.choices(stems, weights)[0]
        if rng.random() < 0.05:
            word += rng.choice(["'s", "'ll", "'re", ",", ".", "!"])
        words.append(word)
        words.append(rng.choice([" ", " ", " ", " ", " ", "\n", "  "]))
    return "".join(words)
