"""Running the learner's code on the grader's inputs, in the learner's kernel.

Crashes, unimplemented stubs and library shortcuts become messages a learner can act on.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from graders.judging.compare import CheckFailed
from graders.judging.provenance import CourseCodeSealed

@dataclass
class Forbidden:
    """Library implementations of the thing the learner must build, by where they live."""
    what: str                      # "LayerNorm"
    targets: Sequence[tuple[object, str]] = field(default_factory=tuple)  # (module/class, attr)
    source_words: Sequence[str] = field(default_factory=tuple)            # in the learner's source
    instead: str = "from tensor operations"                               # how to build it
    # The grader also looks for source_words in the whole notebook's code; False limits that to
    # the exercise's own answer cells, for words that other exercises of the notebook need.
    notebook_wide: bool = True
    # Library code that computes the answer, as "package.module" (all of it) or
    # "package.module:Qualname" (one function or class): the check fails if any of it runs while
    # the learner's code runs, however it was reached (a subclass, an alias, a call from a
    # library). For the libraries a notebook teaches next to (tiktoken in 11, torch.optim in 12).
    library_code: Sequence[str] = field(default_factory=tuple)


ALWAYS_FORBIDDEN_WORDS = ("transformer_lens", "transformers", "HookedTransformer", "TransformerBridge")


class LibraryUsed(RuntimeError):
    pass


@contextlib.contextmanager
def _tripwires(forbidden: Forbidden):
    """Make the forbidden library functions raise while the learner's code runs."""
    saved = []

    def tripwire(name):
        def fail(*args, **kwargs):
            raise LibraryUsed(name)
        return fail

    missing = object()
    try:
        for owner, attr in forbidden.targets:
            # The owner's own attribute, not an inherited one: restoring an inherited attribute
            # would shadow the base's (and a base tripwired first would stay tripwired).
            own = vars(owner).get(attr, missing) if hasattr(owner, "__dict__") else getattr(owner, attr)
            saved.append((owner, attr, own))
            setattr(owner, attr, tripwire(f"{getattr(owner, '__name__', owner)}.{attr}"))
        yield
    finally:
        for owner, attr, original in reversed(saved):
            if original is missing:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)


def _source_of(obj) -> str:
    definition = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    try:
        return _cached_source(definition)
    except TypeError:   # a class whose metaclass makes it unhashable
        return _source(definition)


def _source(definition) -> str:
    try:
        return inspect.getsource(definition)
    except (OSError, TypeError):
        return ""


# Read once per class or function: finding a class's source parses its whole file, and a check
# runs the learner's code several times.
_cached_source = functools.lru_cache(maxsize=256)(_source)


def run_learner(what: str, fn: Callable, *args, forbidden: Forbidden | None = None, **kwargs):
    """Call learner code, turning crashes and library shortcuts into messages a learner can act on."""
    forbidden = forbidden or Forbidden(what)
    source = _source_of(fn if not isinstance(fn, torch.nn.Module) else type(fn))
    code_lines = [ln.split("#")[0] for ln in source.splitlines()
                  if not ln.strip().startswith(("#", '"""', "'''"))]
    code = "\n".join(code_lines)
    for word in tuple(forbidden.source_words) + ALWAYS_FORBIDDEN_WORDS:
        if mentions(code, word):
            raise CheckFailed(f"{what}: your code uses `{word}`. The point of this exercise is to "
                              f"implement {forbidden.what} yourself {forbidden.instead}; "
                              "replace the library call with your own computation.")
    try:
        with _tripwires(forbidden), torch.no_grad():
            return fn(*args, **kwargs)
    except LibraryUsed as used:
        raise CheckFailed(f"{what}: your code calls `{used}`. Implement {forbidden.what} yourself "
                          f"{forbidden.instead} instead of calling the library version.") from None
    except CheckFailed:
        raise
    except CourseCodeSealed as sealed:   # a grading kernel's sealed copy (graders.harness.kernel_view)
        raise CheckFailed(sealed.message(what)) from None
    except NotImplementedError as err:
        raised = _unwritten_part(err, fn)
        raise unwritten(f"{what}: {raised} is not written yet (your {what} calls it)."
                        if raised else f"{what}: not written yet: write it in the cell above.") from None
    except Exception as err:  # the learner's bug: report it in their terms, not torch's
        raise CheckFailed(f"{what} raised {type(err).__name__}: {err}\n"
                          f"  while running on {describe_args(args)}.") from err


def _namespace(learner) -> dict | None:
    """The module globals the learner's function or class looks its names up in (a class's own
    methods', never a library base class's), or None."""
    candidates = vars(learner).values() if isinstance(learner, type) else (learner,)
    for candidate in candidates:
        fn = inspect.unwrap(getattr(candidate, "__func__", candidate))   # decorators, staticmethod
        if inspect.isfunction(fn):
            return fn.__globals__
    return None


@contextlib.contextmanager
def course_functions(learner, parts: dict):
    """Run `learner`'s code with the course's versions of the notebook functions named in `parts`
    in place of the learner's own (under the names the notebook gives them). Those parts have
    checks of their own, so a mistake in one costs that check only, not the composite's too."""
    namespace = _namespace(learner)
    if namespace is None:
        yield
        return
    missing = object()
    saved = {name: namespace.get(name, missing) for name in parts}
    namespace.update(parts)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def with_course_functions(produce: Callable, parts: dict) -> Callable:
    """`produce` with the learner's code run under course_functions(learner, parts)."""
    @functools.wraps(produce)
    def run(learner, case, inputs):
        with course_functions(learner, parts):
            return produce(learner, case, inputs)
    run.supplies = tuple(parts.values())   # the learner's code may run these (provenance)
    return run


