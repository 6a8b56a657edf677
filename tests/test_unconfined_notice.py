"""A grader that cannot confine the learners' kernels (no user namespaces for bubblewrap) is told
so once, at the start of grading, with what that exposes and how to confine them (issues 37, 43)."""
from graders.harness import classroom, sandbox


def test_an_unconfined_grading_says_so_at_the_start(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sandbox, "confinement_unavailable", lambda: "bubblewrap cannot make its namespaces here (x)")
    monkeypatch.setattr(classroom, "grade_class", lambda *args, **kwargs: [])
    classroom.main(["--submissions", str(tmp_path), "--out", str(tmp_path / "out"), "--plain"])
    said = capsys.readouterr().err
    assert said.startswith("NOT CONFINED: bubblewrap cannot make its namespaces here (x). Learner code "
                           "will run with your own file access"), said
    assert "enable them (`sysctl -w user.max_user_namespaces=15000`" in said, said


def test_a_confined_grading_says_nothing_of_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sandbox, "confinement_unavailable", lambda: None)
    monkeypatch.setattr(classroom, "grade_class", lambda *args, **kwargs: [])
    classroom.main(["--submissions", str(tmp_path), "--out", str(tmp_path / "out"), "--plain"])
    assert "NOT CONFINED" not in capsys.readouterr().err
