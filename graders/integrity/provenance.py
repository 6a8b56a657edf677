"""Where the code a check ran comes from: the second line of defence of the course's integrity.

The first line is the grading kernel's file system, which holds no correct implementation of
what its notebook grades (graders.integrity.kernel_view). This one holds in every kernel, the
learner's own included, so that the check cell, Validate, `make check` and the grade refuse a
borrowed answer in the same words. While a check runs the learner's code (`Exercise.run`), a
C-level profiler (cProfile: every Python function called and by whom) is on; afterwards a check
fails when its answer
- is the course's code: a subclass or an alias of it, or code compiled from a copy of its source;
- reached the course's code from its own code (through library code such as torch's module
  calls), other than the parts the check supplies and the notebook's given parts;
- ran code of a library that holds the answers (transformer_lens, transformers), or the library
  code that computes this exercise's answer (`Forbidden.library_code`: tiktoken, torch.optim);
- replaced the profiler, or started a process or a thread, while the check ran.
"""
from __future__ import annotations

import cProfile
import functools
import inspect
import os
import sys
import threading
from dataclasses import dataclass, field

from graders.integrity.allowed import allowed_code, code_of, named_by, nested
from graders.integrity.origins import (
    ANSWER_LIBRARY, COPY, COURSE, LEARNER, LIBRARY, MACHINE, Origin, compiled_call, compiled_names, library_answer_spec,
    origin)

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

# torch's module calls: a course module the check hands over (a model, its layers) runs its
# forward from here when the learner's code calls it; to call a course module of its own, the
# learner's code would have to build it, which the check sees.
MODULE_CALLS = os.path.join("torch", "nn", "modules", "module.py")
SPAWNING = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "pty.spawn")


class CourseCodeSealed(RuntimeError):
    """Raised by the course's code as a grading kernel sees it (graders.integrity.kernel_view):
    `where` (graders/...py) and the function's qualified name."""

    def __init__(self, where: str, qualname: str):
        super().__init__(f"{where}: {qualname}")
        self.where, self.qualname = where, qualname

    def message(self, name: str) -> str:
        """What the check says, in the words it uses when the profiler sees the course's code run
        (the learner's own kernel): the same answer gets the same words in the grade."""
        return _message(name, Origin(COURSE, f"{self.where} ({self.qualname})"))


_watches: list["Watch"] = []


def _audit(event: str, args) -> None:
    if not _watches or event not in ("sys.setprofile", "sys.settrace") and not event.startswith(SPAWNING):
        return
    watch = _watches[-1]
    if event in ("sys.setprofile", "sys.settrace"):
        if not watch.switching:
            watch.tampered.append(f"it called {event} while the check ran (the check must see "
                                  "the code your answer runs)")
        return
    if _learner_below(sys._getframe(1)):
        watch.tampered.append(f"it started a process ({event}) while the check ran")


def _learner_below(frame) -> bool:
    """Whether the nearest frame that is not library code is the learner's."""
    while frame is not None:
        kind = origin(frame.f_code).kind
        if kind != LIBRARY:
            return kind in (LEARNER, COPY)
        frame = frame.f_back
    return False


@functools.cache
def install_audit_hook() -> None:
    """Let every `Watch` hear of a profiler replaced or a process started: once per process (an
    audit hook cannot be removed), by graders.integrity.arm."""
    sys.addaudithook(_audit)


