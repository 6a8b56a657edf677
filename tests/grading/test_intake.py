"""Intake: every file of a submissions folder is graded or reported, and nothing graded is lost.

Each case builds its own small class of notebook 01 (about 7 s to grade). Finding submissions
needs no kernel; the cases that grade run the real pipeline (`python -m graders.harness.classroom`).
"""
import json
import os
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from graders.course import example_class
from graders.course.notebooks import ROOT
from graders.harness import classroom
from graders.harness.intake import discover

pytestmark = pytest.mark.xdist_group("intake")
LN = "01_layernorm"


def _notebook(student="perfect", name=LN):
    return nbformat.writes(example_class.students()[student][name])


def _handed_in_by(student, buggy=False):
    """The perfect (or the buggy) student's notebook with a line of the student's own: a file
    nobody else hands in (students with the very same file are graded in one grading:
    graders.harness.classroom)."""
    notebook = example_class.submission(LN, True, example_class.BUGS if buggy else ())
    notebook.cells.append(nbformat.v4.new_markdown_cell(f"Handed in by {student}."))
    return nbformat.writes(notebook)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_corrupt_zip_costs_only_its_student_and_stray_files_are_listed(tmp_path):
    _write(tmp_path / "alice" / f"{LN}.ipynb", _notebook())
    (tmp_path / "bob.zip").write_bytes(b"PK\x03\x04 this is not really a zip archive")
    (tmp_path / "README.txt").write_text("grading instructions")
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    _write(tmp_path / f"{LN}.ipynb", _notebook())  # loose, and no student's name on it
    found = discover(tmp_path, [LN], tmp_path / "unpacked")
    assert sorted(found.submissions) == ["alice", "bob"]
    assert found.submissions["alice"][LN].path.name == f"{LN}.ipynb"
    bob = found.submissions["bob"][LN]
    assert bob.path is None and "bob.zip: could not be opened (BadZipFile" in bob.notes[0]
    assert [line.split(":")[0] for line in found.ignored] == [".DS_Store", f"{LN}.ipynb", "README.txt",
                                                              "bob.zip"]
    assert "belongs to no student" in found.ignored[1]


def test_lms_downloads_are_graded_as_their_students_notebooks(tmp_path):
    _write(tmp_path / f"ada_lovelace_{LN}.ipynb", _notebook())
    _write(tmp_path / f"grace_{LN} (1).ipynb", _notebook("buggy"))
    _write(tmp_path / "grace_scratch.ipynb", _notebook())
    found = discover(tmp_path, None, tmp_path / "unpacked")
    assert sorted(found.submissions) == ["ada_lovelace", "grace"]
    assert found.submissions["ada_lovelace"][LN].label == f"ada_lovelace_{LN}.ipynb"
    grace = found.submissions["grace"][LN]
    assert grace.label == f"grace_{LN} (1).ipynb" and "renamed" in grace.notes[0]
    assert len(found.ignored) == 1 and found.ignored[0].startswith("grace_scratch.ipynb: a loose notebook")


def test_duplicate_copies_say_which_one_was_graded(tmp_path):
    _write(tmp_path / "alice" / f"{LN}.ipynb", _notebook("untouched"))
    _write(tmp_path / "alice" / f"{LN}-Copy1.ipynb", _notebook())
    _write(tmp_path / "alice" / "old" / "my layernorm.ipynb", _notebook())  # recognised by its cells
    found = discover(tmp_path, [LN], tmp_path / "unpacked")
    alice = found.submissions["alice"][LN]
    assert alice.label == f"alice/{LN}.ipynb"
    assert alice.notes == [f"3 copies of {LN}.ipynb were handed in: graded alice/{LN}.ipynb; not graded: "
                           f"alice/{LN}-Copy1.ipynb, alice/old/my layernorm.ipynb"]
    assert found.ignored == []


def test_a_renamed_notebook_is_not_mistaken_for_another_by_their_shared_setup_cell(tmp_path):
    _write(tmp_path / "alice" / "notebook (2).ipynb", _notebook(name="02_embeddings"))
    found = discover(tmp_path, [LN, "02_embeddings"], tmp_path / "unpacked")
    assert found.submissions["alice"][LN].path is None
    assert found.submissions["alice"]["02_embeddings"].label == "alice/notebook (2).ipynb"


def test_a_class_given_two_notebooks_is_not_marked_missing_on_the_others(tmp_path):
    for student in ("alice", "bob"):
        for name in (LN, "03_attention"):
            _write(tmp_path / "submitted" / student / name / f"{name}.ipynb", _notebook(name=name))
    (tmp_path / "submitted" / "bob" / LN / f"{LN}.ipynb").unlink()
    found = discover(tmp_path, None, tmp_path / "unpacked")
    assert found.names == [LN, "03_attention"]
    assert found.submissions["bob"][LN].notes == [f"{LN}.ipynb is missing from the submission"]


