"""A grader that cannot confine the learners' kernels (not root, no namespaces) is told so once,
at the start of grading, with what that exposes and how to confine them (issue 37)."""
from graders.harness import classroom, sandbox


def test_an_unconfined_grading_says_so_at_the_start(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sandbox, "confinement_unavailable", lambda: "the grader does not run as root")
    monkeypatch.setattr(classroom, "grade_class", lambda *args, **kwargs: [])
    classroom.main(["--submissions", str(tmp_path), "--out", str(tmp_path / "out"), "--plain"])
    said = capsys.readouterr().err
    assert said.startswith("NOT CONFINED: the grader does not run as root. Learner code will run with "
                           "your own file access"), said
    assert "grade as root (sudo make grade ...) or inside a container" in said, said


def test_a_confined_grading_says_nothing_of_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sandbox, "confinement_unavailable", lambda: None)
    monkeypatch.setattr(classroom, "grade_class", lambda *args, **kwargs: [])
    classroom.main(["--submissions", str(tmp_path), "--out", str(tmp_path / "out"), "--plain"])
    assert "NOT CONFINED" not in capsys.readouterr().err
