"""The rules of the graders' architecture, each of which once cost a grade when it was implicit.

- Exercises are keyed by (notebook, name); registering a key twice fails at import.
- What a test cell grades is read from its text without running it; a cell the harness cannot
  read (a computed argument) is refused with an error naming it, never scored 0 later.
- Every source test cell of the course can be read, and every exercise is graded somewhere.
- The notebook list lives in one place (solutions/); the README and example class follow it.
- A module imports its own layer and those below, and no module imports itself back through
  others, not even inside a function.
"""
import ast
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from graders.course.notebooks import ROOT, notebook_names
from graders.harness import cells
from graders.harness.manifest import UnreadableTestCell, checks_of, notebook_checks
from graders.judging import exercise as exercise_module


def _import_file(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_duplicate_exercise_fails_at_import_naming_both_places(tmp_path):
    source = textwrap.dedent('''
        from graders.judging.exercise import Exercise

        def produce(learner, case, inputs):
            return {}

        def judge(case, outputs):
            pass

        first = Exercise("99_test", "twice", produce, judge)
        second = Exercise("99_test", "twice", produce, judge)
        ''')
    path = tmp_path / "grader_with_a_duplicate.py"
    path.write_text(source)
    with pytest.raises(exercise_module.DuplicateExercise) as failure:
        _import_file(path)
    message = str(failure.value)
    assert f"{path}:10" in message and f"{path}:11" in message, message


def test_an_exercise_of_another_notebook_module_cannot_take_an_existing_key(tmp_path):
    from graders.exercises import nb08  # noqa: F401  (registers ("08_sampling", "generate"))

    path = tmp_path / "another_generate.py"
    path.write_text("from graders.judging.exercise import Exercise\n"
                    "clash = Exercise('08_sampling', 'generate', print, print)\n")
    with pytest.raises(exercise_module.DuplicateExercise, match="08_sampling.*generate"):
        _import_file(path)


def test_two_notebooks_grade_exercises_of_the_same_name_apart_in_any_import_order(tmp_path):
    """The collision that cost a perfect student 5 points: 07 and 08 each graded a `generate`,
    and whichever module was imported last judged both."""
    for first, second in (("97_a", "97_b"), ("97_b", "97_a")):
        for notebook in (first, second):
            (tmp_path / f"grader_{notebook}.py").write_text(
                "from graders.judging.exercise import Exercise\n"
                f"def judge(case, outputs): return {notebook!r}\n"
                f"generate = Exercise({notebook!r}, 'generate', print, judge)\n")
        code = (f"import grader_{first}, grader_{second}\n"
                "from graders.judging.exercise import registered as find\n"
                "print(find(('97_a', 'generate')).judge(None, None), find(('97_b', 'generate')).judge(None, None))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             cwd=tmp_path)
        assert out.stdout.split() == ["97_a", "97_b"]


def test_every_source_test_cell_is_read_without_running_it():
    """The course's manifest: each test cell's checks, all of the cell's own notebook."""
    graded = set()
    for name in notebook_names():
        for grade_id, checks in notebook_checks(name).items():
            assert not isinstance(checks, UnreadableTestCell), checks
            assert checks, f"{name}/{grade_id} grades nothing"
            assert {key[0] for key, _ in checks} == {name}, (name, grade_id, checks)
            graded |= {key for key, _ in checks}
    registered = {key for key in exercise_module._REGISTRY if not key[0].startswith("99_")}
    assert registered == graded, f"exercises no test cell grades: {registered - graded}"


@pytest.mark.parametrize("source, why", [
    ("nb03.check_attention(Attention, block=cfg.n_layers - 1)", "block= is computed"),
    ("for b in range(3):\n    nb03.check_attention(Attention, block=b)", "not a call"),
    ("nb03.check_attention(Attention, **extra)", "**arguments"),
    ("nb03.helper_that_is_not_a_check(Attention)", "not a check function"),
])
def test_a_test_cell_the_harness_cannot_read_is_refused_naming_the_cell(source, why):
    with pytest.raises(UnreadableTestCell) as failure:
        checks_of(source, "03_attention, test cell attention_test")
    assert "03_attention, test cell attention_test, line" in str(failure.value)
    assert why in str(failure.value)


def test_the_course_is_not_built_with_an_unreadable_test_cell(monkeypatch, tmp_path):
    from graders.course import notebooks
    from graders.harness import manifest

    broken = cells.source_notebook("03_attention")
    test = next(c for c in broken.cells if cells.is_test_cell(c))
    test.source = "nb03.check_attention(Attention, block=cfg.n_layers - 1)"
    monkeypatch.setattr(manifest, "source_notebook", lambda name: broken)
    with pytest.raises(UnreadableTestCell,
                       match="03_attention, test cell causal_mask_test, line 1: the argument block= is computed"):
        notebooks.generate(tmp_path, ["03_attention"])
    assert not list(tmp_path.iterdir())


def test_a_literal_argument_is_read_with_the_exercises_defaults():
    (key, case), = checks_of("nb07.check_per_position_accuracy(per_position_accuracy, seed=5)")
    assert key == ("07_training", "per_position_accuracy")
    assert case["seed"] == 5 and case["text"] is None and case["batch"] == 200


def test_the_readme_table_lists_exactly_the_course_notebooks():
    listed = re.findall(r"^\| `(\d\d_\w+)` \|", (ROOT / "README.md").read_text(), re.M)
    assert listed == notebook_names()


def test_every_graded_notebook_is_declared_once_and_every_declaration_is_a_notebook():
    from graders.exercises import declaration, declared_notebooks

    graded = [n for n in notebook_names() if cells.test_cells(cells.source_notebook(n))]
    for name in graded:
        declaration(name)   # raises MissingGrader, naming the file to write
    assert sorted(declared_notebooks()) == graded


def test_every_declared_example_bug_edits_its_solution_answer_cell():
    from graders.course.example_class import BUGS

    for name, cell, old, _ in BUGS:
        answers = {cells.nbgrader_meta(c).get("grade_id"): c.source for c in cells.source_notebook(name).cells}
        assert old in answers[cell], (name, cell)


def test_tests_marked_for_one_worker_share_it(tmp_path):
    """`make test` runs pytest-xdist with --dist loadgroup so that the tests of one graded class
    share the worker that graded it (the class is graded once per worker session). pytest 9.2
    broke that silently with pytest-xdist 3.8 (the example class was graded twice per run);
    this fails if an upgrade breaks it again."""
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent('''
        import os, time, pytest
        GROUP = pytest.mark.xdist_group("one")

        @GROUP
        def test_first(tmp_path_factory):
            time.sleep(0.5)
            (tmp_path_factory.getbasetemp().parent / "first").write_text(os.environ["PYTEST_XDIST_WORKER"])

        @GROUP
        def test_second(tmp_path_factory):
            (tmp_path_factory.getbasetemp().parent / "second").write_text(os.environ["PYTEST_XDIST_WORKER"])

        def test_other():
            time.sleep(1)
    '''))
    base = tmp_path / "base"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                          "-p", "no:cacheprovider", f"--basetemp={base}", "test_grouped.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (base / "first").read_text() == (base / "second").read_text()


# The layers, lowest first: a module may import its own layer and those below, never above.
LAYERS = ["layout", "marks", "reference", "judging", "exercises", "harness", "course"]


# graders.integrity spans two layers: what runs in a kernel beside the checks sits with judging
# (which calls it), what plans, confines and watches kernels from the host sits with the harness.
INTEGRITY_ON_THE_HOST = {"host", "sandbox", "sandbox_kernel", "kernel_view", "kernel_plan", "library_seals",
                         "course_answers", "disk_watch"}
# What code outside graders.integrity may import of it: its two interfaces, and the torch
# routines the exercises' declarations name.
INTEGRITY_INTERFACE = {"graders.integrity", "graders.integrity.host", "graders.integrity.library_kernels"}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] == ["graders", "integrity"]:
        return LAYERS.index("harness" if len(parts) > 2 and parts[2] in INTEGRITY_ON_THE_HOST else "judging")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[0] == "graders" and parts[1] in LAYERS else None


