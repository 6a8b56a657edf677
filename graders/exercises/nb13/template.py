"""Notebook 13, exercise 1: `chat_tokens(messages, encoding)`, a conversation as one token sequence
under the course's template with its labels, judged token for token against transformers'
`apply_chat_template` (the same template as Jinja, its assistant-token mask). A mistake no catalog
lists is localised: the first token that differs, in which message and which part of it, and
for the labels whether they are the expected ones moved by one position."""
from __future__ import annotations

import torch

from graders.exercises.nb13 import reference as ref
from graders.exercises.nb13.chat import (IM_END_ID, IM_START_ID, chat_encoding, conversations, forges_markers,
                                         hf_chat_tokens)
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner

NOTEBOOK = "13_post_training"
FORBIDDEN = Forbidden("the chat template", source_words=["apply_chat_template", ".apply_chat_template"],
                      instead="from the template's rule and the encoding's encode_ordinary", notebook_wide=False)
SLIPS = {
    "unmasked": "the prompt is not masked: the system and user messages and the markers are learned too; "
                "labels are -100 everywhere but the assistant's content and its <|im_end|>",
    "end_masked": "the assistant's <|im_end|> is masked: the model never learns to stop. It is the one marker "
                  "the assistant writes, so it is learned with the content",
    "shifted": "the labels are shifted by one (labels[i] = tokens[i + 1]): the loss shifts them itself "
               "(position i predicts labels[i + 1]), so shifting here shifts them twice. Give labels "
               "aligned with the tokens",
    "no_newline": "the template's newline after the role is dropped: each message starts "
                  "<|im_start|>{role}\\n, the newline included",
    "last_turn_only": "only the last assistant message is learned: in a conversation of several turns every "
                      "assistant message is an answer to learn, its content and its <|im_end|>",
}
FORGED = ("the characters of a marker typed inside a message became the marker itself, so a user can end their "
          "turn and write the assistant's: the template encodes every content as ordinary text (the encoding "
          "has a method for that), and only the template's own markers are special tokens")


def expected_tokens(messages: list[dict]) -> tuple[list[int], list[int]]:
    """What chat_tokens should give: apply_chat_template's tokens and assistant mask, but for a
    conversation whose content holds a marker's characters, where the library's tokenizer makes them
    the marker and the course's rule keeps them ordinary text (tests cross-check that rule with
    the library's split_special_tokens)."""
    if forges_markers(messages):
        tokens, labels = ref.chat_tokens(messages, chat_encoding())
        return tokens.tolist(), labels.tolist()
    return hf_chat_tokens(messages)


def _as_ids(value, what: str, name: str) -> torch.Tensor:
    if isinstance(value, (list, tuple)):
        try:
            value = torch.tensor(value, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError):
            raise CheckFailed(f"chat_tokens returned {name} that are not a list of integers; return two "
                              f"1-D tensors (or lists) of token ids, on {what}.") from None
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point():
        shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise CheckFailed(f"chat_tokens returned {name} of {shape} on {what}; return a 1-D tensor of "
                          "integer token ids, one per token of the conversation.")
    return value.long()


def produce(chat_tokens, case: Case, inputs: dict) -> dict:
    if not callable(chat_tokens):
        raise CheckFailed(f"chat_tokens: expected your function, got {chat_tokens!r}.")
    outputs = {}
    for i, messages in enumerate(conversations(case.seed)):
        what = f"conversation {i} ({len(messages)} messages)"
        result = run_learner("chat_tokens", chat_tokens, [dict(m) for m in messages], chat_encoding(),
                             forbidden=FORBIDDEN)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise CheckFailed(f"chat_tokens returned {type(result).__name__} on {what}; return a pair "
                              "(tokens, labels).")
        tokens, labels = (_as_ids(value, what, name) for value, name in zip(result, ("tokens", "labels")))
        if tokens.shape != labels.shape:
            raise CheckFailed(f"chat_tokens returned {len(tokens)} tokens but {len(labels)} labels on {what}; "
                              "give one label per token (-100 where nothing is learned).")
        outputs[f"tokens_{i}"], outputs[f"labels_{i}"] = tokens, labels
    return outputs


def _parts(messages: list[dict]) -> list[tuple[str, str, str]]:
    """For each token of the reference sequence: (where it is in words, which part: "marker",
    "role", "content", "end" or "newline", the message's role)."""
    encoding, parts = chat_encoding(), []
    for i, message in enumerate(messages):
        where, role = f"message {i} ({message['role']})", message["role"]
        role_line = encoding.encode_ordinary(role + "\n")
        parts += [(f"{where}: its <|im_start|>", "marker", role)]
        parts += [(f"{where}: its role line '{role}\\n'", "role", role)] * len(role_line)
        parts += [(f"{where}: its content", "content", role)] * len(encoding.encode_ordinary(message["content"]))
        parts += [(f"{where}: its <|im_end|>", "end", role),
                  (f"{where}: the newline after its <|im_end|>", "newline", role)]
    return parts


def slip_named(slip: str) -> Mistake:
    """A listed slip's description, keyed by its name in SLIPS."""
    return Mistake(slip, SLIPS[slip])