def reads_global(cls, name: str) -> bool:
    """Whether code of the learner's class reads a module-level `name`: the notebook's global
    `cfg` where `self.cfg` (the config the module was built with) was meant."""
    import dis

    def reads(code) -> bool:
        return any(i.opname == "LOAD_GLOBAL" and i.argval == name for i in dis.get_instructions(code)) \
            or any(reads(const) for const in code.co_consts if inspect.iscode(const))

    members = vars(cls).values() if isinstance(cls, type) else ()
    return any(reads(code) for code in (getattr(getattr(m, "__func__", m), "__code__", None) for m in members)
               if code is not None)


def text_record(text: str) -> torch.Tensor:
    """`text` (e.g. what a learner's crash said) as UTF-8 bytes: recorded outputs are tensors
    only (safetensors), so a message crosses from the kernel to the judge this way."""
    return torch.tensor(list(text.encode()), dtype=torch.uint8)


def recorded_text(record: torch.Tensor) -> str:
    return bytes(record.tolist()).decode(errors="replace")


def mentions(code: str, word: str) -> bool:
    import re

    return re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)" if "." not in word
                     else re.escape(word), code) is not None


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
        tree = ast.parse(textwrap.dedent(_cached_source(inspect.unwrap(function))))
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


def _unwritten_part(err: NotImplementedError, learner) -> str | None:
    """The learner's method that raised `err`, when it is not one of `learner`'s own (a given
    __init__ building the learner's unwritten DecoderLayer): its qualified name."""
    from graders.judging.origins import LEARNER, origin

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


def describe_args(args) -> str:
    """The arguments learner code was called with, as a learner reads them: "a torch.float32 tensor
    of shape [1, 35, 768], a DemoTransformer, True" (not "DemoTransformer, bool")."""
    def described(a) -> str:
        if isinstance(a, torch.Tensor):
            return f"a {a.dtype} tensor of shape {list(a.shape)}"
        if a is None or isinstance(a, (bool, int, float)):
            return repr(a)
        if isinstance(a, str):
            return repr(a) if len(a) <= 40 else f"a text of {len(a):,} characters"
        name = type(a).__name__
        return f"{'an' if name[0] in 'AEIOUaeiou' else 'a'} {name}"
    return ", ".join(described(a) for a in args) or "no arguments"


def build_module(what: str, cls, *args):
    """Instantiate the learner's class, reporting a crash in `__init__` clearly."""
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise CheckFailed(f"{what}: expected your class (a subclass of nn.Module), got {cls!r}.")
    try:
        return cls(*args)
    except CourseCodeSealed as sealed:
        raise CheckFailed(sealed.message(what)) from None
    except NotImplementedError as err:
        raised = _unwritten_part(err, cls)
        owner, _, method = (raised or "").rpartition(".")
        raise unwritten(f"{what}: {owner}.{method} is not written yet ({cls.__name__} builds {owner})."
                        if owner else f"{what}: __init__ is not written yet.") from None
    except Exception as err:
        raise CheckFailed(f"{what}: creating {cls.__name__}(cfg) raised "
                          f"{type(err).__name__}: {err}") from err


# The names failures of the check now running inside renamed_submodules_loaded; None outside it.
_NAMES_FAILURES: ContextVar[list[CheckFailed] | None] = ContextVar("names_failures", default=None)


@contextlib.contextmanager
def renamed_submodules_loaded():
    """While inside, a learner's module whose submodules differ from the exercise's in name only
    (`attention_heads` for `attn`) is loaded under its own names and checked on, so that the
    learner hears at once whether their computation is right too; the names' failure, which
    still fails the check, goes into the list this yields."""
    failures: list[CheckFailed] = []
    token = _NAMES_FAILURES.set(failures)
    try:
        yield failures
    finally:
        _NAMES_FAILURES.reset(token)


def load_learner(what: str, module: torch.nn.Module, weights: dict, load=None) -> torch.nn.Module:
    """`weights` loaded into the learner's module (strictly, unless another `load` is given); a
    name or shape that does not fit fails the check with the loader's message. Within
    renamed_submodules_loaded, renamed submodules are loaded under the learner's names instead."""
    from graders.reference.weights import WeightLoadError, learner_renaming, load_strict, renamed

    try:
        return (load or load_strict)(module, weights, what)
    except WeightLoadError as err:
        failures = _NAMES_FAILURES.get()
        renaming = learner_renaming(module, weights) if failures is not None and load is None else None
        if renaming is None:
            raise CheckFailed(str(err)) from None
        failures.append(CheckFailed(str(err)))
    load_strict(module, renamed(weights, renaming), what)
    _also_under_exercise_names(module, renaming)
    return module


def _also_under_exercise_names(module: torch.nn.Module, renaming: dict[str, str]) -> None:
    """Make each renamed submodule reachable under the exercise's name too, so that a grader
    that watches `block.attn` watches the learner's `block.attention_heads`. Set outside torch's
    registry: the module's parameters, state_dict and children stay the learner's own."""
    for ours, theirs in sorted(renaming.items()):
        parent, _, attribute = ours.rpartition(".")
        try:
            owner = module.get_submodule(parent)
        except AttributeError:
            continue
        if not hasattr(owner, attribute):
            object.__setattr__(owner, attribute, module.get_submodule(theirs))


def build_loaded(what: str, cls, cfg, weights: dict, load=None) -> torch.nn.Module:
    """The learner's module built with `cfg`, then loaded with `weights` (see load_learner)."""
    return load_learner(what, build_module(what, cls, cfg), weights, load)


def loaded(what: str, cls, prefix: str, cfg=None):
    """The learner's module built with `cfg` and strictly loaded with the reference `prefix`."""
    from graders.reference.config import Config
    from graders.reference.store import part

    return build_loaded(what, cls, cfg or Config(), part(prefix))
