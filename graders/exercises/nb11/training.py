"""Notebook 11, exercise 4: `train_bpe`, judged merge for merge against the course's trainer on
hidden corpora, and timed on a training of a stated size. Its mistakes are named by replaying the
catalogued ones (naive.py), else at the first merge that differs: by what that merge is (a whole
character, a pair across pre-tokens, a pair merged before) and by which mistake's counts at that
point (naive.pair_counts) make it the most frequent. The speed check names them the same way.
"""
from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter

import torch

from graders.exercises.nb11 import reference as ref
from graders.exercises.nb11 import naive
from graders.exercises.nb11.naive import naive_train
from graders.exercises.nb11.libraries import refuse_library_parts
from graders.exercises.nb11.pieces import REFUSED_WORDS, TOKENIZER_CODE, TOKENIZER_TARGETS
from graders.exercises.nb11.texts import hidden_corpus
from graders.exercises.nb11.wire import pieces_tensors, tensor_text, tensors_pieces, text_tensor
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, keyed_like, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner

NOTEBOOK = "11_tokenizer"
N_MERGES = 40
VISIBLE_CORPUS = ("the cat sat on the mat, then the cat ate the rat; the rat's hat sat on the cat's mat.\n"
                  "aaa aaaa banana bandana, a bandanna and an anagram: nana, anna, ana.\n") * 6 + (
                  "That is that, and this is this; these are those. Then there were three thin thieves, "
                  "thirty-three thousand thoughts thereafter, and the theatre thronged.\n") * 3
SPEED_CHARACTERS, SPEED_MERGES = 200_000, 500   # the first 200,000 characters of tiny Shakespeare
CEILING_FACTOR, CEILING_FLOOR = 10, 3.0         # times the reference's time, and at least this (s)
FORBIDDEN = Forbidden("BPE training", source_words=REFUSED_WORDS, library_code=TOKENIZER_CODE,
                      targets=TOKENIZER_TARGETS, instead="with dictionaries and counts")
# What each replayed mistake is called (naive.MISTAKES), the catalog the judge names.
NAMES = {
    "across pre-tokens": Mistake("across_pretokens", "pairs are counted across pre-token boundaries (over the whole "
                                 "text): count inside each pre-token only, so that no merge spans two"),
    "unweighted": Mistake("unweighted", "the counts are not weighted: each distinct pre-token counts once. A pair "
                          "in a pre-token that occurs n times occurs n times"),
    "overlapping": Mistake("overlapping", "overlapping occurrences are merged twice: in `a a a`, merging (a, a) "
                           "gives `aa a` (left to right, not overlapping), not `aa aa`"),
    "right to left": Mistake("right_to_left", "the occurrences are merged from the right: in `a a a`, merging (a, "
                             "a) gives `aa a` (left to right), not `a aa`"),
    "first only": Mistake("first_only", "only the first occurrence in a pre-token is merged: merge every "
                          "occurrence, left to right"),
    "characters": Mistake("starts_from_characters", "the pre-tokens start as characters, not bytes: a character "
                          "outside ASCII is one token of several bytes from the start. Start from the UTF-8 bytes, "
                          "one token each (`[bytes([b]) for b in word.encode(\"utf-8\")]`): the merges join them"),
    "not subtracted": Mistake("not_subtracted", "the counts of the pairs a merge removes are not taken off: after a "
                              "merge, subtract each changed pre-token's old pairs (times its count) before adding "
                              "its new ones"),
    "split at whitespace": Mistake("split_at_whitespace", "the text is cut at whitespace (str.split), not by "
                                   "pretokenize: pre-tokens keep their leading space (' the'); call pretokenize"),
    "once per pre-token": Mistake("once_per_pretoken", "a pair is counted once per pre-token even where it occurs "
                                  "more often in it (`banana` holds (a, n) twice): count every occurrence"),
    "index not updated": Mistake("index_not_updated", "the pair-to-pre-token index is not updated with the pairs a "
                                 "merge makes, so a later merge of such a pair misses the pre-tokens that hold it: "
                                 "add each pre-token to the index of each new pair it holds"),
    "tie smallest": Mistake("tie_smallest", "the tie-break takes the smallest pair: among the most frequent pairs, "
                            "take the greatest, max((count, pair))"),
    "tie first seen": Mistake("tie_first_seen", "the tie-break is ignored (the first most frequent pair found): "
                              "among the most frequent pairs, take the greatest, max((count, pair))"),
}