def test_no_module_imports_a_higher_layer_even_inside_a_function():
    upward = []
    for path in sorted((ROOT / "graders").rglob("*.py")):
        own = _layer("graders." + ".".join(path.relative_to(ROOT / "graders").with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            upward += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                       if own is not None and (_layer(n) or 0) > own]
    assert not upward, upward


def test_what_notebooks_share_imports_no_notebooks_grader():
    """graders/exercises/common/ is below the notebooks' graders: a shared diagnosis that reached
    into one notebook's package would tie every notebook that shares it to that one."""
    reaching = []
    for path in sorted((ROOT / "graders" / "exercises" / "common").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            reaching += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                         if re.match(r"graders\.exercises\.nb\d\d", n)]
    assert not reaching, reaching


def test_a_missing_inputs_file_is_a_grader_error_naming_the_exercise_and_the_file(tmp_path):
    from graders.exercises import find
    from graders.judging.session import GraderError, Session, recorded_inputs

    layer_norm = find(("01_layernorm", "LayerNorm"))
    with pytest.raises(GraderError, match=r"inputs of LayerNorm for layernorm_test/0 .*layernorm_test\.0\.safetensors"):
        recorded_inputs(Session(records=tmp_path, inputs=tmp_path), "layernorm_test/0", layer_norm)


def _module_names() -> dict[str, Path]:
    """graders' modules by dotted name (a package by its own name, from its __init__.py)."""
    modules = {}
    for path in sorted((ROOT / "graders").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement of `module` may load: `from a import b` loads a, and
    a.b when b is a module; `from .b import c` is relative to `module`'s package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _import_graph() -> dict[str, dict[str, str]]:
    """{module: {module it imports: "file:line" of the first such import}}, every import
    statement counted (inside functions too); a module's imports of its own packages left out."""
    modules = _module_names()

    def within(name: str) -> str | None:   # the module a dotted name lands in (a.b.function: a.b)
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, str]] = {name: {} for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in map(within, _imported(node, name, path.name == "__init__.py")):
                if target and target != name and not name.startswith(target + "."):
                    graph[name].setdefault(target, f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def _tangles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _cycle_through(first: str, tangle: list[str], graph: dict[str, dict[str, str]]) -> list[str]:
    """The shortest import path from `first` back to itself within its tangle: the cycle in order."""
    came_from: dict[str, str] = {}   # a module reached: the module that imports it on the path
    frontier = [first]
    while first not in came_from:
        reached = []
        for module in frontier:
            for target in sorted(graph[module]):
                if target in tangle and target not in came_from:
                    came_from[target] = module
                    reached.append(target)
        frontier = reached
    path = [first, came_from[first]]
    while path[-1] != first:
        path.append(came_from[path[-1]])
    return path[::-1]


def test_no_import_cycles_among_the_graders_modules_even_inside_a_function():
    """A cycle hides which module is the lower one, and a function-level import that closes it
    fails only when that function runs: a lower module gets what it needs handed down instead."""
    graph = _import_graph()
    cycles = []
    for tangle in _tangles(graph):
        cycle = _cycle_through(tangle[0], tangle, graph)
        arrows = "".join(f"\n    {graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:]))
        rest = sorted(set(tangle) - set(cycle))
        cycles.append(" -> ".join(cycle) + arrows + (f"\n    in the same tangle: {', '.join(rest)}" if rest else ""))
    assert not cycles, "import cycles among graders' modules:\n" + "\n".join(cycles)


def test_code_outside_the_integrity_package_uses_its_interface_only():
    """Integrity is one concern behind a small interface: teaching and grading code (and the
    benchmarks) import `graders.integrity`, `graders.integrity.host` or the declared torch
    routines, never the modules behind them."""
    inside = []
    for path in sorted([*(ROOT / "graders").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        if path.is_relative_to(ROOT / "graders" / "integrity"):
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                inside += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                           for name in _imported(node, module, path.name == "__init__.py")
                           if name.startswith("graders.integrity.") and name.count(".") == 2
                           and name not in INTEGRITY_INTERFACE and _is_module(name)]
    assert not inside, inside


def _is_module(name: str) -> bool:
    return (ROOT / (name.replace(".", "/") + ".py")).is_file() or (ROOT / name.replace(".", "/")).is_dir()

