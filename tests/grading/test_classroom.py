"""The instructor pipeline end to end: example class -> autograde -> reports, feedback, CSV."""
import csv
import itertools
import json
import re
import zipfile

import nbformat
import pytest

from graders.course import example_class
from graders.course.notebooks import notebook_names
from graders.exercises import declaration
from graders.harness import classroom, grading
from graders.harness.cells import hidden_source

# The grades each bundled student must get, per test cell (the specification of the example
# class). The cells and their points come from the source notebooks, the one list of notebooks;
# what the buggy student's classic mistake costs comes from each notebook's declaration.
NAMES = [n for n in notebook_names() if grading.test_cells(grading.source_notebook(n))]
FULL = {f"{name}/{cell.metadata.nbgrader.grade_id}": cell.metadata.nbgrader.points
        for name in NAMES for cell in grading.test_cells(grading.source_notebook(name))}
BUGS = {name: declaration(name).example_bug for name in NAMES}
NONE = {cell: 0 for cell in FULL}
NOT_HANDED_IN_BY_CRASHER = [cell for cell in FULL if cell.split("/")[0] > example_class.CRASHER_STOPS_AFTER]
EXPECTED = {
    "perfect": FULL,
    "untouched": NONE,
    "partial": {cell: points if cell[:2] <= "03" else 0 for cell, points in FULL.items()},
    "buggy": {**FULL, **{f"{name}/{cell}": 0 for name in NAMES for cell in BUGS[name].costs}},
    "crasher": {**FULL, "03_attention/attention_test": 0, **{cell: 0 for cell in NOT_HANDED_IN_BY_CRASHER}},
}
# The tests of the graded example class (conftest's graded_example_class) run on one pytest-xdist
# worker, which grades it once.
ONE_GRADING = pytest.mark.xdist_group("classroom")


def test_every_declared_example_bug_costs_test_cells_of_its_own_notebook():
    for name, bug in BUGS.items():
        assert bug.costs and set(bug.costs) <= {c.split("/")[1] for c in FULL if c.startswith(name + "/")}, name


def _rows(out):
    with open(out / "grades.csv") as f:
        return {row.pop("student"): row for row in csv.DictReader(f)}


@ONE_GRADING
@pytest.mark.slow
def test_each_example_student_gets_exactly_the_expected_grade_per_test_cell(graded_example_class):
    rows = _rows(graded_example_class)
    assert sorted(rows) == sorted(EXPECTED)
    for student, cells in EXPECTED.items():
        got = {cell: float(rows[student][cell]) for cell in cells}
        assert got == {cell: float(points) for cell, points in cells.items()}, student
        assert float(rows[student]["total"]) == sum(cells.values())
        assert float(rows[student]["max"]) == sum(FULL.values())


@ONE_GRADING
@pytest.mark.slow
def test_students_with_the_same_file_are_graded_once_each_with_pages_of_their_own(graded_example_class):
    """The partial student's 01-03 are the perfect student's files and its 04-13 the untouched
    one's; the crasher's 01, 02 and 04-06 are the perfect student's: one grading each, named in
    results.json, every student still with a feedback page of their own."""
    entries = json.loads((graded_example_class / "results.json").read_text())
    by_file = {}
    for entry in entries:
        if entry.get("submission"):
            by_file.setdefault((entry["notebook"], entry["submission"]["sha256"]), []).append(entry)
    shared = {(name, tuple(sorted(e["student"] for e in group)))
              for (name, _), group in by_file.items() if len(group) > 1}
    assert {("01_layernorm", ("crasher", "partial", "perfect")), ("04_mlp", ("crasher", "perfect")),
            ("13_post_training", ("partial", "untouched"))} <= shared
    assert not any(student == "buggy" for _, students in shared for student in students)
    for group in by_file.values():
        students = sorted(e["student"] for e in group)
        for entry in group:
            assert entry.get("same_file_as", []) == ([s for s in students if s != entry["student"]]
                                                      if len(group) > 1 else []), entry["student"]
            assert (entry["cells"], entry["seconds"]) == (group[0]["cells"], group[0]["seconds"])
            assert (graded_example_class / entry["feedback"]).is_file()
    pages = {e["feedback"] for group in by_file.values() for e in group}
    assert len(pages) == sum(len(group) for group in by_file.values())


@ONE_GRADING
@pytest.mark.slow
def test_reports_say_why_each_point_was_lost(graded_example_class):
    reports = graded_example_class / "reports"
    buggy = (reports / "buggy.txt").read_text()
    for name, bug in BUGS.items():
        assert bug.named in buggy, (name, bug.named)
    crasher = (reports / "crasher.txt").read_text()
    lost = FULL["03_attention/attention_test"]
    assert f"attention_test: lost {lost:g} (crashed)" in crasher, crasher
    missing = [cell.split("/")[1] for cell in NOT_HANDED_IN_BY_CRASHER]
    assert re.findall(r"- (\w+): lost", crasher) == ["attention_test", *missing], crasher
    assert "07_training.ipynb was not submitted" in crasher, crasher
    assert "not written yet" in (reports / "untouched.txt").read_text()


