"""Solutions pass every test cell, untouched exercises fail every one, and the two stay in sync."""
import ast
import io
import json

import pytest

from graders.course.notebooks import EXERCISES, ROOT, SOLUTIONS, generate, notebook_names, stripped
from graders.exercises import declared_notebooks

NAMES = notebook_names()

# Pictures where learners look: cells tagged `picture`, as each notebook declares.
# Notebooks 07-09 draw their training curves and distributions without the tag.
PICTURES = {name: notebook.pictures for name, notebook in declared_notebooks().items() if notebook.pictures}


def _validate(path, invert=False) -> str:
    """What nbgrader's Validate prints for the notebook at `path`, with the course's
    nbgrader_config.py (as the lab's Validate button runs it: in this process, a kernel of its own)."""
    from nbgrader.validator import Validator
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    validator = Validator(config=config, invert=invert)
    validator.stream = io.StringIO()   # a plain attribute (sys.stdout at nbgrader's import)
    validator.validate_and_print(str(path))
    return validator.stream.getvalue()


def _graded_cells(path) -> int:
    cells = json.loads(path.read_text())["cells"]
    return sum(1 for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade"))


# A notebook with pictures is run once, by `make solutions` (solution_run below), which must pass
# every check with the notebook's points (test_the_reference_run_sums_up_full_points); Validate
# runs the other solutions, and every released notebook.
@pytest.mark.parametrize("name", [name for name in NAMES if name not in PICTURES])
@pytest.mark.slow
def test_solution_passes_every_test_cell(name):
    output = _validate(SOLUTIONS / f"{name}.ipynb")
    assert "Success! Your notebook passes all the tests." in output, output[-3000:]


@pytest.mark.parametrize("name", [n for n in NAMES if _graded_cells(SOLUTIONS / f"{n}.ipynb")])
@pytest.mark.slow
def test_untouched_exercise_fails_every_test_cell(name):
    output = _validate(EXERCISES / f"{name}.ipynb", invert=True)
    assert "Success! The notebook does not pass any tests." in output, output[-3000:]


def test_exercises_are_generated_from_solutions(tmp_path):
    generate(tmp_path)
    fresh = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    assert fresh == sorted(p.name for p in EXERCISES.glob("*.ipynb")), \
        "exercises/ and solutions/ hold different notebooks: run `make exercises`"
    for name in fresh:
        assert stripped(tmp_path / name) == json.loads((EXERCISES / name).read_text()), \
            f"exercises/{name} is out of date with solutions/: run `make exercises`"


@pytest.mark.parametrize("path", sorted(SOLUTIONS.glob("*.ipynb")) + sorted(EXERCISES.glob("*.ipynb")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebooks_are_committed_without_outputs(path):
    assert json.loads(path.read_text()) == stripped(path), f"{path} has outputs: clear them"


@pytest.mark.parametrize("name", NAMES)
def test_test_cells_do_not_stop_run_all(name):
    """JupyterLab's Run All goes past a cell tagged raises-exception; nbgrader and the harness
    still score it 0 when it fails (its error output stays). Set in solutions/, carried into
    exercises/ by `make exercises`."""
    for folder in (SOLUTIONS, EXERCISES):
        cells = json.loads((folder / f"{name}.ipynb").read_text())["cells"]
        untagged = [c["metadata"]["nbgrader"]["grade_id"] for c in cells
                    if c["metadata"].get("nbgrader", {}).get("grade") and not c["metadata"]["nbgrader"].get("solution")
                    and "raises-exception" not in c["metadata"].get("tags", [])]
        assert not untagged, f"{folder.name}/{name}: tag these test cells raises-exception: {untagged}"


@pytest.mark.parametrize("name", [n for n in NAMES if _graded_cells(SOLUTIONS / f"{n}.ipynb")])
def test_a_graded_notebook_ends_with_its_progress_line(name):
    cells = json.loads((SOLUTIONS / f"{name}.ipynb").read_text())["cells"]
    last = "".join(cells[-1]["source"])
    assert cells[-1]["cell_type"] == "code" and f'progress("{name}")' in last, \
        f"end {name} with a code cell calling progress({name!r}) (graders.judging.progress)"


def _demonstration_only_names(source_cells) -> list[str]:
    """Names that a cell outside the demonstrations reads but only a `ready()`-guarded
    demonstration defines (a grading kernel skips those), as 'cell N: name'."""
    def is_demo(node):
        return isinstance(node, ast.If) and isinstance(node.test, ast.Call) and \
            getattr(node.test.func, "id", "") == "ready"

    def stored(node):
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        names |= {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        names |= {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments)
                  for a in n.posonlyargs + n.args + n.kwonlyargs + [n.vararg, n.kwarg] if a}
        return names

    demo_only, found = set(), []
    for index, source in enumerate(source_cells):
        for node in ast.parse(source).body:
            if is_demo(node):
                demo_only |= stored(node)
                continue
            read = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            found += [f"cell {index}: {name}" for name in sorted((read - stored(node)) & demo_only)]
            is_def = isinstance(node, (ast.FunctionDef, ast.ClassDef))
            demo_only -= {node.name} if is_def else stored(node)   # defined again outside
    return found


@pytest.mark.parametrize("name", NAMES)
def test_nothing_graded_needs_a_demonstration(name):
    """A grading kernel skips every `if ready(...)` demonstration (graders.judging.progress):
    no other cell may read a name that only a demonstration defines."""
    cells = json.loads((SOLUTIONS / f"{name}.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    found = _demonstration_only_names(sources)
    assert not found, found


def test_a_cell_that_reads_a_demonstrations_name_is_found():
    cells = ["x = 1",
             "if ready(f):\n    model = make()\n    def helper(a):\n        return a",
             "def answer(t):\n    return model(t) + helper(t) + x",
             "model = 2\nprint(model)"]
    assert _demonstration_only_names(cells) == ["cell 2: helper", "cell 2: model"]


def _course_versions_called(cells: list[dict]) -> list[str]:
    """Where a cell other than an answer reaches, through the course's graders package, something
    named like what the learner writes in this notebook's answer cells (`nb08.apply_top_p(...)`,
    `from graders... import Attention`): the course's version of an exercise, which `??` would
    show. Names are resolved through the notebook's own imports."""
    def is_answer(cell):
        return cell.get("metadata", {}).get("nbgrader", {}).get("solution", False)

    code = [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    answers = {node.name for i, src in code if is_answer(cells[i])
               for node in ast.parse(src).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    from_graders = {}                                   # name bound by an import -> what it names
    for _, src in code:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("graders"):
                from_graders.update({a.asname or a.name: a.name for a in node.names})
            elif isinstance(node, ast.Import):
                from_graders.update({(a.asname or a.name).split(".")[0]: a.name
                                     for a in node.names if a.name.startswith("graders")})
    found = []
    for i, src in code:
        if is_answer(cells[i]):
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("graders"):
                found += [f"cell {i}: imports {a.name}" for a in node.names if a.name in answers]
            elif isinstance(node, ast.Attribute) and node.attr in answers:
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in from_graders:
                    found.append(f"cell {i}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("name", NAMES)
def test_no_cell_hands_over_the_course_version_of_an_exercise(name):
    """Demonstrations use the learner's own module or function: the course's
    implementation of an exercise is never called or imported by name in its notebook."""
    cells = json.loads((SOLUTIONS / f"{name}.ipynb").read_text())["cells"]
    found = _course_versions_called(cells)
    assert not found, found


def test_a_demonstration_calling_the_course_version_is_found():
    def cell(source, solution=False):
        return {"cell_type": "code", "source": source,
                "metadata": {"nbgrader": {"solution": solution}} if solution else {}}
    cells = [cell("from graders.exercises import nb08\nimport graders.reference.components as rc"),
             cell("def apply_top_p(logits, p):\n    return logits", solution=True),
             cell("class Attention:\n    pass", solution=True),
             cell("nb08.check_top_p(apply_top_p)\nprint(apply_top_p(x, 0.9))"),   # the learner's own
             cell("out = nb08.apply_top_p(x, 0.9)"),
             cell("attn = rc.Attention(cfg)"),
             cell("from graders.exercises.nb08.reference import apply_top_p as top_p")]
    assert _course_versions_called(cells) == [
        "cell 4: nb08.apply_top_p", "cell 5: rc.Attention", "cell 6: imports apply_top_p"]




def _picture_cells(notebook) -> list:
    return [c for c in notebook.cells if "picture" in c.metadata.get("tags", [])]


def test_picture_cells_are_where_the_course_says():
    import nbformat

    found = {name: len(_picture_cells(nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)))
             for name in NAMES}
    assert {name: n for name, n in found.items() if n} == PICTURES


# The tests that read what `make solutions` printed and drew share its run of each notebook.
SOLUTION_RUNS = pytest.mark.xdist_group("solution-runs")


@pytest.fixture(scope="session")
def solution_run(tmp_path_factory):
    """`make solutions`' run of a solution notebook, once per notebook on this worker: the saved
    notebook (with its outputs) and its HTML, after asserting that no cell failed."""
    import nbformat

    from graders.course.notebooks import run_solutions

    folder, runs = tmp_path_factory.mktemp("solution-runs"), {}

    def run(name: str):
        if name not in runs:
            assert run_solutions(folder, [name]) == [], name
            runs[name] = (nbformat.read(folder / f"{name}.ipynb", as_version=4),
                          (folder / f"{name}.html").read_text())
        return runs[name]
    return run


@SOLUTION_RUNS
@pytest.mark.parametrize("name", sorted(PICTURES))
@pytest.mark.slow
def test_each_picture_cell_draws_an_image_in_the_solution_run(name, solution_run):
    """`make solutions` runs the solution offline; each picture cell leaves a PNG in the saved
    notebook and in its HTML."""
    executed, html = solution_run(name)
    for cell in _picture_cells(executed):
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert len(images) == 1, (name, cell.source[:80], [o.get("output_type") for o in cell.outputs])
    assert html.count("data:image/png;base64,") >= PICTURES[name]


@SOLUTION_RUNS
@pytest.mark.parametrize("name", sorted(PICTURES))
@pytest.mark.slow
def test_the_reference_run_sums_up_full_points(name, solution_run):
    """`make solutions` (its test cells hold the hidden tests too) ends as a learner's full run
    does: every check passes, with the notebook's points."""
    summary = "".join(o.get("text", "") for o in solution_run(name)[0].cells[-1].outputs)
    assert f"Progress in {name}: " in summary and "every check passes" in summary, summary


@SOLUTION_RUNS
@pytest.mark.slow
def test_notebook_10s_demonstration_printed_the_losses_its_text_states(solution_run):
    """The sentence after notebook 10's training demonstration states the two validation losses
    that the demonstration, run on the solution's own modules in `make solutions`, printed."""
    import re

    cells = solution_run("10_modern_decoder")[0].cells
    demo = next(i for i, cell in enumerate(cells) if "def train_and_validate" in cell.source)
    printed = "".join(o.get("text", "") for o in cells[demo].outputs if o.get("output_type") == "stream")
    losses = [float(x) for x in re.findall(r"validation loss ([\d.]+) nats", printed)]
    counts = [int(x.replace(",", "")) for x in re.findall(r"([\d,]+) parameters", printed)]
    stated = re.search(r"validation loss of ([\d.]+) nats for the GPT-2-style model and ([\d.]+) for\s+"
                       r"the modern decoder", cells[demo + 1].source)
    assert stated, cells[demo + 1].source
    assert len(losses) == 2 and [float(x) for x in stated.groups()] == losses, printed
    assert len(counts) == 2 and abs(counts[0] - counts[1]) < 1000, printed


@SOLUTION_RUNS
@pytest.mark.slow
def test_notebook_10s_demonstration_shows_its_progress_in_the_saved_run_and_its_html(solution_run):
    """A wait of a minute says what it is doing: a line every 10 steps for each model,
    in the notebook `make solutions` saves and in its HTML."""
    executed, html = solution_run("10_modern_decoder")
    demo = next(cell for cell in executed.cells if "def train_and_validate" in cell.source)
    printed = "".join(o.get("text", "") for o in demo.outputs if o.get("output_type") == "stream")
    import re

    lines = re.findall(r"^  (GPT-2-style|modern \(d_mlp = \d+\)): step (\d+)/30, training loss", printed, re.M)
    assert [(model.split()[0], int(step)) for model, step in lines] == \
        [(model, step) for model in ("GPT-2-style", "modern") for step in (10, 20, 30)], printed
    assert html.count("/30, training loss") == 6, "progress lines missing from the HTML"
