"""Running the learner's code on the grader's inputs, in the learner's kernel.

Crashes, unimplemented stubs and library shortcuts become messages a learner can act on.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from graders.judging.compare import CheckFailed
from graders import integrity
from graders.integrity import CourseCodeSealed
from graders.judging.stubs import cached_source, source, unwritten, unwritten_part

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

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
    # Torch's operators that compute the answer, as its dispatcher names them ("aten::gelu", or a
    # family "aten::_scaled_dot_product_*"): refused however they are called (graders.integrity.kernels).
    kernels: Sequence[str] = field(default_factory=tuple)
    # What those kernels compute, where it is a part the learner calls rather than `what` itself
    # (04's MLP, which calls gelu_new, refuses the GELU kernel).
    kernels_compute: str = ""

    def kernel_refusal(self, what: str, op: str) -> str:
        """The check's words for a kernel of `kernels` that ran (`what`: the check's name for the code)."""
        return (f"{what}: your {what} runs {op}, torch's own kernel for {self.kernels_compute or self.what}, "
                f"however it is called (a torch function, a Tensor method, torch.ops.aten, torch._C, another "
                f"thread). Write it yourself {self.instead}.")


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
        return cached_source(definition)
    except TypeError:   # a class whose metaclass makes it unhashable
        return source(definition)


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
        with _tripwires(forbidden), torch.no_grad(), integrity.kernel_refusals(forbidden, what):
            return fn(*args, **kwargs)
    except LibraryUsed as used:
        raise CheckFailed(f"{what}: your code calls `{used}`. Implement {forbidden.what} yourself "
                          f"{forbidden.instead} instead of calling the library version.") from None
    except CheckFailed:
        raise
    except CourseCodeSealed as sealed:   # a grading kernel's sealed copy (graders.integrity.kernel_view)
        raise CheckFailed(sealed.message(what)) from None
    except NotImplementedError as err:
        raised = unwritten_part(err, fn)
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
        raised = unwritten_part(err, cls)
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