@dataclass
class Watch:
    """One check's run of learner code under the profiler; `refusal` says what it found."""
    # Compiled calls are profiled only for a check that refuses some (Forbidden.library_code):
    # torch's operators are compiled, and every check would pay for seeing them.
    builtins: bool = False
    profiler: cProfile.Profile = field(init=False)
    tampered: list[str] = field(default_factory=list)
    threads: set[int] = field(default_factory=set)
    switching: bool = False
    stats: list | None = None
    edges: dict | None = None

    def __post_init__(self) -> None:
        self.profiler = cProfile.Profile(builtins=self.builtins)

    def __enter__(self) -> "Watch":
        self.threads = {t.ident for t in threading.enumerate()}
        _watches.append(self)
        self.switching = True
        self.profiler.enable()
        self.switching = False
        return self

    def __exit__(self, *exc) -> None:
        self.switching = True
        self.profiler.disable()
        self.switching = False
        _watches.remove(self)
        started = [t for t in threading.enumerate() if t.ident not in self.threads]
        frames = sys._current_frames()
        if any(_learner_below(frames.get(t.ident)) for t in started):
            self.tampered.append("it started a thread that runs its code while the check ran "
                                 "(the check sees the calling thread only)")

    def refusal(self, name: str, learner, parts=(), produce=None) -> str | None:
        """Why the learner's answer is not its own (None when it is). `parts` may run inside the
        learner's code, and so may the functions `produce` itself defines (a course method it
        puts in the learner's class for the time of the check)."""
        if self.tampered:
            return f"{name}: your code is not checkable: {self.tampered[0]}. Remove that from your code."
        allowed = allowed_code(tuple(parts)) | (nested([produce.__code__]) if produce is not None else set())
        for code in code_of(learner) + code_of(named_by(learner)):
            found = _borrowed(code, allowed)
            if found:
                return _message(name, found)
        found = self._reached(allowed) or self._through_libraries(allowed)
        if found:   # what the check itself built may run too (looked for only when needed: it costs)
            allowed = allowed | self._handed_over(allowed)
            found = self._reached(allowed) or self._through_libraries(allowed)
        return _message(name, found) if found else None

    def library_answer(self, name: str, forbidden) -> str | None:
        """Which of the library code that computes this check's answer ran (`Forbidden.library_code`),
        wherever it was called from: its Python functions first, then its compiled ones; None when
        none of it did."""
        stats = self._stats()
        for rule in (rule for rule in forbidden if rule.library_code):
            specs = tuple(rule.library_code)
            for filename, qualname in sorted((entry.code.co_filename, entry.code.co_qualname) for entry in stats
                                             if not isinstance(entry.code, str)):
                spec = library_answer_spec(specs, filename, qualname)
                if spec:
                    return (f"{name}: your {name} runs {qualname} from {spec.partition(':')[0]}, a "
                            f"library version of {rule.what}. Write it yourself {rule.instead}.")
            compiled = compiled_names(specs)
            for entry in sorted(e.code for e in stats if isinstance(e.code, str)) if compiled else ():
                called = compiled_call(entry, compiled)
                if called:
                    return (f"{name}: your {name} calls {called}, compiled code of a library version of "
                            f"{rule.what}. Write it yourself {rule.instead}.")
        return None

    def _reached(self, allowed: set) -> Origin | None:
        """What of the course's (or of an answer library's) the learner's code called itself: a
        function, a method, or a class it built; and any copy of the course's code that ran. The
        check's helpers it hands to the learner's code (07's batch source) are supplied parts."""
        called = set()
        for entry in self._stats():
            if isinstance(entry.code, str):
                continue
            kind = origin(entry.code).kind
            if kind == COPY:
                called.add(entry.code)
            elif kind == LEARNER:
                called.update(sub.code for sub in (entry.calls or ()) if not isinstance(sub.code, str))
        for code in sorted(called, key=lambda c: (c.co_filename, c.co_firstlineno)):
            found = _borrowed(code, allowed)
            if found:
                return found
        return None

    def _stats(self) -> list:
        """The profiler's entries, read once (reading them costs as much as the checks on them)."""
        if self.stats is None:
            self.stats = self.profiler.getstats()
        return self.stats

    def _edges(self) -> dict:
        if self.edges is None:
            self.edges = {entry.code: [sub.code for sub in entry.calls or () if not isinstance(sub.code, str)]
                          for entry in self._stats() if not isinstance(entry.code, str)}
        return self.edges

    def _handed_over(self, allowed: set) -> set:
        """What the check's own code (`allowed`, the machinery) made and may hand to the learner's
        code: the functions defined inside the course functions it called (its hooks), and the
        methods of the course classes it constructed (the course's model a
        generation check calls). Not the course functions it called: a part's check may compute
        its inputs with the course's version of that part."""
        edges = self._edges()
        ours = _below(edges, [c for c in edges if c in allowed or origin(c).kind == MACHINE], (COURSE, MACHINE))
        handed = {code for code in nested(ours) if "<locals>" in code.co_qualname or code.co_name == "<lambda>"}
        for code in ours:
            klass = _class_of(code) if code.co_name == "__init__" and origin(code).kind == COURSE else None
            handed |= nested(code_of(klass)) if klass is not None else set()
        return handed

    def _through_libraries(self, allowed: set) -> Origin | None:
        """The course's code that a library ran for the learner's code (a callback handed to
        torch's checkpoint, a map): course code below the learner's code with only library code
        between, other than what the check allows or handed over, and other than the forwards
        torch's module calls run (MODULE_CALLS)."""
        called = {entry.code for entry in self._stats() if _library_runs_course(entry, allowed)}
        if not called:   # no library called the course's code: nothing to trace back
            return None
        edges = self._edges()
        libraries = _below(edges, [c for c in edges if origin(c).kind == LEARNER], (LIBRARY,)) & called
        reached = {callee for code in libraries for callee in edges.get(code, ())
                   if origin(callee).kind == COURSE and callee not in allowed}
        for code in sorted(reached, key=lambda c: (c.co_filename, c.co_firstlineno)):
            found = _borrowed(code, allowed)
            if found:
                return found
        return None