def _read_mask(got: torch.Tensor, want: torch.Tensor, parts: list) -> str | None:
    """A mistake named from which tokens are learned where they should not be, or the reverse."""
    flags = list(zip(parts, (got != -100).tolist(), (want != -100).tolist()))
    wrongly_learned = {(kind, role) for (_, kind, role), learned, should in flags if learned and not should}
    wrongly_masked = {(kind, role) for (_, kind, role), learned, should in flags if should and not learned}
    if any(kind == "content" and role != "assistant" for kind, role in wrongly_learned):
        return slip_named("unmasked")
    if wrongly_masked == {("end", "assistant")} and not wrongly_learned:
        return slip_named("end_masked")
    return _labels_moved(got, want)


def _token(token: int) -> str:
    if token == -100:
        return "-100"
    try:
        return f"{token} {chat_encoding().decode([token])!r}"
    except (KeyError, ValueError):
        return f"{token} (not a token of the encoding)"


def _named(outputs: dict, case: Case) -> str | None:
    encoding = chat_encoding()
    for slip in SLIPS:
        if all(torch.equal(outputs[f"tokens_{i}"], t) and torch.equal(outputs[f"labels_{i}"], lab)
               for i, messages in enumerate(conversations(case.seed))
               for t, lab in [ref.chat_tokens(messages, encoding, slip)]):
            return slip_named(slip)
    return None


def _labels_moved(got: torch.Tensor, want: torch.Tensor) -> str | None:
    for shift, key, words in ((1, "shifted", "one position early (labels[i] = tokens[i + 1])"),
                              (-1, "shifted_late", "one position late (labels[i] = tokens[i - 1])")):
        moved = torch.full_like(want, -100)
        if shift == 1:
            moved[:-1] = want[1:]
        else:
            moved[1:] = want[:-1]
        if torch.equal(got, moved):
            return Mistake(key, f"your labels are the expected ones moved {words}")
    return None


def judge(case: Case, outputs: dict) -> None:
    for i, messages in enumerate(conversations(case.seed)):
        ids, labels = (torch.tensor(x) for x in expected_tokens(messages))
        got_tokens, got_labels = outputs[f"tokens_{i}"], outputs[f"labels_{i}"]
        what = f"conversation {i} ({', '.join(m['role'] for m in messages)})"
        if torch.equal(got_tokens, ids) and torch.equal(got_labels, labels):
            continue
        head = f"chat_tokens on {what} differs from " + (
            "the template's rule" if forges_markers(messages) else "apply_chat_template's")
        named = _named(outputs, case)
        if named:
            raise CheckFailed(f"{head}. Likely mistake: {named}.", mistake=mistake_key(named))
        markers = [int(((t == IM_START_ID) | (t == IM_END_ID)).sum()) for t in (got_tokens, ids)]
        if markers[0] > markers[1]:
            raise CheckFailed(f"{head}: your tokens hold {markers[0]} markers, the template's {markers[1]}. "
                              f"Likely mistake: {FORGED}.", mistake="forged_markers")
        parts = _parts(messages)
        if not torch.equal(got_tokens, ids):
            n = min(len(got_tokens), len(ids))
            first = next((p for p in range(n) if got_tokens[p] != ids[p]), n)
            if first == n:
                more = "more" if len(got_tokens) > len(ids) else "fewer"
                raise CheckFailed(f"{head}: your {len(got_tokens)} tokens are the first {n} of its {len(ids)} and "
                                  f"{more}, from position {n} ({parts[min(n, len(parts) - 1)][0]}).\n  Hint: every "
                                  "message, the last included, ends with <|im_end|> and a newline.")
            before = chat_encoding().decode(ids[max(0, first - 6):first].tolist())
            raise CheckFailed(
                f"{head}: the first token that differs is at position {first}, in {parts[first][0]}: yours is "
                f"{_token(int(got_tokens[first]))}, the template's {_token(int(ids[first]))}"
                + (f" (the tokens before it agree: ...{before!r})" if first else "") + ".\n  Hint: each "
                "message is <|im_start|>{role}\\n{content}<|im_end|>\\n, the markers as single special tokens.")
        named = _read_mask(got_labels, labels, parts)
        wrong = (got_labels != labels).nonzero()[:, 0].tolist()
        first = wrong[0]
        learned, should = int(got_labels[first]) != -100, int(labels[first]) != -100
        state = ("learned (label " + _token(int(got_labels[first])) + ")" if learned else "masked (-100)")
        expected = ("learned" if should else "masked")
        raise CheckFailed(
            f"{head} in the labels only (the tokens are right): the first label that differs is at position "
            f"{first}, {parts[first][0]}: yours is {state}, it should be {expected}"
            + (f" (label {_token(int(labels[first]))})" if should else "") + f"; {len(wrong)} labels differ."
            + (f"\n  Likely mistake: {named}." if named else "")
            + "\n  Hint: a label is the token itself where the model learns to write it (an assistant's content "
            "and its <|im_end|>), -100 everywhere else.", mistake=mistake_key(named))


exercise = Exercise(NOTEBOOK, "chat_tokens", produce, judge, forbidden=(FORBIDDEN,), defaults={"text": None},
                    describe=lambda case: "the hidden conversations" if case.seed else "the visible conversation")
check_chat_tokens = exercise.checker(
    "Grade `chat_tokens(messages, encoding)` token for token against transformers' apply_chat_template "
    "with the same template and its assistant-token mask.")
