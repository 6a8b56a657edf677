"""A grader that cannot confine the learners' kernels (no user namespaces for bubblewrap) is told
so once, at the start of grading, with what that exposes and how to confine them."""
from graders.harness import classroom
from graders.integrity import host


def test_an_unconfined_grading_says_so_at_the_start(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(host, "confinement_unavailable", lambda: "bubblewrap cannot make its namespaces here (x)")
    monkeypatch.setattr(classroom, "grade_class", lambda *args, **kwargs: [])
    classroom.main(["--submissions", str(tmp_path), "--out", str(tmp_path / "out"), "--plain"])
    said = capsys.readouterr().err
    assert said.startswith("NOT CONFINED: bubblewrap cannot make its namespaces here (x). Learner code "
                           "will run with your own file access"), said
    assert "enable them (`sysctl -w user.max_user_namespaces=15000`" in said, said


def test_a_confined_grading_says_nothing_of_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(host, "confinement_unavailable", lambda: None)
    monkeypatch.setattr(classroom, "grade_class", lambda *args, **kwargs: [])
    classroom.main(["--submissions", str(tmp_path), "--out", str(tmp_path / "out"), "--plain"])
    assert "NOT CONFINED" not in capsys.readouterr().err


def test_a_machine_without_libseccomp_is_named_and_its_kernels_still_start(monkeypatch):
    """A grading kernel starts no program (a seccomp filter, graders.integrity.sandbox_kernel): where
    libseccomp cannot be loaded, the probe says so and how to install it, so grading says NOT
    CONFINED at its start, and an unconfined kernel starts without the filter."""
    import sys

    from graders.integrity import sandbox_kernel

    monkeypatch.setitem(sys.modules, "pyseccomp", None)   # its import fails, as without libseccomp
    assert "libseccomp cannot be loaded" in sandbox_kernel.probe()
    assert "apt install libseccomp2" in sandbox_kernel.probe()
    sandbox_kernel.forbid_exec()   # returns: no filter, no error
