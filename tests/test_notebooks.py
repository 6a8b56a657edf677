"""Solutions pass every test cell, untouched exercises fail every one, and the two stay in sync."""
import json
import subprocess
import sys

import pytest

from graders.course.notebooks import EXERCISES, ROOT, SOLUTIONS, generate, notebook_names, stripped, venv_env

NAMES = notebook_names()


def _validate(path, invert=False) -> str:
    command = [sys.executable, "-m", "nbgrader", "validate", str(path)]
    if invert:
        command.append("--invert")
    # From the repository root, so that nbgrader reads the course's nbgrader_config.py.
    run = subprocess.run(command, capture_output=True, text=True, env=venv_env(), timeout=900, cwd=ROOT)
    return run.stdout + run.stderr


def _graded_cells(path) -> int:
    cells = json.loads(path.read_text())["cells"]
    return sum(1 for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade"))


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_every_test_cell(name):
    output = _validate(SOLUTIONS / f"{name}.ipynb")
    assert "Success! Your notebook passes all the tests." in output, output[-3000:]


@pytest.mark.parametrize("name", [n for n in NAMES if _graded_cells(SOLUTIONS / f"{n}.ipynb")])
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

