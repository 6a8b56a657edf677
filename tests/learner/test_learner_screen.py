"""What a learner's kernel shows: failed checks as diagnoses (never the graders' traceback),
passing checks with their points, demonstration cells that wait for unfinished exercises, a
progress line, and notebooks of untouched stubs that run to the end.

The notebooks run in the `python3` kernel, the one `make lab` gives learners, so that the
traceback IPython renders (through `CheckFailed._render_traceback_`) is exactly what JupyterLab
and nbgrader's Validate show.
"""
from __future__ import annotations

import re
import subprocess
import sys

import nbformat
import pytest

from graders.course.example_class import BUGS, submission
from graders.course.notebooks import EXERCISES, ROOT, notebook_names

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CRASH = ("01_layernorm", "layernorm_answer", "centred.pow(2).mean(dim=-1, keepdim=True)",
         "centred.pow(2).mean(dim=3, keepdim=True)")


def _run(notebook, tmp_path, allow_errors=True):
    """Execute `notebook` as JupyterLab's Run All does (a cell tagged raises-exception does not
    stop the run) in the python3 kernel."""
    from nbclient import NotebookClient

    NotebookClient(notebook, timeout=600, kernel_name="python3", allow_errors=allow_errors,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return notebook


def _errors(cell) -> list[list[str]]:
    return [[ANSI.sub("", line) for line in "\n".join(o.traceback).splitlines()]
            for o in cell.outputs if o.output_type == "error"]


def _stdout(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _test_cell(notebook, grade_id):
    return next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


@pytest.fixture(scope="session")
def layernorm_runs(tmp_path_factory):
    """01 with the classic bug, with a crash in the learner's forward, and solved."""
    folder = tmp_path_factory.mktemp("runs")
    return {kind: _run(submission("01_layernorm", solved=True, edits=edits), folder)
            for kind, edits in {"buggy": BUGS, "crash": [CRASH], "solved": []}.items()}


@pytest.mark.slow
def test_a_failed_check_shows_the_diagnosis_first_and_no_grader_line(layernorm_runs):
    cell = _test_cell(layernorm_runs["buggy"], "layernorm_test")
    [lines] = _errors(cell)
    assert lines[0].startswith("\N{BALLOT X} LayerNorm output") and "Likely mistake: sample variance" in lines[0]
    assert not [line for line in lines if "Hint:" in line or "Show the fix" in line], lines   # named: folded fix
    [fold] = [o for o in cell.outputs if o.output_type == "display_data" and "text/html" in o.data]
    assert fold.data["text/plain"] == "  Show the fix: variance = centred.pow(2).mean(dim=-1, keepdim=True)"
    assert fold.data["text/html"].startswith("<details><summary>Show the fix</summary>")
    assert not [line for line in lines if "graders/" in line or "File " in line or "Traceback" in line], lines
    assert len(lines) <= 6 and all(len(line) <= 100 for line in lines), lines
    [error] = [o for o in cell.outputs if o.output_type == "error"]
    assert error.ename == "CheckFailed" and cell.outputs[-1] is fold   # still an error (scores 0), the fold after it


@pytest.mark.slow
def test_a_crash_in_the_learners_code_shows_their_own_frame_only(layernorm_runs):
    [lines] = _errors(_test_cell(layernorm_runs["crash"], "layernorm_test"))
    text = "\n".join(lines)
    assert lines[0].startswith("\N{BALLOT X} LayerNorm raised IndexError"), text
    assert "IndexError raised in your code:" in text
    assert re.search(r"Cell In\[\d+\], line \d+, in forward", text), text
    assert "variance = centred.pow(2).mean(dim=3, keepdim=True)" in text
    assert "^^^" in text                              # the failing expression is pointed at
    assert "graders/" not in text and "site-packages" not in text and "torch/" not in text, text


@pytest.mark.slow
def test_a_passing_check_names_its_points_and_the_last_cell_sums_up(layernorm_runs):
    solved = layernorm_runs["solved"]
    assert "\N{CHECK MARK} LayerNorm: correct on the reference text (5/5 points)" in \
        _stdout(_test_cell(solved, "layernorm_test"))
    assert "Progress in 01_layernorm: 5 of 5 points: every check passes." in _stdout(solved.cells[-1])
    buggy_progress = _stdout(layernorm_runs["buggy"].cells[-1])
    assert "0 of 5 points. Still to do: LayerNorm (5 points, its check fails)." in buggy_progress


def test_the_rendering_keeps_the_learners_frames_and_drops_the_graders():
    from graders.judging.compare import CheckFailed
    from graders.judging.learner import run_learner
    from graders.judging.rendering import render

    namespace = {}
    exec(compile("def forward(x):\n    return x.mean(dim=7)\n", "/tmp/learner_cell.py", "exec"), namespace)
    import torch

    with pytest.raises(CheckFailed) as caught:
        run_learner("LayerNorm", namespace["forward"], torch.zeros(2, 3))
    lines = render(caught.value, color=False)
    assert lines[0].startswith("\N{BALLOT X} LayerNorm raised IndexError")
    assert any("/tmp/learner_cell.py, line 2, in forward" in line for line in lines), lines
    assert not [line for line in lines if "graders/" in line], lines


@pytest.mark.slow
def test_make_check_prints_the_diagnosis_as_the_notebook_does_without_a_tcp_warning(tmp_path):
    path = tmp_path / "01_layernorm.ipynb"
    nbformat.write(submission("01_layernorm", solved=True, edits=BUGS), path)
    run = subprocess.run([sys.executable, "-m", "graders.harness.check", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "FAIL layernorm_test (5 points)\n    \N{BALLOT X} LayerNorm output" in run.stdout, run.stdout
    assert "Likely mistake: sample variance" in run.stdout and "0 of 5 points" in run.stdout
    assert "    Show the fix: variance = centred.pow(2).mean(dim=-1, keepdim=True)" in run.stdout, run.stdout
    assert "graders/" not in run.stdout and "Traceback" not in run.stdout, run.stdout
    assert "without encryption" not in run.stdout + run.stderr, run.stderr
    # a whole notebook takes up to a minute: one line, rewritten in place, names the test cell it is on
    assert "  on test cell 1 of 1: layernorm_test ..." in run.stdout, run.stdout   # text=True reads \r as \n


@pytest.mark.slow
def test_make_check_skips_the_demonstrations_as_grading_does(tmp_path):
    """`make check` runs a notebook as the autograder will: the picture cell of a solved 01
    skips itself (it earns nothing, and computing it costs the check time)."""
    from graders.harness.cells import KERNEL_NAME
    from graders.harness.execute import run
    from graders.harness.limits import TimeLimits

    notebook = submission("01_layernorm", solved=True)
    notebook.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "sandbox", "language": "python"}
    assert not run(notebook, None, tmp_path, TimeLimits(), demonstrations=False)
    pictures = [c for c in notebook.cells if "picture" in c.metadata.get("tags", [])]
    outputs = [o for c in pictures for o in c.get("outputs", [])]
    assert pictures and outputs, outputs
    assert not [o for o in outputs if "image/png" in o.get("data", {})]
    assert all("Not run while grading" in o.get("text", "") for o in outputs), outputs


@pytest.mark.slow
def test_validate_skips_the_demonstrations_as_make_check_does(tmp_path):
    """nbgrader's Validate (the lab's button) runs a notebook with the session `make check` and
    grading use: a graded cell that fails when demonstrations would run passes Validate."""
    from nbformat.v4 import new_code_cell, new_notebook

    from graders.course.notebooks import venv_env

    cell = new_code_cell("from graders.judging import session\n"
                         "assert not session.kernel().session.demonstrations, 'the demonstrations would run'")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "demonstrations_off", "points": 1,
                                 "solution": False, "locked": True, "schema_version": 3}
    notebook = new_notebook(cells=[cell])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "demonstrations.ipynb")
    run = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(tmp_path / "demonstrations.ipynb")],
                         cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=300)
    assert "Success! Your notebook passes all the tests." in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
