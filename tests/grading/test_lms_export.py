"""Grades for the LMS: nbgrader export plugins write Canvas's and Moodle's import layouts, from
nbgrader's gradebook, an instructor's override included."""
import csv
import subprocess
import sys

import pytest
from nbgrader.api import Gradebook

from graders.course.notebooks import ROOT, venv_env

COURSE_ID = "gpt2-from-scratch"
PLUGINS = "graders.harness.lms_export"
# Canvas's gradebook CSV (Canvas guides, "How do I import grades in the Gradebook?"): the
# student columns first, one column per assignment, a second row of points possible.
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
# Moodle's grade import CSV (Moodle docs, "Grade import"): a header row, a column identifying
# the user (ID number or Email address), one column per grade item.
MOODLE_HEADER = ["First name", "Last name", "ID number", "Email address"]


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course of two assignments: ada handed in both (a test cell of 01 overridden from 0 to 4
    in formgrader, 03 late by one point's penalty); bob handed in only 01."""
    monkeypatch.setenv("PATH", venv_env()["PATH"])   # a new gradebook runs `alembic`
    with Gradebook(f"sqlite:///{tmp_path}/gradebook.db", COURSE_ID) as gradebook:
        for name, cells in (("01_layernorm", {"layernorm_test": 5}),
                            ("03_attention", {"mask_test": 2, "attention_test": 8})):
            gradebook.add_assignment(name)
            gradebook.add_notebook(name, name)
            for cell, points in cells.items():
                gradebook.add_grade_cell(cell, name, name, max_score=points, cell_type="code")
        gradebook.add_student("ada", first_name="Ada", last_name="Lovelace", email="ada@example.org",
                              lms_user_id="1001")
        gradebook.add_student("bob", first_name="Bob", last_name="Byron", email="bob@example.org")
        for student, assignment, scores in (("ada", "01_layernorm", {"layernorm_test": 0}),
                                            ("ada", "03_attention", {"mask_test": 2, "attention_test": 8}),
                                            ("bob", "01_layernorm", {"layernorm_test": 5})):
            gradebook.add_submission(assignment, student)
            for cell, score in scores.items():
                gradebook.find_grade(cell, assignment, assignment, student).auto_score = score
        gradebook.find_grade("layernorm_test", "01_layernorm", "01_layernorm", "ada").manual_score = 4.0
        late = gradebook.find_submission_notebook("03_attention", "03_attention", "ada")
        late.late_submission_penalty = 1.0
        gradebook.db.commit()
    return tmp_path


def export(course, exporter: str, *options) -> list[list[str]]:
    """`nbgrader export --exporter=...` as an instructor runs it, and the rows it wrote."""
    out = course / f"{exporter}.csv"
    done = subprocess.run([sys.executable, "-m", "nbgrader", "export", f"--exporter={PLUGINS}.{exporter}",
                           f"--to={out}", *options], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(venv_env(), GPT2_COURSE_NBGRADER_ROOT=str(course)))
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_canvas_csv_has_canvas_columns_a_points_possible_row_and_the_overridden_scores(course):
    rows = export(course, "CanvasExporter")
    assert rows[0] == CANVAS_HEADER + ["01_layernorm", "03_attention"]
    assert rows[1] == ["    Points Possible", "", "", "", "", "5", "10"]
    assert rows[2:] == [["Byron, Bob", "", "", "bob", "", "5", "0"],
                        ["Lovelace, Ada", "1001", "", "ada", "", "4", "9"]]
    assert all(len(row) == len(rows[0]) for row in rows)


def test_moodle_csv_has_an_identifying_column_and_one_column_per_grade_item(course):
    rows = export(course, "MoodleExporter")
    assert rows == [MOODLE_HEADER + ["01_layernorm", "03_attention"],
                    ["Bob", "Byron", "bob", "bob@example.org", "5", "0"],
                    ["Ada", "Lovelace", "ada", "ada@example.org", "4", "9"]]


def test_an_export_keeps_only_the_assignments_and_students_asked_for(course):
    rows = export(course, "MoodleExporter", "--assignment=03_attention", "--student=ada")
    assert rows == [MOODLE_HEADER + ["03_attention"], ["Ada", "Lovelace", "ada", "ada@example.org", "9"]]