@ONE_GRADING
@pytest.mark.slow
def test_feedback_shows_verdicts_but_never_hidden_test_code(graded_example_class):
    hidden_lines = set()
    for name in NAMES:
        for cell in grading.test_cells(grading.source_notebook(name)):
            hidden_lines |= {line.strip() for line in hidden_source(cell).splitlines() if line.strip()}
    assert hidden_lines
    pages = sorted((graded_example_class / "feedback").rglob("*.html"))
    handed_in = sum(name in notebooks for notebooks in example_class.students().values() for name in NAMES)
    assert len(pages) == handed_in   # a page per notebook handed in
    for page in pages:
        html = page.read_text()
        assert "HIDDEN TESTS" not in html, page
        leaked = [line for line in hidden_lines if line in html]
        assert not leaked, (page, leaked)
    assert "PASSED: 5 / 5 points" in (graded_example_class / "feedback/perfect/01_layernorm.html").read_text()


@ONE_GRADING
@pytest.mark.slow
def test_the_same_notebook_handed_in_by_two_students_gets_the_same_verdicts_and_page(graded_example_class):
    """Students who hand in the same notebook (the perfect and the crasher student 01-06 but 03;
    the untouched and partial student 04-13): graded in one two-worker run, wherever and whenever
    the scheduler put each, every such pair gets the same verdicts, messages, flags and feedback
    page. 07's graded training runs are graded once here (the perfect student's)."""
    students = example_class.students()
    pairs = [(name, first, second) for name in NAMES for first, second in itertools.combinations(students, 2)
             if name in students[first] and students[first][name] == students[second].get(name)]
    perfect_crasher = [name for name, *pair in pairs if pair == ["perfect", "crasher"]]
    assert perfect_crasher == [name for name in NAMES if name <= example_class.CRASHER_STOPS_AFTER and
                               name != "03_attention"]
    assert {tuple(pair) for name, *pair in pairs if name > example_class.CRASHER_STOPS_AFTER} == \
        {("untouched", "partial")}
    entries = {(e["student"], e["notebook"]): e
               for e in json.loads((graded_example_class / "results.json").read_text())}
    for name, *pair in pairs:
        verdicts = [{k: entries[student, name][k] for k in ("cells", "flags", "notes")} for student in pair]
        assert verdicts[0] == verdicts[1], (name, pair)
        pages = [(graded_example_class / "feedback" / student / f"{name}.html").read_text() for student in pair]
        assert pages[0] == pages[1], (name, pair)


def _graded(out, student: str) -> dict:
    """What a class grading wrote of `student`, by notebook: the results entry without the seconds
    it took and the class-wide copy notes (the one field that varies, and the one that depends on
    the classmates graded with it), the report's section without those notes, the feedback page,
    and grades.csv's cells."""
    entries = {e["notebook"]: e for e in json.loads((out / "results.json").read_text()) if e["student"] == student}
    report = (out / "reports" / f"{student}.txt").read_text()
    row = _rows(out)[student]
    graded = {}
    for name, entry in entries.items():
        assert entry.pop("seconds") > 0
        copies = {f"  note: {note}" for note in entry.pop("copies", [])}
        section = report.split(f"\n{name}: ", 1)[1].split("\n\n", 1)[0]
        graded[name] = (entry, [line for line in section.splitlines() if line not in copies],
                        (out / "feedback" / student / f"{name}.html").read_text(),
                        {cell: value for cell, value in row.items() if cell.startswith(name + "/")})
    return graded


@ONE_GRADING
@pytest.mark.slow
def test_one_worker_in_the_reverse_order_writes_what_the_class_run_wrote(graded_example_class, tmp_path,
                                                                         monkeypatch):
    """Determinism: the buggy student's notebooks (each with its notebook's example mistake),
    graded again alone on one worker in the reverse order, get what the two-worker run of the
    whole class wrote for them: results, report, feedback pages, grades. Its 07 here answers only
    the quick exercises (no test grades 07's training runs twice), so it is left out of the
    comparison; its quick checks pass after 08 on the same worker (the order
    test_one_worker_judges_08_with_its_own_graders_after_07 does not run)."""
    submissions = tmp_path / "class"
    for name, notebook in example_class.students()["buggy"].items():
        target = submissions / "submitted" / "buggy" / name / f"{name}.ipynb"   # as write()
        target.parent.mkdir(parents=True)
        nbformat.write(_quick_07() if name == "07_training" else notebook, target)
    plan = classroom._plan
    monkeypatch.setattr(classroom, "_plan", lambda *args: plan(*args)[::-1])
    out = tmp_path / "one-worker-reversed"
    classroom.grade_class(submissions, out, NAMES, workers=1, scheduler=None, limits=grading.TimeLimits())
    alone, in_class = _graded(out, "buggy"), _graded(graded_example_class, "buggy")
    assert sorted(alone) == sorted(in_class) == sorted(NAMES)
    quick = alone.pop("07_training")[0]["cells"]
    assert {c["grade_id"]: c["status"] for c in quick if c["grade_id"].replace("_test", "_answer") in QUICK_07} \
        == {answer.replace("_answer", "_test"): "passed" for answer in QUICK_07}
    for name in alone:
        assert alone[name] == in_class[name], name


