"""How a failed check looks to a learner: the diagnosis first, then their own code, never ours.

IPython shows an exception through its `_render_traceback_` method when it has one (and
nbgrader's Validate shows what the kernel rendered), so `CheckFailed` renders itself with
`render`: the diagnosis (what is wrong and where, its "Likely mistake: ..." when the check
recognises one, a "Hint: ..." line when it has one: the contract README.md states) and, when the
learner's code raised, the frames of that code (their cell and line). Frames of the graders,
of torch or of Python itself are left out.

A message that knows the corrected code ends with it, on its own line: `  Show the fix: <code>`
(`fix_line`, read back by `split_fix`). The text of a verdict keeps that line wherever it is
text (Validate, `make check`, the grade report); the displays fold it away, so that the learner
reads the diagnosis before the answer: the check cell of a learner's own kernel shows it in a
fold after the error (`CheckFailed.folds_fix`), and the feedback page in the same fold
(`fold_html`).
"""
from __future__ import annotations

import html
import linecache
import os
import re
import sys
import sysconfig
import textwrap
import traceback
from pathlib import Path

GRADERS = str(Path(__file__).resolve().parents[1]) + os.sep
BOLD_RED, RESET = "\x1b[1;31m", "\x1b[0m"
CROSS = "\N{BALLOT X}"
WIDTH = 96   # characters per line: what nbgrader's Validate dialog shows without scrolling at 1400 px
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
FIX_LABEL = "Show the fix"
FIX_PREFIX = f"  {FIX_LABEL}: "   # the start of a message's last line when it holds the corrected code


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def fix_line(code: str) -> str:
    """The line that ends a message which knows the corrected code (newline included)."""
    return f"\n{FIX_PREFIX}{code}"


def split_fix(message: str) -> tuple[str, str | None]:
    """(what a display shows, the corrected code it folds away); the code is None when the
    message's last line is not a `Show the fix:` line."""
    shown, newline, last = message.rstrip("\n").rpartition("\n")
    if newline and last.startswith(FIX_PREFIX):
        return shown, last[len(FIX_PREFIX):]
    return message, None


def fold_html(code: str) -> str:
    """The corrected code as HTML, folded: the learner opens it when they choose to."""
    return f"<details><summary>{FIX_LABEL}</summary><pre>{html.escape(code)}</pre></details>"


def message_html(message: str) -> str:
    """A message as HTML: its text in a <pre>, the corrected code folded after it."""
    shown, fix = split_fix(message)
    text = (f'<pre style="white-space: pre-wrap; margin: 0.3em 0 0; padding: 0; border: none; '
            f'background: transparent; color: inherit;">{html.escape(shown)}</pre>')
    return text + (fold_html(fix) if fix is not None else "")


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, paths.get("stdlib", ""),
            paths.get("purelib", ""), paths.get("platlib", "")}
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def is_learner_file(filename: str) -> bool:
    """Code the learner wrote: a notebook cell, or a file of theirs; not the graders, torch,
    the standard library or IPython."""
    if filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):
        return True   # exec'd text: theirs (the graders' code always has a file)
    real = os.path.realpath(filename)
    if real.startswith(GRADERS) or filename.startswith(GRADERS):
        return False
    if _cell_name(filename):
        return True
    return not real.startswith(_library_dirs())


def _cell_name(filename: str) -> str | None:
    """'Cell In[5]' for a notebook cell's code, as IPython names it."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:
        named = None
    return f"{named[0]} {named[1]}" if named else None


def learner_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The frames of the learner's own code in `error`'s traceback, outermost first."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    return [f for f in frames if is_learner_file(f.filename)]


def format_frames(frames: list[traceback.FrameSummary]) -> list[str]:
    lines = []
    for frame in frames:
        where = _cell_name(frame.filename) or (
            frame.filename if frame.filename.startswith("<") else f"File {frame.filename}")
        lines.append(f"    {where}, line {frame.lineno}, in {frame.name}")
        code = (linecache.getline(frame.filename, frame.lineno) or frame.line or "").rstrip()
        if code:
            stripped = code.lstrip()
            lines.append(f"      {stripped}")
            start, end = getattr(frame, "colno", None), getattr(frame, "end_colno", None)
            if (start is not None and end is not None and frame.end_lineno == frame.lineno
                    and end > start and end - start < len(stripped)):
                indent = len(code) - len(stripped)
                lines.append("      " + " " * (start - indent) + "^" * (end - start))
    return lines


def _wrapped(line: str, width: int) -> list[str]:
    """`line` cut at word boundaries to `width` characters, continuation lines indented: nbgrader's
    Validate dialog shows an error in a box that does not wrap (long lines need scrolling)."""
    indent = line[:len(line) - len(line.lstrip())]
    return textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False) or [line]


def render(failure: BaseException, color: bool = True, width: int = WIDTH, fold: bool = False) -> list[str]:
    """The lines a learner sees for a failed check: the diagnosis, then where their code raised.
    The `Show the fix:` line stays whole (code cut at a space would not run); with `fold` it is
    left out, and shown folded after the cell's error (`fold_after_cell`)."""
    message = str(failure).strip("\n") or type(failure).__name__
    shown, fix = split_fix(message)
    if fold and fix is not None:
        message = shown
        fold_after_cell(fix)
    first, *rest = message.splitlines()
    head = _wrapped(f"{CROSS} {first}", width)
    if color:
        head = [BOLD_RED + line + RESET for line in head]
    lines = head + [part for line in rest for part in
                    ([line] if line.startswith(FIX_PREFIX) else _wrapped(line, width))]
    cause = failure.__cause__
    if cause is not None:
        frames = learner_frames(cause)
        if frames:
            lines.append(f"  {type(cause).__name__} raised in your code:")
            lines += format_frames(frames)
    return lines


class FoldsAfterCell:
    """The corrected code of a cell's failed checks, shown folded when the cell ends: a
    `post_run_cell` callback of its shell, which holds the folds (an error's traceback is plain
    text, which cannot fold)."""

    def __init__(self):
        self.pending: list[str] = []

    def add(self, fix: str) -> None:
        if fix not in self.pending:   # once, however often IPython renders the error
            self.pending.append(fix)

    def __call__(self, result=None) -> None:
        from IPython.display import display

        while self.pending:
            fix = self.pending.pop(0)
            display({"text/html": fold_html(fix), "text/plain": FIX_PREFIX + fix}, raw=True)


def fold_after_cell(fix: str) -> None:
    """Show `fix` folded once the running cell ends, after its error, by the shell's
    FoldsAfterCell (registered on first use). Outside IPython there is no cell, and nothing to
    show it in."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return
    if shell is None:
        return
    callbacks = shell.events.callbacks["post_run_cell"]
    folds = next((c for c in callbacks if isinstance(c, FoldsAfterCell)), None)
    if folds is None:
        folds = FoldsAfterCell()
        shell.events.register("post_run_cell", folds)
    folds.add(fix)