def _merges_record(merges) -> dict:
    """The learner's merges as tensors, or a one-line failure naming what was returned instead."""
    if not isinstance(merges, (list, tuple)):
        raise CheckFailed(f"train_bpe: return a list of merges, (bytes, bytes) pairs; got {type(merges).__name__}.")
    for merge in merges:
        if not (isinstance(merge, (tuple, list)) and len(merge) == 2
                and all(isinstance(p, (bytes, bytearray)) for p in merge)):
            kind = _merge_kind(merge)
            raise CheckFailed(f"train_bpe: each merge must be a pair of bytes objects, like (b' t', b'he'); "
                              f"got {merge!r}.{kind}", mistake=mistake_key(kind))
    lefts, left_lengths = pieces_tensors([bytes(m[0]) for m in merges])
    rights, right_lengths = pieces_tensors([bytes(m[1]) for m in merges])
    return {"lefts": lefts, "left_lengths": left_lengths, "rights": rights, "right_lengths": right_lengths}


def _merge_kind(merge) -> str:
    """What a merge of another kind looks like it holds."""
    if isinstance(merge, (tuple, list)) and len(merge) == 2 and all(isinstance(p, int) for p in merge):
        return Mistake("merges_as_ids", " Likely mistake: the merges recorded as token ids: record the two tokens "
                       "themselves, the byte strings that were joined.")
    if isinstance(merge, (bytes, bytearray)):
        return Mistake("merged_token_recorded", " Likely mistake: the merged token recorded: record the pair that "
                       "was joined, (left, right).")
    if isinstance(merge, (tuple, list)) and len(merge) == 2 and all(isinstance(p, str) for p in merge):
        return Mistake("tokens_as_strings", " Likely mistake: the tokens are strings: keep them as bytes, from the "
                       "text's UTF-8 bytes.")
    return ""


def recorded_merges(outputs: dict) -> list[tuple[bytes, bytes]]:
    return list(zip(tensors_pieces(outputs["lefts"], outputs["left_lengths"]),
                    tensors_pieces(outputs["rights"], outputs["right_lengths"])))


def _corpus(case: Case) -> str:
    return VISIBLE_CORPUS if case.seed == 0 else hidden_corpus(case.seed)


def inputs_train(case: Case) -> dict:
    return {"corpus": text_tensor(_corpus(case))}


def produce_train(train_bpe, case: Case, inputs: dict) -> dict:
    refuse_library_parts("train_bpe", train_bpe, "BPE training")
    return _merges_record(run_learner("train_bpe", train_bpe, tensor_text(inputs["corpus"]), N_MERGES,
                                      forbidden=FORBIDDEN))