def test_validate_names_the_cell_where_the_learners_code_raised_as_the_grade_report_does(tmp_path):
    """Validate's kernel is fresh, so its execution counter ("Cell In[7]") is one the learner never
    saw: its traceback names the cell as the grade report does (graders.harness.cells.cell_label).
    The learner's own kernel keeps IPython's In[N] (test_a_crash_in_the_learners_code_...)."""
    from graders.course.notebooks import venv_env
    from graders.harness.cells import cell_label

    notebook = submission("01_layernorm", solved=True, edits=[CRASH])
    answer = _test_cell(notebook, CRASH[1])
    line = next(n for n, code in enumerate(answer.source.splitlines(), 1) if CRASH[3] in code)
    nbformat.write(notebook, tmp_path / "01_layernorm.ipynb")
    run = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(tmp_path / "01_layernorm.ipynb")],
                         cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert "IndexError raised in your code:" in run.stdout, run.stdout + run.stderr
    assert f"{cell_label(answer)}, line {line}, in forward" in run.stdout, run.stdout
    assert "Cell In[" not in run.stdout, run.stdout


# Test cells of composites whose given __init__ builds a part the learner writes: the check
# names the part, not the given class.
GIVEN_INIT_BUILDS = {("10_modern_decoder", "model_test"): {"ModernDecoder": "DecoderLayer"}}


