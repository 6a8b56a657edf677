"""An answer that is still nbgrader's stub: told as "not written yet", before anything is built
(`untouched`), or when a check's run reaches one (`unwritten_part`)."""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap

from graders.judging.compare import CheckFailed

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code


def source(definition) -> str:
    try:
        return inspect.getsource(definition)
    except (OSError, TypeError):
        return ""


# Read once per class or function: finding a class's source parses its whole file, and a check
# runs the learner's code several times.
cached_source = functools.lru_cache(maxsize=256)(source)


def unwritten(message: str) -> CheckFailed:
    """The failure of a check whose answer (or a part it uses) is still nbgrader's stub: the
    notebook's summary says "not written yet" of it, not "its check fails"."""
    failure = CheckFailed(message)
    failure.unwritten = True
    return failure


def is_stub(function) -> bool:
    """Whether `function` is still nbgrader's stub: its body ends with `raise NotImplementedError`
    and returns nothing before it (lines given above the raise, such as super().__init__(), may
    stay), so that a call can only raise."""
    try:
        tree = ast.parse(textwrap.dedent(cached_source(inspect.unwrap(function))))
    except (TypeError, SyntaxError, ValueError):
        return False
    definition = tree.body[0] if tree.body else None
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    last = definition.body[-1]
    raised = getattr(last, "exc", None)
    raised = raised.func if isinstance(raised, ast.Call) else raised
    if not (isinstance(last, ast.Raise) and isinstance(raised, ast.Name) and raised.id == "NotImplementedError"):
        return False
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)   # their returns are theirs
    own = [n for s in definition.body[:-1] if not isinstance(s, nested) for n in ast.walk(s)]
    return not any(isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)) for node in own)


def _methods(cls) -> dict:
    """{name: function} of the methods a class defines itself."""
    return {name: inspect.unwrap(getattr(member, "__func__", member)) for name, member in vars(cls).items()
            if inspect.isfunction(getattr(member, "__func__", member))}


def untouched(name: str, answers: tuple) -> CheckFailed | None:
    """The failure of a check all of whose answers are still nbgrader's stubs, told without running
    anything (so an untouched exercise is answered at once, before its inputs or its reference are
    made); None when any answer is written, or is not a function or class of the learner's.

    A function is untouched when it is a stub (`is_stub`); a class, when every method it defines,
    a given `__init__` apart, is one. A given `__init__` that builds another untouched class of
    the learner's is named as building it, as the check would find it (its first failure)."""
    if not answers or not all(inspect.isfunction(a) or isinstance(a, type) for a in answers):
        return None
    for answer in answers:
        if inspect.isfunction(answer):
            if not is_stub(answer):
                return None
            continue
        methods = _methods(answer)
        if not any(is_stub(m) for m in methods.values()) or \
                not all(is_stub(m) for n, m in methods.items() if n != "__init__"):
            return None
    for answer in answers:
        built = _unwritten_built(answer)
        if built is not None:
            return unwritten(f"{name}: {built}.__init__ is not written yet ({answer.__name__} builds {built}).")
    what = _what_to_write(name, answers)
    where = " in the cell above" if what in ("it", "them") else ""   # named answers may live in several cells
    return unwritten(f"{name}: not written yet: write {what}{where}.")


def _what_to_write(name: str, answers: tuple) -> str:
    """'it' or 'them' when the check's name names each answer (a function, a class or one of its
    methods), else the answers' names."""
    import re
    words = set(re.findall(r"\w+", name))
    if all(a.__name__ in words or isinstance(a, type) and words & set(_methods(a)) for a in answers):
        return "it" if len(answers) == 1 else "them"
    return " and ".join(a.__name__ for a in answers)


def _unwritten_built(answer) -> str | None:
    """The learner's class whose stub `__init__` the given `__init__` of class `answer` calls first."""
    init = _methods(answer).get("__init__") if isinstance(answer, type) else None
    if init is None or is_stub(init):
        return None
    import dis

    def globals_read(code):   # in order, comprehensions' included (their own code objects)
        for instruction in dis.get_instructions(code):
            if instruction.opname == "LOAD_GLOBAL":
                yield instruction.argval
            elif instruction.opname == "LOAD_CONST" and inspect.iscode(instruction.argval):
                yield from globals_read(instruction.argval)

    for read in globals_read(init.__code__):
        built = init.__globals__.get(read)
        if isinstance(built, type) and built is not answer and is_stub(_methods(built).get("__init__")):
            return built.__name__
    return None


def unwritten_part(err: NotImplementedError, learner) -> str | None:
    """The learner's method that raised `err`, when it is not one of `learner`'s own (a given
    __init__ building the learner's unwritten DecoderLayer): its qualified name."""
    from graders.integrity import LEARNER, origin

    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or origin(tb.tb_frame.f_code).kind != LEARNER:
        return None
    owner, _, _ = tb.tb_frame.f_code.co_qualname.rpartition(".")
    if not owner or owner.endswith("<locals>"):
        return None   # a function: the learner's own, or a helper of theirs
    learner = getattr(learner, "__self__", learner)   # a bound method: its object's class
    if inspect.isfunction(learner) or inspect.isbuiltin(learner):
        return None   # a function the check calls: which class is the learner's is not known
    own = learner if isinstance(learner, type) else type(learner)
    return None if owner.split(".")[-1] == own.__name__ else tb.tb_frame.f_code.co_qualname.split(".<locals>.")[-1]