def test_a_corrupt_notebook_reports_that_one_fact(tmp_path):
    _write(tmp_path / "carol" / f"{LN}.ipynb", '{"cells": [')
    submission = discover(tmp_path, [LN], tmp_path / "unpacked").submissions["carol"][LN]
    done = classroom.grade_task(submission, None)
    assert done["entry"]["flags"] == [f"carol/{LN}.ipynb could not be read as a notebook (NotJSONError: "
                                      "Notebook does not appear to be JSON: '{\"cells\": [')"]
    assert [c["points"] for c in done["entry"]["cells"]] == [0.0] and done["feedback"] is None
    assert "not graded: carol/" in done["entry"]["cells"][0]["message"]


def _grade_command(submissions, out):
    return [sys.executable, "-m", "graders.harness.classroom", "--submissions", str(submissions),
            "--out", str(out), "--plain", "--workers", "1", "--notebooks", LN]


@pytest.mark.slow
def test_an_interrupted_run_keeps_its_work_resumes_and_merges_a_second_batch(tmp_path):
    first, late, out = tmp_path / "first", tmp_path / "late", tmp_path / "out"
    # Six students graded one at a time, so that work is left when the Ctrl-C comes, even on a
    # busy machine where this process wakes late (with three, all were once done before it).
    students = ("alice", "bob", "carol", "erin", "frank", "grace")
    for student in students:
        _write(first / student / f"{LN}.ipynb", _handed_in_by(student, buggy=student == "bob"))
    # Ctrl-C as at an instructor's terminal: a test suite started in the background (as CI may be)
    # inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
    run = subprocess.Popen(_grade_command(first, out), cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:  # Ctrl-C after the first notebook
            results = out / "results.json"
            if results.exists() and any(e["submission"] for e in json.loads(results.read_text())):
                break
            time.sleep(0.5)
        os.killpg(run.pid, signal.SIGINT)
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130 and "run the same command again to resume" in output, output
    interrupted = {e["student"]: e for e in json.loads((out / "results.json").read_text())}
    finished = [s for s, e in interrupted.items() if e["submission"]]
    assert 1 <= len(finished) < len(students)
    assert "now: " in output and f"/{LN}" in output  # the progress display names the notebook in flight

    resumed = subprocess.run(_grade_command(first, out), cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{len(students) - len(finished)} to grade, {len(finished)} unchanged since the last run" in resumed.stdout
    after = {e["student"]: e for e in json.loads((out / "results.json").read_text())}
    for student in finished:  # not graded again: same entry, same seconds
        assert after[student] == interrupted[student]
    assert all(e["seconds"] > 0 for e in after.values())
    shown = output if "bob" in finished else resumed.stdout  # the failed tests so far, and where
    assert "failed tests so far: 1 (last: bob/01_layernorm)" in shown

    _write(late / "dave" / f"{LN}.ipynb", _notebook())
    _write(late / "bob" / f"{LN}.ipynb", _notebook())  # bob resubmits, fixed
    merged = subprocess.run(_grade_command(late, out), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "2 to grade, 0 unchanged" in merged.stdout
    rows = (out / "grades.csv").read_text().splitlines()
    assert rows[1:] == [f"{student},5,5,5" for student in sorted((*students, "dave"))]
    assert json.loads((out / "results.json").read_text())[0] == after["alice"]


def test_a_missing_notebook_is_reported_and_costs_no_grading(tmp_path):
    _write(tmp_path / "class" / "alice" / "03_attention.ipynb", _notebook(name="03_attention"))
    out = tmp_path / "out"
    classroom.grade_class(tmp_path / "class", out, [LN])  # nothing to grade: no cluster is started
    assert (out / "grades.csv").read_text().splitlines()[1] == "alice,0,0,5"
    report = (out / "reports" / "alice.txt").read_text()
    assert f"note: {LN}.ipynb is missing from the submission" in report
    assert f"layernorm_test: lost 5 (missing-notebook): {LN}.ipynb was not submitted" in report


def test_an_interrupt_stays_an_interrupt_when_dask_cannot_close_in_time(monkeypatch):
    """A Ctrl-C reaches the Dask workers too; closing the client after it can time out. The run
    still ends as interrupted (the command then says how to resume), not with the close's error."""
    from distributed import Client, LocalCluster

    def graded(submission, *args):
        return {"entry": {"student": submission.student, "notebook": submission.notebook, "cells": []}, "alike": []}

    def interrupted_while_saving(submission, done):
        raise KeyboardInterrupt

    def close_times_out(self, timeout=None):
        raise TimeoutError(f"timed out after {timeout} s.")

    monkeypatch.setattr(classroom, "grade_task", graded)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster:
        with monkeypatch.context() as patched:
            patched.setattr(Client, "close", close_times_out)
            with pytest.raises(KeyboardInterrupt):
                classroom._grade_on_cluster([classroom.Submission("alice", LN)], None, 1,
                                            cluster.scheduler_address, interrupted_while_saving)