@pytest.mark.parametrize("name", [n for n in notebook_names() if n != "00_tour"])
@pytest.mark.slow
def test_run_all_runs_an_untouched_notebook_to_the_end(name, tmp_path):
    """Only test cells may fail (tagged raises-exception: Run All goes on); each says in one line
    that its exercise is unsolved, naming the learner's class or function that is (not a given
    one that calls it), each demonstration cell that needs an answer says which, and the last
    cell sums up, every exercise "not written yet"."""
    notebook = _run(nbformat.read(EXERCISES / f"{name}.ipynb", as_version=4), tmp_path,
                    allow_errors=False)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        errors = _errors(cell)
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            assert len(errors) == 1 and len(errors[0]) == 1, (meta["grade_id"], errors)
            assert errors[0][0].startswith("\N{BALLOT X} ") and "not written yet" in errors[0][0], errors
            for owner, unwritten in GIVEN_INIT_BUILDS.get((name, meta["grade_id"]), {}).items():
                assert f"{unwritten}.__init__ is not written yet ({owner} builds {unwritten})" in errors[0][0], errors
        else:
            assert not errors, (cell.source[:80], errors)
        if "if ready(" in cell.source and "if ready():" not in cell.source:   # needs answers
            assert "Skipped: this cell needs your" in _stdout(cell), cell.source[:80]
    summary = _stdout(notebook.cells[-1])
    assert summary.startswith(f"Progress in {name}: 0 of ") and "its check fails" not in summary, summary
    assert summary.count("not written yet") == summary.count(" points, ") + summary.count(" point, "), summary


BUSY_CELL = """import time
from graders.judging import progress
from graders.reference.paths import building
print("before")
with progress.busy("Checking X", after=0.2, every=0.1):
    with building("generating Y"):
        time.sleep(0.6)
        print("printed meanwhile")
    time.sleep(0.3)
raise ValueError("the box")
"""


@pytest.mark.slow
def test_a_progress_line_says_what_is_built_and_leaves_no_blank_line(tmp_path):
    """The line of a long check is a display of its own in the kernel: it says what
    is being built meanwhile, a line printed meanwhile does not break it, and at the end it takes
    no room (a stream line erased with spaces stayed as a blank line above the ✗ box)."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    shown = []

    class Client(NotebookClient):
        def process_message(self, msg, cell, cell_index):
            if msg["msg_type"] in ("display_data", "update_display_data"):
                shown.append(msg["content"]["data"].get("text/plain"))
            return super().process_message(msg, cell, cell_index)

    notebook = new_notebook(cells=[new_code_cell(BUSY_CELL)])
    Client(notebook, timeout=120, kernel_name="python3", allow_errors=True,
           resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = notebook.cells[0].outputs
    assert any(text and text.startswith("Checking X … ") and text.endswith(" s (generating Y)")
               for text in shown), shown
    assert shown[-1] is None, shown   # emptied
    assert _stdout(notebook.cells[0]) == "before\nprinted meanwhile\n"
    assert [o.output_type for o in outputs] == ["stream", "display_data", "stream", "error"], outputs
    assert outputs[1].data == {}


def test_the_first_check_time_the_docs_state_is_a_benchmarks_line():
    """The documentation's time for a new learner's first check (the README said "a
    few seconds"; it took over a minute) is what a benchmark prints, with its conditions. The time
    is stated in docs/benchmarks.md (it moved there from the README), and no page says "a few
    seconds" of it: neither the README nor any page under docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    benchmarks = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    stated = re.search(r"A new learner's first check \(01's, on an empty cache\) .*?: (\d+) s and (\d+) s in two runs "
                       r"in a fresh kernel on (\d+) cores of an (.+?) at load average ([\d.]+) and ([\d.]+) "
                       r"\(`python (benchmarks/[\w.]+)` prints that line\)", benchmarks)
    assert stated, "docs/benchmarks.md states the first check's time without its benchmark"
    benchmark = (ROOT / stated.group(7)).read_text()
    assert "01's first check on an empty course cache: {seconds[-1]:.0f} s" in benchmark
    assert "GPT2_COURSE_CACHE=cache" in benchmark and "load average {load:.1f}" in benchmark
    for page in pages:
        assert "a few seconds" not in " ".join(page.read_text().split()), page.relative_to(ROOT)


def test_a_crash_names_the_arguments_as_a_learner_reads_them():
    """A crash names the input's values, not its types ("while running on DemoTransformer, bool." read worse)."""
    from graders.judging.compare import CheckFailed
    from graders.judging.learner import run_learner

    class DemoTransformer:
        pass

    def generate(model, greedy, text):
        raise ValueError("boom")
    with pytest.raises(CheckFailed) as failed:
        run_learner("generate", generate, DemoTransformer(), True, "To be")
    assert str(failed.value).endswith("while running on a DemoTransformer, True, 'To be'."), str(failed.value)
