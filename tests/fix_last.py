"""The rule every catalog's named mistakes keep: a message's corrected code is on its last line,
`  Show the fix: <code>`, and nowhere before it (the displays fold that line away; a learner
must not read the answer in the diagnosis above it)."""
from __future__ import annotations

from graders.judging.rendering import FIX_LABEL, split_fix


def fix_only_last(message: str) -> str:
    """`message`, after asserting that no code of its `Show the fix:` line (the whole line, or one
    of its `;`-separated statements) appears before it, and that the marker is only on its last line."""
    shown, fix = split_fix(message)
    assert FIX_LABEL not in shown, f"a '{FIX_LABEL}' line that is not the last:\n{message}"
    if fix is not None:
        for code in [fix, *(part.strip() for part in fix.split(";"))]:
            assert code not in shown, f"the fix `{code}` appears before its line:\n{message}"
    return message
