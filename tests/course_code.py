"""Test helpers for the provenance check (graders.integrity.provenance).

- `as_cell`: compile an answer as a notebook cell is compiled (IPython registers each cell's
  source in linecache under a name that is no file), so that it is the learner's code; code
  compiled from a bare string is checked for copies of the course's code.
- `course_code_allowed`: a catalog whose variants are built on the course's reference code (a
  subclass of `ref.GQAttention` with one method changed) may run that code in its checks.
"""
import linecache

import pytest

from graders.integrity import provenance


def as_cell(source: str, name: str):
    filename = f"<cell {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


def course_code_allowed(*modules):
    """An autouse fixture: the checks of this test module may run the code of `modules`."""
    files = {m.__file__ for m in modules}

    @pytest.fixture(autouse=True)
    def allowed(monkeypatch):
        real = provenance._borrowed
        monkeypatch.setattr(provenance, "_borrowed", lambda code, allowed: None
                            if code.co_filename in files else real(code, allowed))
    return allowed