@pytest.mark.slow
def test_regrading_locally_and_on_a_dask_scheduler_gives_identical_results(tmp_path):
    from distributed import LocalCluster

    submissions = tmp_path / "class"
    for student in ("perfect", "buggy"):
        folder = submissions / student
        folder.mkdir(parents=True)
        notebook = example_class.students()[student]["01_layernorm"]
        nbformat.write(notebook, folder / "01_layernorm.ipynb")
    outputs = []
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        for scheduler in (None, cluster.scheduler_address):
            out = tmp_path / f"out{len(outputs)}"
            classroom.grade_class(submissions, out, ["01_layernorm"], workers=2,
                                  scheduler=scheduler, limits=grading.TimeLimits())
            timed = json.loads((out / "results.json").read_text())
            assert all(entry.pop("seconds") > 0 for entry in timed)  # the only field that varies
            outputs.append(((out / "grades.csv").read_text(), timed,
                            (out / "reports" / "buggy.txt").read_text()))
    assert outputs[0] == outputs[1]
    assert "perfect,5,5,5" in outputs[0][0] and "buggy,0,0,5" in outputs[0][0]


QUICK_07 = ("groups_answer", "lr_answer")


def _quick_07():
    """Notebook 07 with only its two quick exercises answered: its training cells fail at once,
    so the notebook grades in seconds."""
    notebook = example_class.submission("07_training", False)
    answers = example_class.solution_answers("07_training")
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in QUICK_07:
            cell.source = answers[grade_id]
    return notebook


@pytest.mark.slow
def test_one_worker_judges_08_with_its_own_graders_after_07(tmp_path):
    """A long-lived worker that judged one notebook must judge the next with that notebook's
    own graders (07 and 08 once both graded a `generate`, and the one imported last judged
    both: a perfect student lost 5 points). One worker grades 07, then 08; the other order is
    test_one_worker_in_the_reverse_order_writes_the_same_files_as_two_workers's."""
    submissions = tmp_path / "class"
    for student, name, notebook in (("a", "07_training", _quick_07()),
                                    ("b", "08_sampling", example_class.submission("08_sampling", True))):
        (submissions / student).mkdir(parents=True)
        nbformat.write(notebook, submissions / student / f"{name}.ipynb")
    out = tmp_path / "out"
    classroom.grade_class(submissions, out, None, workers=1, scheduler=None, limits=grading.TimeLimits())
    entries = json.loads((out / "results.json").read_text())   # graded in the plan's order: a's, then b's
    cells = {(e["notebook"], c["grade_id"]): (c["points"], c["status"]) for e in entries for c in e["cells"]
             if c["status"] != "missing-notebook"}
    assert all(cells[("07_training", answer.replace("_answer", "_test"))] ==
               (FULL[f"07_training/{answer.replace('_answer', '_test')}"], "passed") for answer in QUICK_07)
    assert all(cells[("08_sampling", cell.split("/")[1])] == (points, "passed")
               for cell, points in FULL.items() if cell.startswith("08_"))


def _notebook_bytes(student, name="01_layernorm"):
    return nbformat.writes(example_class.students()[student][name]).encode()


def test_plain_zip_renamed_and_missing_submissions_are_found_and_reported(tmp_path):
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "01_layernorm.ipynb").write_bytes(_notebook_bytes("perfect"))
    with zipfile.ZipFile(tmp_path / "bob.zip", "w") as archive:
        archive.writestr("bob/work/01_layernorm.ipynb", _notebook_bytes("buggy"))
        archive.writestr("../escape.ipynb", _notebook_bytes("buggy"))
    (tmp_path / "carol").mkdir()
    (tmp_path / "carol" / "layernorm (1).ipynb").write_bytes(_notebook_bytes("perfect"))
    (tmp_path / "dave").mkdir()
    found = classroom.discover(tmp_path, ["01_layernorm"], tmp_path / "unpacked").submissions
    assert sorted(found) == ["alice", "bob", "carol", "dave"]
    assert found["alice"]["01_layernorm"].path.name == "01_layernorm.ipynb"
    assert found["bob"]["01_layernorm"].label == "bob.zip:bob/work/01_layernorm.ipynb"
    assert not (tmp_path / "escape.ipynb").exists() and not (tmp_path / "unpacked" / "escape.ipynb").exists()
    carol = found["carol"]["01_layernorm"]
    assert carol.path.name == "layernorm (1).ipynb" and "renamed" in carol.notes[0]
    dave = found["dave"]["01_layernorm"]
    assert dave.path is None and "missing" in dave.notes[0]


