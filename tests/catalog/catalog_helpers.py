"""The assertions every catalog makes of a named mistake, written once: the check fails, its message
holds the expected words, and its corrected code, if any, is on its last line only."""
from __future__ import annotations

import pytest

from fix_last import fix_only_last
from graders.judging.compare import CheckFailed


def fails_with(check, *learner, expected, first_line=False, **case) -> str:
    """`check`, called with the `learner`'s answer(s) and the `case`, fails with each of `expected`
    (a string or several) in its message, the first of them on its first line if `first_line` (the
    line where a check names the mistake); returns the message."""
    with pytest.raises(CheckFailed) as failure:
        check(*learner, **case)
    message = fix_only_last(str(failure.value))
    words = [expected] if isinstance(expected, str) else list(expected)
    assert words, "no expected words: say what the message must hold"
    if first_line:
        assert words[0] in message.splitlines()[0], message
    for text in words:
        assert text in message, message
    return message


def named_message(check, learner) -> str:
    """The message of `check` failing on `learner`, after asserting that it names the mistake on its
    first line and prints no general recipe under it (the corrected code, if any, on its last line)."""
    message = fails_with(check, learner, expected="Likely mistake:", first_line=True)
    assert "Hint:" not in message, message
    return message
