"""A cell that raised (a SyntaxError, or an exception while it ran) leaves its functions and classes
undefined, and the check below it would fail on a bare NameError. Instead, each name the cell
would have defined, and did not, is bound to a `DidNotRun` stand-in: a check given one says which
cell did not run and why (`did_not_run`), in a learner's kernel and in a grading kernel alike,
and so does a demonstration cell that calls it.

The kernel's cell history (graders.judging.session.CellHistory) takes `names_before` as a cell
starts and calls `stand_in` when it has raised. Names the run did define keep their new value:
the learner's code runs, and its own failure shows their line.
"""
from __future__ import annotations

import ast
import re
import sys
import traceback
import warnings
from dataclasses import dataclass

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

_DEFINITION = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)", re.MULTILINE)
_MISSING = object()
_LONGEST_LINE = 60   # characters of the failing line quoted in a message


def scanned_names(source: str) -> list[str]:
    """The names of the `def` and `class` lines that start at a cell's first column, in order:
    read without parsing, so a cell with a SyntaxError has them too (and a thread may ask: ast.parse
    is not thread-safe in Python 3.11)."""
    return list(dict.fromkeys(_DEFINITION.findall(source)))


def defined_names(source: str) -> list[str]:
    """The functions and classes a cell defines at its top level, in order; scanned line by line
    when the cell does not parse (a SyntaxError, or an IPython magic)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # an invalid escape sequence is the learner's to see, not ours
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return scanned_names(source)
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return list(dict.fromkeys(node.name for node in tree.body if isinstance(node, definitions)))


@dataclass(frozen=True)
class CellFailure:
    """How a cell failed: the error's name and message, and its line in that cell."""
    error: str
    detail: str = ""
    line: int | None = None
    code: str = ""

    def said(self) -> str:
        """'it raised SyntaxError at its line 3 (`def f(:`): invalid syntax'."""
        where = ""
        if self.line:
            code = self.code if len(self.code) <= _LONGEST_LINE else self.code[:_LONGEST_LINE - 3] + "..."
            where = f" at its line {self.line}" + (f" (`{code}`)" if code else "")
        if self.error == "KeyboardInterrupt":
            return f"it was interrupted{where} (a time limit, or the stop button)"
        return f"it raised {self.error}{where}" + (f": {self.detail}" if self.detail else "")


def _error_name(error: BaseException) -> str:
    """'SyntaxError', 're.error': the name a learner would write to catch it."""
    kind = type(error)
    module = kind.__module__
    if module in ("builtins", "__main__"):
        return kind.__qualname__
    top = module.split(".")[0]
    return f"{top}.{kind.__name__}" if getattr(sys.modules.get(top), kind.__name__, None) is kind \
        else f"{module}.{kind.__qualname__}"


def failure_of(error: BaseException) -> CellFailure:
    """`error` as the failure of the cell it escaped: the line is the cell's own (a call of a
    function that raised is the line that called it)."""
    detail = str(error.msg if isinstance(error, SyntaxError) else error).strip().split("\n")[0][:200]
    if isinstance(error, SyntaxError):
        return CellFailure(_error_name(error), detail, error.lineno, (error.text or "").strip())
    cell = next((f for f in traceback.extract_tb(error.__traceback__) if f.name == "<module>"), None)
    return CellFailure(_error_name(error), detail, cell.lineno if cell else None,
                       (cell.line or "").strip() if cell else "")


class DidNotRun:
    """What a name stands for when the cell that defines it raised before defining it. Calling it,
    or one of its attributes (`Attention.forward`), fails with the message a check gives."""

    def __init__(self, name: str, failure: CellFailure):
        self.__name__ = name
        self.failure = failure

    def message(self, check: str) -> str:
        defined = self.__name__.split(".")[0]
        return (f"{check}: the cell that defines `{defined}` did not run: {self.failure.said()}. "
                "Fix that cell and run it again.")

    def __call__(self, *args, **kwargs):
        from graders.judging.compare import CheckFailed

        raise CheckFailed(self.message(self.__name__))

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):   # IPython's and Python's protocols (_repr_html_, __len__): not ours
            raise AttributeError(attribute)
        return DidNotRun(f"{self.__name__}.{attribute}", self.failure)

    def __repr__(self) -> str:
        return f"<{self.__name__}: the cell that defines it did not run>"


def did_not_run(check: str, answers: tuple):
    """The failure of a check given an answer whose cell did not run (a CheckFailed), else None."""
    from graders.judging.compare import CheckFailed

    stand_in = next((a for a in answers if isinstance(a, DidNotRun)), None)
    return None if stand_in is None else CheckFailed(stand_in.message(check))


def names_before(source: str, namespace: dict) -> dict[str, object]:
    """What each name the cell defines is bound to before it runs (a marker when it is unbound)."""
    return {name: namespace.get(name, _MISSING) for name in defined_names(source)}


def stand_in(namespace: dict, before: dict[str, object], error: BaseException) -> None:
    """After a cell raised `error`: bind each name it defines that its run did not bind (unbound,
    or still what an earlier run left) to a stand-in that says so."""
    failure = failure_of(error)
    for name, value in before.items():
        if namespace.get(name, _MISSING) is value:
            namespace[name] = DidNotRun(name, failure)