def _library_runs_course(entry, allowed: set) -> bool:
    """Whether a profiled library function (other than torch's module calls) called course code
    that `allowed` does not hold."""
    code = entry.code
    return (not isinstance(code, str) and origin(code).kind == LIBRARY and not code.co_filename.endswith(MODULE_CALLS)
            and any(not isinstance(sub.code, str) and origin(sub.code).kind == COURSE and sub.code not in allowed
                    for sub in entry.calls or ()))


def _below(edges: dict, starts, through) -> set:
    """The functions called below `starts`, through functions of the `through` origins only."""
    seen, stack = set(), list(starts)
    while stack:
        for callee in edges.get(stack.pop(), ()):
            if callee not in seen and origin(callee).kind in through:
                seen.add(callee)
                stack.append(callee)
    return seen


def _module_of_file(filename: str):
    """The loaded graders module of a file (the course's modules are all imported by then)."""
    if filename not in _MODULES:
        _MODULES.update({getattr(m, "__file__", None): m for m in list(sys.modules.values())
                         if getattr(m, "__name__", "").startswith("graders.")})
    return _MODULES.get(filename)


_MODULES: dict = {}


def _class_of(init_code):
    """The module-level class an `__init__` belongs to (None for a class defined in a function)."""
    qualname = init_code.co_qualname
    if "<locals>" in qualname or not qualname.endswith(".__init__"):
        return None
    found = _module_of_file(init_code.co_filename)
    for part in qualname.split(".")[:-1]:
        found = getattr(found, part, None)
    return found if inspect.isclass(found) else None


def _borrowed(code, allowed: set) -> Origin | None:
    """The course's (or an answer library's) code the learner's answer is made of or called: a
    function, a method (even with the learner's own `self`), a class's constructor. None for its
    own code and for the parts the check allows."""
    found = origin(code)
    if code.co_name == "<module>" or code in allowed:   # a module's import; a supplied part
        return None
    if found.kind == COPY:
        return found
    if found.kind not in (COURSE, ANSWER_LIBRARY):
        return None
    return Origin(found.kind, found.where if found.kind != COURSE else f"{found.where} ({code.co_qualname})")


def _message(name: str, found: Origin) -> str:
    if found.kind == COPY:
        return (f"{name}: your {name} runs code that is not in your notebook (compiled from a "
                f"string): a copy of the course's {found.where}. Write it yourself in your cells.")
    if found.kind == ANSWER_LIBRARY:
        return (f"{name}: your {name} runs code from {found.where}, a library version of what you "
                "are building. Build it yourself from tensor operations.")
    return (f"{name}: your {name} runs code from {found.where}, the course's own implementation. "
            "Write it yourself in your cells.")
