"""The one function that decides a check's verdict, wherever it is shown.

`decide` takes what the learner's code produced (or the message of its failure, or both when
only its submodules' names were wrong) and the code the learner had run before the check. The
learner's check cell, `make check` and nbgrader's Validate call it in the learner's kernel;
`make grade` and `nbgrader autograde` call it in the grading process on the recorded outputs.
Same inputs, same verdict, same words.

It imports torch only when it judges: `make check`'s own process reads the learner's code with
it and never needs torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

GRADERS_WORD = "graders"


@dataclass(frozen=True)
class LearnerCode:
    """The learner's code a check is judged with: every cell of theirs that ran before it
    (`before`), and the exercise's own answer cells, between the previous test cell and its own
    (`own`). Comments and strings are left out by whoever collects it."""
    before: str = ""
    own: str = ""


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str = ""
    # The key of the known mistake the message names, as "notebook/exercise/mistake"
    # ("01_layernorm/layernorm/sample_variance")
    # (graders.judging.compare.Mistake); None when it names none or one declared without a key.
    mistake: str | None = None


def forbidden_use(exercise, code: LearnerCode) -> str | None:
    """The first library shortcut or grader module the learner's code names, if any: anywhere
    in their code before the check, or in the exercise's own answer cells for words that other
    exercises of the notebook use rightly (Forbidden.notebook_wide=False)."""
    from graders.judging.learner import ALWAYS_FORBIDDEN_WORDS, mentions

    everywhere, own = set(ALWAYS_FORBIDDEN_WORDS) | {GRADERS_WORD}, set()
    for forbidden in exercise.forbidden:
        (everywhere if forbidden.notebook_wide else own).update(forbidden.source_words)
    return next((w for w in sorted(everywhere) if mentions(code.before, w)), None) \
        or next((w for w in sorted(own) if mentions(code.own, w)), None)


def forbidden_message(name: str, word: str, code: LearnerCode = LearnerCode()) -> str:
    """The refusal of a forbidden word, quoting the learner's line that names it; a word found only
    above the exercise's own answer cells (a scratch cell) is said to count there too."""
    from graders.judging.learner import mentions

    line = next((ln.strip() for ln in code.own.splitlines() + code.before.splitlines() if mentions(ln, word)), "")
    where = f" (in the line `{line}`)" if line else ""
    if word == GRADERS_WORD:
        return (f"{name}: your code uses `graders`{where} (an import or a name from the course's graders "
                "package, e.g. `from graders.judging.cases import Case`). Answers may not use the "
                "course's graders: delete that line from your cells, then run this check again.")
    scratch = (" Every cell that ran before this check counts, scratch cells included: compare with the library "
               "in a notebook of its own." if line and not mentions(code.own, word) else "")
    return (f"{name}: your code uses `{word}`{where}. Build it yourself from tensor operations; library "
            f"versions of what you are building are not allowed in answers.{scratch}")


def names_verdict(name: str, names: str, judged: str | None) -> str:
    """The message of a check whose submodule names are not the exercise's (`names` says which),
    where the code ran under the learner's own names: `judged` is what is wrong with what it
    computed there, None when it is right."""
    if judged is None:
        return (f"{names}\nLoaded under your own names instead, your {name} computes the right "
                "thing: give its submodules the exercise's names (the missing ones above) and this "
                "check passes.")
    return (f"{names}\nLoaded under your own names instead, your {name} is also wrong, so renaming "
            f"alone will not pass this check:\n{judged}")


def decide(exercise, case, outputs: dict | None, failure: str, code: LearnerCode,
           failure_mistake: str | None = None) -> Verdict:
    """The verdict on one check: `outputs` is what `produce` returned, or None when it failed
    with the message `failure` (the learner's crash, a missing method, a library call, ...), in
    which `failure_mistake` is the key of the known mistake it names, if any. Both come when the
    learner's submodules are named otherwise than the exercise's (`failure` names them) and the
    outputs are their code's under their own names: the check fails, and the message says
    whether the computation itself is right."""
    if outputs is None:
        return Verdict(False, failure or f"{exercise.name}: your code produced nothing to check.",
                       _mistake(exercise, failure_mistake if failure else None))
    used = forbidden_use(exercise, code)
    if used:
        return Verdict(False, forbidden_message(exercise.name, used, code))
    judged, key = _judged(exercise, case, outputs)
    if failure:
        return Verdict(False, names_verdict(exercise.name, failure, judged), _mistake(exercise, key))
    return Verdict(judged is None, judged or "", _mistake(exercise, key))


def _mistake(exercise, key) -> str | None:
    """A known mistake's key in a class's results: "notebook/exercise/mistake". A key that is not
    one word of lower-case letters, digits and underscores is no key (a produce failure's key
    comes from the learner's kernel)."""
    if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9_]+", key):
        return None
    return f"{exercise.notebook}/{_slug(exercise.name)}/{key}"


def _slug(name: str) -> str:
    """An exercise's name as a key's part: "train (reversal task)" -> "train_reversal_task"."""
    return re.sub(r"\W+", "_", name).strip("_").lower()


def _judged(exercise, case, outputs: dict) -> tuple[str | None, str | None]:
    """What the judge finds wrong with `outputs` (None when they are right), worded the course's
    way (the mistake it names on the first line: graders.judging.compare.diagnosed), and the key
    of that mistake."""
    from graders.judging.compare import CheckFailed, diagnosed

    try:
        exercise.judge(case, outputs)
    except CheckFailed as failed:
        return diagnosed(str(failed)), failed.mistake
    except Exception as err:  # malformed outputs (wrong keys, types): the learner's loss
        return f"{exercise.name}: the recorded outputs are unusable ({type(err).__name__}: {err})", None
    return None, None