def test_deleted_or_edited_locked_cells_are_restored_from_the_source():
    source = grading.source_notebook("01_layernorm")
    submission = example_class.students()["perfect"]["01_layernorm"]
    tests = [c for c in submission.cells if grading.is_test_cell(c)]
    submission.cells.remove(tests[0])
    setup = next(c for c in submission.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    setup.source = "import math\nmath.isclose = lambda *a, **k: True"
    restored, flags = grading.restore(submission, source)
    assert any("layernorm_test was deleted" in f for f in flags)
    assert any("setup was edited" in f for f in flags)
    restored_tests = [c for c in restored.cells if grading.is_test_cell(c)]
    assert [c.source for c in restored_tests] == [c.source for c in grading.test_cells(source)]
    assert "isclose" not in json.dumps([c.source for c in restored.cells])


def test_expected_checks_are_listed_without_running_learner_code():
    from graders.harness.manifest import checks_of

    cell = grading.test_cells(grading.source_notebook("01_layernorm"))[0]
    listed = checks_of(cell.source)
    assert [key for key, _ in listed] == [("01_layernorm", "LayerNorm")] * 4
    assert listed[1][1]["block"] == 7 and listed[1][1]["batch"] == 3 and listed[1][1]["text"] is None
    assert listed[3][1]["layer_norm_eps"] == 1e-3 and listed[0][1]["layer_norm_eps"] is None


def test_release_writes_student_notebooks_without_solutions_or_hidden_tests(tmp_path):
    from graders.course.notebooks import main as notebooks_main

    assert notebooks_main(["release", str(tmp_path)]) == 0
    released = sorted(tmp_path.glob("release/*/*.ipynb"))
    assert [p.stem for p in released] == [p.parent.name for p in released] and len(released) >= 7
    for path in released:
        text = path.read_text()
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text, path


@pytest.mark.slow
def test_learner_check_summarises_each_test_cell(tmp_path, capsys):
    from graders.harness.check import check

    solved = tmp_path / "01_layernorm.ipynb"
    nbformat.write(example_class.students()["perfect"]["01_layernorm"], solved)
    assert check(solved) == 0
    assert "pass layernorm_test (5 points)" in capsys.readouterr().out
    buggy = tmp_path / "buggy.ipynb"
    nbformat.write(example_class.students()["buggy"]["01_layernorm"], buggy)
    assert check(buggy) == 1
    out = capsys.readouterr().out
    assert "FAIL layernorm_test (5 points)" in out and "sample variance" in out


@pytest.mark.slow
def test_run_solutions_saves_each_executed_notebook_with_html_and_reports_failures(tmp_path, capsys, monkeypatch):
    from graders.course import notebooks

    names = ["00_tour", "01_layernorm"]
    assert notebooks.main(["run-solutions", str(tmp_path / "ok"), *names]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["[1/2] 00_tour", "[2/2] 01_layernorm"]
    assert all(": ok in " in line for line in lines)
    for name in names:
        executed = nbformat.read(tmp_path / "ok" / f"{name}.ipynb", as_version=4)
        assert all(c.get("execution_count") for c in executed.cells if c.cell_type == "code"), name
        assert (tmp_path / "ok" / f"{name}.html").read_text().count("<html") == 1
    tests = grading.test_cells(nbformat.read(tmp_path / "ok" / "01_layernorm.ipynb", as_version=4))
    assert "correct on" in str(tests[0].outputs)
    # A solution that breaks is reported, its HTML still written, and the command fails.
    broken = tmp_path / "solutions"
    broken.mkdir()
    notebook = grading.source_notebook("01_layernorm")
    notebook.cells[[c.cell_type for c in notebook.cells].index("code")].source += "\nraise RuntimeError('boom')"
    nbformat.write(notebook, broken / "01_layernorm.ipynb")
    monkeypatch.setattr(notebooks, "SOLUTIONS", broken)
    assert notebooks.main(["run-solutions", str(tmp_path / "broken"), "01_layernorm"]) == 1
    out = capsys.readouterr().out
    assert "01_layernorm: FAILED (CellExecutionError)" in out and "1 solution notebook(s) failed" in out
    assert "boom" in (tmp_path / "broken" / "01_layernorm.html").read_text()