def _common(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _place(step: int) -> str:
    """Merge `step` (from 0) as the messages name it, from 1."""
    if step == 0:
        return "the first merge differs"
    return f"merge {step + 1} differs (the {'first is' if step == 1 else f'{step} before it are'} right)"


def judge_merges(text: str, n_merges: int, learned: list, where: str, replay: bool = True) -> None:
    """Fail, naming the mistake, unless `learned` are the reference's merges on `text`. With
    `replay`, the catalogued mistakes are replayed first (the naive trainer: small corpora only);
    then the first merge that differs is explained from the counts at that point."""
    expected = ref.train_bpe(text, n_merges)
    if learned == expected:
        return
    step = _common(learned, expected)
    head = f"train_bpe on {where}"
    if step == len(expected):
        why = (f"no pair is left after merge {step}" if len(expected) < n_merges else
               f"n_merges is {n_merges}. Likely mistake: the loop makes more merges than n_merges (its bound)")
        raise CheckFailed(f"{head}: {len(learned)} merges, expected {len(expected)} (the first {step} are "
                          f"right): {why}. Return n_merges merges, fewer only when no pair is left.",
                          mistake=None if len(expected) < n_merges else "too_many_merges")
    counts = naive.pair_counts(text, learned[:step])
    if step == len(learned):
        wanted = counts[expected[step]]
        if wanted == 1:
            why = Mistake("stops_at_count_one", "Likely mistake: training stops when the most frequent pair occurs "
                          "once: a pair that occurs once is merged too, until n_merges merges are made or no pair is "
                          "left.")
        elif len(learned) == n_merges - 1:
            why = Mistake("one_merge_too_few", "Likely mistake: one merge too few: the loop's bound is off by one.")
        else:
            why = "Return n_merges merges, fewer only when no pair is left."
        raise CheckFailed(f"{head}: only {len(learned)} merges, expected {len(expected)} (those are right); the "
                          f"next, {expected[step]!r}, occurs {_times(wanted)} at that point. {why}",
                          mistake=mistake_key(why))
    replayed = {mistake: naive_train(text, n_merges, mistake) for mistake in naive.MISTAKES} if replay else {}
    best = max(replayed, key=lambda m: _common(learned, replayed[m]), default=None)
    theirs, ours = learned[step], expected[step]
    mine, right = counts.get(theirs, 0), counts[ours]
    word, weight, tokens = naive.holder(text, learned[:step], ours)
    shown = (f"{head}: {_place(step)}: yours is {theirs!r}, which occurs {_times(mine)} at that point, the "
             f"reference's {ours!r}, which occurs {_times(right)} (most often in {word!r}: {_times(weight)}, as "
             f"{tokens}).")
    # Named when the replay agrees on the next 6 merges too (or all): a mistake nobody listed (counts
    # weighted by a pre-token's length) agrees with "unweighted" for 4.
    if best is not None and _common(learned, replayed[best]) >= min(step + 6, len(learned)):
        raise CheckFailed(f"{shown} Likely mistake: {NAMES[best]}.", mistake=mistake_key(NAMES[best]))
    diagnosis = _diagnosis(text, learned, step, ours, counts, depth=6 if replay else 3)
    raise CheckFailed(f"{shown} {diagnosis}", mistake=mistake_key(diagnosis))


def _spans_pre_tokens(pair: tuple[bytes, bytes]) -> bool:
    """Whether the pair's bytes cannot lie inside one pre-token (a part of a pre-token is one)."""
    return len(ref.pretokenize((pair[0] + pair[1]).decode("utf-8", errors="ignore"))) > 1


def _part_of_a_character(token: bytes) -> bool:
    try:
        token.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _whole_character(token: bytes, before: list) -> bool:
    """A character of several bytes that no merge made: a trainer that started from characters."""
    try:
        character = token.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return len(character) == 1 and len(token) > 1 and token not in {a + b for a, b in before}


def _explaining(text: str, learned: list, step: int, ours: tuple, depth: int) -> str | None:
    """The counting mistake (naive.COUNTING) whose counts make the learner's merge `step` the most
    frequent, over the reference's, and its next `depth - 1` merges too (all that there are). A
    mistake that explains only some of them is not named: counts weighted by a pre-token's length,
    which nobody listed, agree with "once per pre-token" or "unweighted" for a merge or four."""
    explained = {}
    for mistake in naive.COUNTING:
        if mistake == "characters" and any(_part_of_a_character(side) for pair in learned for side in pair):
            continue   # a trainer that starts from characters never makes a token of part of one
        if mistake == "split at whitespace" and any(b" " in side for pair in learned for side in pair):
            continue   # nor does one that cuts at whitespace ever make a token that holds a space
        made = 0
        for k in range(step, min(len(learned), step + depth)):
            seen = naive.pair_counts(text, learned[:k], mistake)
            top = max(seen.values(), default=0)
            if seen.get(learned[k], 0) != top or k == step and seen.get(ours, 0) == top:
                break
            made += 1
        if made:
            explained[mistake] = made
    return next((m for m, made in explained.items() if made == min(depth, len(learned) - step)), None)


def _diagnosis(text: str, learned: list, step: int, ours: tuple, counts: Counter, depth: int) -> str:
    """The likely mistake behind the first merge that differs, from what it is and from the counts
    each mistake would see at that point (after the same merges) and at the next `depth - 1`."""
    before, theirs = learned[:step], learned[step]
    mine, right = counts.get(theirs, 0), counts[ours]
    if any(_whole_character(side, before) for side in theirs):
        return keyed_like(NAMES['characters'], f"Likely mistake: {NAMES['characters']}.")
    if _spans_pre_tokens(theirs):
        return keyed_like(NAMES['across pre-tokens'], f"Likely mistake: {NAMES['across pre-tokens']}.")
    if theirs == ours[::-1]:
        return Mistake("pair_reversed", "Likely mistake: the pair recorded the other way round: record (left, "
                       "right), in the text's order.")
    if theirs in before:
        return keyed_like(NAMES['index not updated'], f"Yours was merged before, at merge {before.index(theirs) + 1}, "
                      f"and kept a count. Likely mistake: {NAMES['index not updated']} (or the merged pair's count "
                      "is not dropped).")
    if mine == right:
        order = "smaller" if theirs < ours else "greater"
        return Mistake("tie_break", f"Likely mistake: the tie-break: yours took a {order} pair; among the most "
                       f"frequent pairs, take the greatest, max((count, pair)).")
    if all(learned[k] == max(naive.pair_counts(text, learned[:k]))
           for k in range(step, min(len(learned), step + depth))):
        return Mistake("pair_compared_first", "Yours is the greatest pair there is, not the most frequent (and so "
                       "are the next ones). Likely mistake: the pairs compared pair first: compare (count, pair), the "
                       "count first.")
    mistake = _explaining(text, learned, step, ours, depth)
    if mistake:
        return keyed_like(NAMES[mistake], f"Likely mistake: {NAMES[mistake]}.")
    if mine == 0:
        return Mistake("count_left_over", "Yours is not a pair of adjacent tokens inside any pre-token at that "
                       "point: its count is left over. Likely mistake: the counts of the pairs a merge removes are "
                       "not taken off, or an earlier merge was not applied to every pre-token that holds its pair.")
    return Mistake("miscounted", "Likely mistake: the pairs are miscounted: count each adjacent pair of each "
                   "pre-token's current tokens, times the number of times that pre-token occurs, and take the most "
                   "frequent.")


def _where(case: Case) -> str:
    return "the corpus shown" if case.seed == 0 else f"hidden corpus {case.seed}"


def judge_train(case: Case, outputs: dict) -> None:
    judge_merges(_corpus(case), N_MERGES, recorded_merges(outputs), _where(case))


TRAIN_PARTS = {"pretokenize": ref.pretokenize}
train = Exercise(NOTEBOOK, "train_bpe", produce_train, judge_train,
                 inputs=inputs_train, forbidden=(FORBIDDEN,), defaults={"text": None}, describe=_where,
                 course_parts=TRAIN_PARTS)
check_train_bpe = train.checker(f"Grade `train_bpe` ({N_MERGES} merges) against the course's trainer.")


# --- Speed ---------------------------------------------------------------------------------------

class _TooSlow(BaseException):
    """Raised into the learner's trainer when its time is up (a BaseException: their code's
    `except Exception` does not catch it)."""


@contextlib.contextmanager
def _time_limit(seconds: float, stop):
    """`stop` called (in the main thread) once `seconds` have passed."""
    try:
        previous = signal.signal(signal.SIGALRM, stop)
    except ValueError:   # not the main thread: timed, not stopped
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def speed_corpus() -> str:
    from graders.reference.data import load_tinyshakespeare

    return load_tinyshakespeare()[:SPEED_CHARACTERS]


def inputs_speed(case: Case) -> dict:
    """The corpus, and the ceiling: the reference's time on this machine (under the profiler that
    watches a learner's code in a check, as theirs will be) times CEILING_FACTOR."""
    import cProfile

    text = speed_corpus()
    profiler = cProfile.Profile(builtins=False)
    start = time.perf_counter()
    with profiler:
        ref.train_bpe(text, SPEED_MERGES)
    ceiling = max(CEILING_FACTOR * (time.perf_counter() - start), CEILING_FLOOR)
    return {"corpus": text_tensor(text), "ceiling": torch.tensor(ceiling, dtype=torch.float64)}


def produce_speed(train_bpe, case: Case, inputs: dict) -> dict:
    def stop(signum, frame):   # defined here: what a check's produce defines may run in the learner's code
        raise _TooSlow()

    ceiling, text = float(inputs["ceiling"]), tensor_text(inputs["corpus"])
    refuse_library_parts("train_bpe", train_bpe, "BPE training")
    start = time.perf_counter()
    try:
        with _time_limit(ceiling, stop):
            merges = run_learner("train_bpe", train_bpe, text, SPEED_MERGES, forbidden=FORBIDDEN)
    except _TooSlow:
        return {"timed_out": torch.tensor(True), "ceiling": torch.tensor(ceiling, dtype=torch.float64)}
    seconds = time.perf_counter() - start
    return {"timed_out": torch.tensor(seconds > ceiling), "ceiling": torch.tensor(ceiling, dtype=torch.float64),
            **_merges_record(merges)}


def judge_speed(case: Case, outputs: dict) -> None:
    if bool(outputs["timed_out"]):
        raise CheckFailed(
            f"train_bpe did not finish {SPEED_MERGES} merges on {SPEED_CHARACTERS:,} characters of tiny "
            f"Shakespeare within {float(outputs['ceiling']):.1f} s ({CEILING_FACTOR}x the course trainer's time "
            f"here, at least {CEILING_FLOOR:g} s). Likely mistake: the full recount: every merge counts every "
            "pair of every pre-token again. Count once, then after each merge update only the pre-tokens that "
            "hold the merged pair (keep, for each pair, which pre-tokens hold it).", mistake="full_recount")
    judge_merges(speed_corpus(), SPEED_MERGES, recorded_merges(outputs),
                 f"the first {SPEED_CHARACTERS:,} characters of tiny Shakespeare", replay=False)


speed = Exercise(NOTEBOOK, "train_bpe speed", produce_speed, judge_speed,
                 inputs=inputs_speed, forbidden=(FORBIDDEN,), defaults={"text": None},
                 describe=lambda case: f"{SPEED_MERGES} merges of {SPEED_CHARACTERS:,} characters of Shakespeare",
                 course_parts=TRAIN_PARTS)
check_train_bpe_speed = speed.checker(
    f"Time `train_bpe` on {SPEED_MERGES} merges of the first {SPEED_CHARACTERS:,} characters of tiny Shakespeare.")
