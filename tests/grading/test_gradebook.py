"""The secure grades inside nbgrader: gradebook, formgrader, export, feedback, the exchange, autograde.

One course of notebook 01 (released by `graders.course.notebooks.release`) with three
submissions, graded once by the course's harness into the course: a correct one, the classic
sample-variance bug, and a forged check (the answer cell replaces `nb01.check_layernorm` with
one that prints a pass). nbgrader's own commands then run against it, with this repository's
nbgrader_config.py, as an instructor would run them.
"""
import csv
import json
import secrets
import subprocess
import sys
import urllib.request

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.utils import parse_utc

from conftest import free_port, served
from graders.course import example_class
from graders.course.notebooks import ROOT, release, venv_env
from graders.harness import cells, classroom

pytestmark = [pytest.mark.xdist_group("gradebook"), pytest.mark.slow]
LN = "01_layernorm"
COURSE_ID = "gpt2-from-scratch"   # nbgrader_config.py's
STAMP = "2026-11-20 10:00:00.000000 UTC"
FORGE = "\nnb01.check_layernorm = lambda *a, **k: print('✓ layernorm: correct')\n"


def forged():
    notebook = example_class.submission(LN, True, example_class.BUGS[:1])
    answer = next(c for c in notebook.cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "layernorm_answer")
    answer.source += FORGE
    return notebook


@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    """(server root, course, plain-files output) after `make grade` of three submissions."""
    root = tmp_path_factory.mktemp("nbgrader")
    course = root / "course"
    release(course, [LN])
    notebooks = {"perfect": example_class.submission(LN, True),
                 "buggy": example_class.submission(LN, True, example_class.BUGS[:1]), "forged": forged()}
    for student, notebook in notebooks.items():
        folder = course / "submitted" / student / LN
        folder.mkdir(parents=True)
        nbformat.write(notebook, folder / f"{LN}.ipynb")
        (folder / "timestamp.txt").write_text(STAMP)
    classroom.grade_class(course, root / "grading", [LN], workers=2, course=course)
    return root, course, root / "grading"


def nbgrader(course, *args, cwd=ROOT):
    """An nbgrader command as the instructor runs it (this repository's nbgrader_config.py)."""
    env = dict(venv_env(), GPT2_COURSE_NBGRADER_ROOT=str(course))
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def hidden_lines():
    lines = set()
    for cell in cells.test_cells(cells.source_notebook(LN)):
        lines |= {line.strip() for line in cells.hidden_source(cell).splitlines() if line.strip()}
    assert lines
    return lines


def assert_no_hidden_tests(text, where):
    assert "HIDDEN TESTS" not in text, where
    assert not [line for line in hidden_lines() if line in text], where


def test_the_gradebook_holds_the_same_per_cell_scores_as_grades_csv(graded):
    _, course, out = graded
    with open(out / "grades.csv") as f:
        rows = {row.pop("student"): row for row in csv.DictReader(f)}
    assert {student: row["total"] for student, row in rows.items()} == \
           {"buggy": "0", "forged": "0", "perfect": "5"}
    with Gradebook(f"sqlite:///{course}/gradebook.db", COURSE_ID) as gradebook:
        for student, row in rows.items():
            for column in [c for c in row if "/" in c]:
                notebook, cell = column.split("/")
                grade = gradebook.find_grade(cell, notebook, notebook, student)
                assert (grade.auto_score, grade.score, grade.needs_manual_grade) == \
                       (float(row[column]), float(row[column]), False), (student, column)
            assert gradebook.find_submission(LN, student).timestamp == parse_utc(STAMP)
        comment = gradebook.find_comment("layernorm_answer", LN, LN, "buggy").comment
        assert "layernorm_test: 0 / 5 (failed)" in comment and "sample variance" in comment
        assert comment.endswith("Mistake key: 01_layernorm/layernorm/sample_variance")
        assert gradebook.find_comment("layernorm_answer", LN, LN, "perfect").comment is None
    autograded = course / "autograded" / "buggy" / LN
    assert (autograded / "timestamp.txt").read_text() == STAMP
    notebook = (autograded / f"{LN}.ipynb").read_text()
    assert "FAILED: 0 / 5 points" in notebook and "## Exercise: implement `LayerNorm`" in notebook
    assert_no_hidden_tests(notebook, autograded)
    page = (course / "feedback" / "buggy" / LN / f"{LN}.html").read_text()
    assert page == (out / "feedback" / "buggy" / f"{LN}.html").read_text()
    assert "gpt2-verdict-fail" in page and "Score: 0.0 / 5.0" in page and "sample variance" in page
    assert_no_hidden_tests(page, "feedback")


