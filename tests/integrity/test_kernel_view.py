"""What a confined grading kernel sees of the graders package (graders.integrity.kernel_view): the
course's implementation of what its notebook grades, and every judge, only as a sealed copy."""
import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from graders.integrity import kernel_view
from graders.integrity.origins import PACKAGE
from graders.integrity.provenance import CourseCodeSealed
from graders.reference import components

COMPONENTS = PACKAGE / "reference" / "components.py"


def _sealed_module(names):
    namespace: dict = {"__name__": "__main__"}
    exec(compile(kernel_view.sealed_source(COMPONENTS, names), "<sealed components>", "exec"), namespace)
    return namespace


def _first_body_line(function) -> str:
    """The first line of code in `function`'s body (past its marks, signature and docstring)."""
    definition = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    body = definition.body[1:] if ast.get_docstring(definition) else definition.body
    return ast.unparse(body[0]).splitlines()[0]


def test_a_sealed_class_keeps_its_name_and_methods_but_none_of_its_code():
    sealed = _sealed_module({"LayerNorm"})["LayerNorm"]
    assert [m for m in vars(sealed) if inspect.isfunction(vars(sealed)[m])] == \
        [m for m in vars(components.LayerNorm) if inspect.isfunction(vars(components.LayerNorm)[m])]
    source = kernel_view.sealed_source(COMPONENTS, {"LayerNorm"})
    real = _first_body_line(components.LayerNorm.forward)
    assert real and real not in source
    with pytest.raises(CourseCodeSealed, match="graders/reference/components.py: LayerNorm.__init__"):
        sealed(components.Config())


def test_what_is_not_sealed_stays_as_it_is():
    namespace = _sealed_module({"LayerNorm"})
    assert _first_body_line(components.gelu_new) in kernel_view.sealed_source(COMPONENTS, {"LayerNorm"})
    x = components.torch.randn(3, 4)
    assert components.torch.equal(namespace["gelu_new"](x), components.gelu_new(x))


def _names(notebook):
    return {(path.relative_to(PACKAGE).as_posix(), name)
            for path, names in kernel_view.sealed(notebook).items() for name in names}


def test_a_notebook_kernel_has_its_own_exercises_sealed_and_its_given_parts_real():
    block = _names("05_transformer_block")
    assert ("reference/components.py", "TransformerBlock") in block
    assert not {("reference/components.py", n) for n in ("LayerNorm", "Attention", "MLP")} & block
    assert ("reference/components.py", "LayerNorm") in _names("01_layernorm")
    assert ("reference/components.py", "DemoTransformer") in _names("01_layernorm")   # later ones too


def test_every_judge_is_sealed_in_every_kernel():
    from graders.exercises import find
    from graders.judging.exercise import _REGISTRY

    layernorm = _names("01_layernorm")
    find(("10_modern_decoder", "RMSNorm"))
    for key, exercise in sorted(_REGISTRY.items()):
        judge = inspect.unwrap(exercise.judge)
        path = Path(inspect.getsourcefile(judge)).resolve()
        if path.is_relative_to(PACKAGE) and "." not in judge.__qualname__ and "<" not in judge.__qualname__:
            # (another test registers a throwaway notebook's exercise outside the package)
            assert (path.relative_to(PACKAGE).as_posix(), judge.__qualname__) in layernorm, key


def test_views_unused_for_two_weeks_are_removed_when_a_new_one_is_made(tmp_path):
    import os
    import time

    views = tmp_path / "kernel-views"
    old, recent, current = views / "old", views / "recent", views / "current"
    for folder in (old, recent, current):
        (folder / "01_layernorm").mkdir(parents=True)
    weeks_ago = time.time() - kernel_view.STALE_VIEW_SECONDS - 60
    os.utime(old, (weeks_ago, weeks_ago))
    kernel_view._prune_stale_views(current)
    assert sorted(p.name for p in views.iterdir()) == ["current", "recent"]
