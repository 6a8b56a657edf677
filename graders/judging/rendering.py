"""How a failed check looks to a learner: the diagnosis first, then their own code, never ours.

IPython shows an exception through its `_render_traceback_` method when it has one (and
nbgrader's Validate shows what the kernel rendered), so `CheckFailed` renders itself with
`render`: the diagnosis (what is wrong and where, its "Likely mistake: ..." when the check
recognises one, a "Hint: ..." line when it has one: the contract README.md states) and, when the
learner's code raised, the frames of that code (their cell and line). Frames of the graders,
of torch or of Python itself are left out.
"""
from __future__ import annotations

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


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


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


def render(failure: BaseException, color: bool = True, width: int = WIDTH) -> list[str]:
    """The lines a learner sees for a failed check: the diagnosis, then where their code raised."""
    message = str(failure).strip("\n") or type(failure).__name__
    first, *rest = message.splitlines()
    head = _wrapped(f"{CROSS} {first}", width)
    if color:
        head = [BOLD_RED + line + RESET for line in head]
    lines = head + [part for line in rest for part in _wrapped(line, width)]
    cause = failure.__cause__
    if cause is not None:
        frames = learner_frames(cause)
        if frames:
            lines.append(f"  {type(cause).__name__} raised in your code:")
            lines += format_frames(frames)
    return lines
