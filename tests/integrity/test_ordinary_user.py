"""An instructor who is not root gets the same confinement and the same grades: the
example class graded as an ordinary user (uid 65534, no groups), on a notebook with no composite
and one whose composite's cell receives the course's part (graders.integrity.deliveries), with
cheat families handed in by other students of the same class (one class run: the
run builds a fresh course cache of its own, the longest part of it)."""
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from graders.course import example_class
from test_classroom import EXPECTED

NOBODY = 65534
NOTEBOOKS = ("01_layernorm", "04_mlp")   # 04: its MLP check's cell receives the course's gelu_new
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("nobody"),
              pytest.mark.skipif(os.geteuid() != 0, reason="run as another user, the whole suite is that test")]


def _unreachable_ancestor(path: Path) -> Path | None:
    """The top-most folder above `path` that others cannot enter (/root for a Python under it)."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return parent
    return None


def _as_nobody(command: list[str], env: dict) -> subprocess.CompletedProcess:
    """`command` as uid 65534 with no groups. Python may live in a folder only root enters (here
    /root/.pyenv): in a mount namespace of this command alone, that folder is shown as a fresh one
    holding Python only."""
    python = Path(sys.base_prefix).resolve()
    hidden = _unreachable_ancestor(python)
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "env", "-i",
            *(f"{k}={v}" for k, v in env.items()), *command]
    if hidden is None:
        return subprocess.run(drop, capture_output=True, text=True, timeout=1500)
    stash = tempfile.mkdtemp(prefix="gpt2-python-")
    script = (f'mount --bind "{python}" "{stash}" && mount -t tmpfs -o mode=0755 tmpfs "{hidden}" && '
              f'mkdir -p "{python}" && mount --bind "{stash}" "{python}" && exec "$@"')
    try:
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *drop],
                              capture_output=True, text=True, timeout=1500)
    finally:
        os.rmdir(stash)


def _cheats() -> dict:
    """families, each a student handing in 01: the course's bytecode laundered, reached
    through a wrapper, taken with the profiler switched off, torch's kernel taken under a computed
    name, that kernel and torch's reference layer norm with every in-kernel watch switched off; and
    one handing in 04 whose gelu_new asks a worker Python started before the check."""
    import textwrap

    from test_answer_not_in_kernel import LAUNDERED, PROFILER_OFF, THROUGH_A_WRAPPER
    from test_integrity import with_forward
    from test_kernel_bans import FORMS, LAYERNORM_BY, REFERENCE_ROUTES, SWITCH_OFF, WORKER, answered
    from test_library_kernels import KERNEL_FORWARD

    forms = {"laundered": LAUNDERED, "wrapper": THROUGH_A_WRAPPER, "profileroff": PROFILER_OFF,
             "kernel": KERNEL_FORWARD}
    cheats = {student: ("01_layernorm", with_forward("01_layernorm", "layernorm_answer", forward))
              for student, forward in forms.items()}
    kernel = next(form for key, form in FORMS.items() if key[0] == "01_layernorm")
    for student, answer in (("watchesoff", textwrap.dedent(kernel)),
                            ("references", textwrap.dedent(REFERENCE_ROUTES["torch._refs"])
                             + textwrap.dedent(LAYERNORM_BY))):
        cheats[student] = ("01_layernorm", answered("01_layernorm", "layernorm_answer",
                                                    SWITCH_OFF.format(module="nb01") + answer))
    cheats["worker"] = ("04_mlp", answered("04_mlp", "gelu_answer", WORKER, solved=False))
    return cheats


@pytest.fixture(scope="session")
def graded_as_nobody():
    """The example class (notebooks 01 and 04) and the cheat families (01) graded in one class run
    as uid 65534: (grades.csv's rows by student, each cheat's report). Session-scoped: a module's
    fixture is made again when pytest-xdist runs another module's test between two of these."""
    work = Path(tempfile.mkdtemp(prefix="gpt2-ordinary-"))
    try:
        work.chmod(0o755)
        submissions = work / "class"
        example_class.write(submissions)
        for student, (name, notebook) in _cheats().items():
            target = submissions / "submitted" / student / name / f"{name}.ipynb"   # as write()
            target.parent.mkdir(parents=True)
            nbformat.write(notebook, target)
        for where in [work, *work.rglob("*")]:
            os.chown(where, NOBODY, NOBODY)
        env = {"PATH": os.environ["PATH"], "HOME": str(work), "GPT2_COURSE_CACHE": str(work / "cache"),
               "GPT2_COURSE_WEIGHTS": "synthetic", "OMP_NUM_THREADS": "1"}
        done = _as_nobody([sys.executable, "-m", "graders.harness.classroom", "--submissions", str(submissions),
                           "--out", str(work / "grading"), "--plain", "--workers", "2",
                           "--notebooks", *NOTEBOOKS], env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "NOT CONFINED" not in done.stderr, done.stderr[-3000:]
        with open(work / "grading" / "grades.csv") as f:
            rows = {row["student"]: row for row in csv.DictReader(f)}
        reports = {student: (work / "grading" / "reports" / f"{student}.txt").read_text() for student in _cheats()}
        yield rows, reports
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_example_class_graded_as_an_ordinary_user_gets_its_expected_grades(graded_as_nobody):
    rows, _ = graded_as_nobody
    for student, cells in EXPECTED.items():
        wanted = {cell: float(points) for cell, points in cells.items() if cell.split("/")[0] in NOTEBOOKS}
        assert {cell: float(rows[student][cell]) for cell in wanted} == wanted, student


def test_the_cheat_families_score_nothing_graded_as_an_ordinary_user(graded_as_nobody):
    """Each family loses the points of the exercise it answers, and its report names what it ran."""
    rows, reports = graded_as_nobody
    lost = {student: float(rows[student]["04_mlp/gelu_test" if student == "worker" else "01_layernorm/layernorm_test"])
            for student in reports}
    assert lost == dict.fromkeys(reports, 0.0)
    assert all("torch's own kernel for LayerNorm" in reports[s] for s in ("kernel", "watchesoff")), reports
    assert "native_layer_norm is taken out of this grading kernel" in reports["references"], reports["references"]
    assert all("graders/reference/components.py (LayerNorm.forward)" in reports[s]
               for s in ("laundered", "wrapper", "profileroff")), reports