def test_formgrader_serves_the_secure_grades_and_an_override_reaches_nbgrader_export(graded):
    root, course, _ = graded
    port, token = free_port(), secrets.token_hex(16)

    def call(path, body=None):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="PUT" if body else "GET",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        return json.loads(text) if path.startswith("/formgrader/api") else text

    def ready():
        if call("/formgrader/api/status") != {"status": True}:
            raise ValueError("formgrader is not ready")

    command = [sys.executable, "-m", "jupyter", "server", f"--ServerApp.root_dir={root}",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False", "--allow-root"]
    with served(command, root / "formgrader.log", ready, 180, cwd=ROOT,
                env=dict(venv_env(), GPT2_COURSE_NBGRADER_ROOT=str(course))):
        submissions = call(f"/formgrader/api/submissions/{LN}")
        assert {s["student"]: (s["score"], s["autograded"]) for s in submissions} == \
               {"buggy": (0.0, True), "forged": (0.0, True), "perfect": (5.0, True)}
        notebooks = {n["student"]: n for n in call(f"/formgrader/api/submitted_notebooks/{LN}/{LN}")}
        grades = {student: call(f"/formgrader/api/grades?submission_id={n['id']}")
                  for student, n in notebooks.items()}
        assert {s: [(g["name"], g["auto_score"]) for g in gs] for s, gs in grades.items()} == \
               {"buggy": [("layernorm_test", 0.0)], "forged": [("layernorm_test", 0.0)],
                "perfect": [("layernorm_test", 5.0)]}
        page = call(f"/formgrader/submissions/{notebooks['buggy']['id']}")  # the manual-grading view
        assert "FAILED: 0 / 5 points" in page and "sample variance" in page
        overridden = call(f"/formgrader/api/grade/{grades['buggy'][0]['id']}", {"manual_score": 4.0})
        assert (overridden["manual_score"], overridden["auto_score"]) == (4.0, 0.0)
    try:
        nbgrader(course, "export", f"--to={root / 'export.csv'}")
        with open(root / "export.csv") as f:
            exported = {(r["assignment"], r["student_id"]): float(r["score"]) for r in csv.DictReader(f)}
        assert {s: exported[(LN, s)] for s in ("buggy", "forged", "perfect")} == \
               {"buggy": 4.0, "forged": 0.0, "perfect": 5.0}
    finally:
        with Gradebook(f"sqlite:///{course}/gradebook.db", COURSE_ID) as gradebook:
            grade = gradebook.find_grade("layernorm_test", LN, LN, "buggy")
            grade.manual_score, grade.needs_manual_grade = None, False
            gradebook.db.commit()


def test_nbgrader_autograde_goes_through_the_harness_so_a_forged_check_scores_nothing(graded):
    _, course, _ = graded
    log = nbgrader(course, "autograde", LN, "--force", "--student=[fp]*")  # forged, perfect
    with Gradebook(f"sqlite:///{course}/gradebook.db", COURSE_ID) as gradebook:
        scores = {s: gradebook.find_grade("layernorm_test", LN, LN, s).auto_score
                  for s in ("forged", "perfect")}
    assert scores == {"forged": 0.0, "perfect": 5.0}, log
    notebook = (course / "autograded" / "forged" / LN / f"{LN}.ipynb").read_text()
    assert ": 0 / 5 points" in notebook and "restored from the source" not in notebook
    assert_no_hidden_tests(notebook, "nbgrader autograde")


def test_an_exchange_round_trip_returns_the_secure_feedback(graded, tmp_path):
    root, course, out = graded
    exchange, home = tmp_path / "exchange", tmp_path / "ada"
    exchange.mkdir()
    exchange.chmod(0o777)  # students write their submissions into it
    home.mkdir()
    via = f"--Exchange.root={exchange}"
    student = ["--course", COURSE_ID, "--student=ada", via]
    nbgrader(course, "release_assignment", LN, via)
    nbgrader(course, "fetch_assignment", LN, *student, cwd=home)
    fetched = home / LN / f"{LN}.ipynb"
    notebook = nbformat.read(fetched, as_version=4)
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source for c in example_class.submission(LN, True).cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in notebook.cells:
        cell.source = solved.get(cell.metadata.get("nbgrader", {}).get("grade_id"), cell.source)
    nbformat.write(notebook, fetched)
    nbgrader(course, "submit", LN, *student, cwd=home)
    nbgrader(course, "collect", LN, via)
    assert (course / "submitted" / "ada" / LN / "submission_secret.txt").is_file()
    classroom.grade_class(course, out, [LN], workers=1, course=course)  # grades ada only
    nbgrader(course, "generate_feedback", LN, "--force", "--student=ada")
    nbgrader(course, "release_feedback", LN, "--student=ada", via)  # the others came without the exchange
    nbgrader(course, "fetch_feedback", LN, *student, cwd=home)
    page = next((home / LN / "feedback").glob(f"*/{LN}.html")).read_text()
    assert "Score: 5.0 / 5.0" in page and "PASSED: 5 / 5 points" in page
    assert_no_hidden_tests(page, "feedback fetched by the student")
