"""Adding a notebook takes three files (docs/adding-a-notebook.md). A throwaway notebook written
that way, in a copy of the course, is built, released, graded, given to the example class and
copy-checked, with nothing else edited."""
import json
import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest

from graders.layout import ROOT

NAME = "99_throwaway"
ANSWER = """def unit_rows(x):
    ### BEGIN SOLUTION
    squares = x * x
    total = squares.sum(dim=-1, keepdim=True)
    norm = total.sqrt()
    safe = norm.clamp_min(1e-12)
    scaled = x / safe
    return scaled
    ### END SOLUTION
"""
def minimal_declaration() -> str:
    """The first Python block of docs/adding-a-notebook.md: the minimal declaration it shows."""
    page = (ROOT / "docs" / "adding-a-notebook.md").read_text()
    return textwrap.dedent(page.split("```python\n", 1)[1].split("```", 1)[0])


HELPERS = '''
"""Grader for 99_throwaway: `unit_rows`, every row scaled to length 1."""
import torch

from graders.judging.compare import Mistake, compare
from graders.judging.cases import Case, rand_float
from graders.judging.learner import run_learner


def course_unit_rows(x):
    squares = x * x
    total = squares.sum(dim=-1, keepdim=True)
    norm = total.sqrt()
    safe = norm.clamp_min(1e-12)
    scaled = x / safe
    return scaled


def produce(unit_rows, case: Case, inputs: dict) -> dict:
    return {"out": run_learner("unit_rows", unit_rows, rand_float(case.seed, 3, 4))}


def judge(case: Case, outputs: dict) -> None:
    x = rand_float(case.seed, 3, 4)
    compare("unit_rows", outputs["out"], course_unit_rows(x), ("row", "feature"),
            mistakes={Mistake("squared_norm", "the rows are divided by their squared norm"):
                      x / (x * x).sum(-1, keepdim=True)},
            hint="divide each row by the square root of its sum of squares.")


'''
CATALOG = '''
import pytest
import torch

from graders.exercises import nb99
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed


def test_a_right_answer_passes_and_the_squared_norm_is_named():
    nb99.unit_rows.check(lambda x: x / x.norm(dim=-1, keepdim=True), Case())
    with pytest.raises(CheckFailed, match="squared norm"):
        nb99.unit_rows.check(lambda x: x / (x * x).sum(-1, keepdim=True), Case())
'''
SCRIPT = '''
import json
from pathlib import Path

import nbformat

from graders.course import example_class
from graders.course.notebooks import EXERCISES, generate, release
from graders.exercises import declared_notebooks
from graders.harness.execute import scratch_dir
from graders.harness.grading import grade_notebook

generate(EXERCISES)
released = release(Path("build/course"))
found = {"declared": sorted(declared_notebooks()), "released": [str(p) for p in released], "grades": {}}
students = example_class.students()
students["copier"] = {"99_throwaway": example_class.submission("99_throwaway", True)}
for student in ("perfect", "untouched", "buggy", "copier"):
    path = Path(f"{student}.ipynb")
    nbformat.write(students[student]["99_throwaway"], path)
    with scratch_dir() as workdir:
        result, _ = grade_notebook(student, "99_throwaway", path, workdir)
    found["grades"][student] = [[c.grade_id, c.points, c.message] for c in result.cells]
    found.setdefault("flags", {})[student] = result.flags
print(json.dumps(found))
'''


def _cell(kind, source, grade_id=None, points=None, solution=False, tags=()):
    make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
    cell = make(source)
    if grade_id:
        cell.metadata["nbgrader"] = {"grade": points is not None, "grade_id": grade_id, "locked": not solution,
                                     "schema_version": 3, "solution": solution, "task": False,
                                     **({"points": points} if points is not None else {})}
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _throwaway_notebook():
    notebook = nbformat.v4.new_notebook(cells=[
        _cell("markdown", "# 99 · A throwaway notebook\n\nScale each row to length 1."),
        _cell("code", "import torch\nfrom graders.exercises import nb99\nfrom graders.judging.progress import progress",
              grade_id="setup"),
        _cell("code", ANSWER, grade_id="unit_rows_answer", solution=True),
        _cell("code", "nb99.check_unit_rows(unit_rows)\n### BEGIN HIDDEN TESTS\n"
                      "nb99.check_unit_rows(unit_rows, seed=3)\n### END HIDDEN TESTS",
              grade_id="unit_rows_test", points=2, tags=("raises-exception",)),
        _cell("code", 'progress("99_throwaway")'),
    ])
    notebook.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    return notebook


@pytest.mark.slow
def test_a_notebook_added_in_three_files_is_built_released_graded_and_copy_checked(tmp_path):
    course = tmp_path / "course"
    shutil.copytree(ROOT / "graders", course / "graders", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "data", course / "data")
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for folder in ("solutions", "exercises", "tests"):
        (course / folder).mkdir()
    # The three files.
    nbformat.write(_throwaway_notebook(), course / "solutions" / f"{NAME}.ipynb")
    (course / "graders" / "exercises" / "nb99").mkdir()
    grader = textwrap.dedent(HELPERS) + minimal_declaration()
    (course / "graders" / "exercises" / "nb99" / "__init__.py").write_text(grader)
    (course / "tests" / "catalog").mkdir()
    (course / "tests" / "catalog" / "test_catalog_99.py").write_text(textwrap.dedent(CATALOG))

    catalog = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                             cwd=course, capture_output=True, text=True, timeout=300)
    assert catalog.returncode == 0, catalog.stdout + catalog.stderr
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=course, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])

    assert NAME in found["declared"]
    assert (course / "exercises" / f"{NAME}.ipynb").is_file()
    assert found["released"] == [str(course / "build" / "course" / "release" / NAME / f"{NAME}.ipynb")]
    grades = {student: {g: points for g, points, _ in cells} for student, cells in found["grades"].items()}
    assert grades == {"perfect": {"unit_rows_test": 2}, "untouched": {"unit_rows_test": 0},
                      "buggy": {"unit_rows_test": 0}, "copier": {"unit_rows_test": 2}}
    assert "squared norm" in found["grades"]["buggy"][0][2]
    # The solution's answer is the grader's own function: flagged for review, points kept.
    assert any("matches the course's own implementation (graders/exercises/nb99/__init__.py: course_unit_rows)" in f
               for f in found["flags"]["copier"]), found["flags"]


def test_the_minimal_declaration_takes_at_most_ten_lines():
    """The page's minimal path: an exercise and its notebook declared in at most ten lines, the
    declaration the throwaway notebook above is graded with."""
    declaration = minimal_declaration().strip().splitlines()
    assert len(declaration) <= 10, declaration
    assert any(line.startswith("unit_rows = Exercise(") for line in declaration)
    assert any(line.startswith("NOTEBOOK = Notebook(") for line in declaration)

