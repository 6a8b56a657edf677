"""Crafted submissions: each is graded right, and costs nothing beyond what it breaks.

Every test builds a submission from the released notebook (graders.course.example_class), grades it
with the instructor's harness (graders.harness.grading), and checks the points and the reason.
"""
import copy
import json
import os
from pathlib import Path

import nbformat
import pytest

from graders.course import example_class
from graders.course.notebooks import SOLUTIONS
from graders.harness import execute, grading
from graders.integrity import sandbox

pytestmark = pytest.mark.xdist_group("integrity")

CORRECT_LAYERNORM_BODY = (
    "        centred = residual - residual.mean(dim=-1, keepdim=True)\n"
    "        variance = centred.pow(2).mean(dim=-1, keepdim=True)\n"
    "        return centred / (variance + self.cfg.layer_norm_eps).sqrt() * self.w + self.b\n")
SAMPLE_VARIANCE = ("01_layernorm", "layernorm_answer", "centred.pow(2).mean(dim=-1, keepdim=True)",
                   "centred.var(dim=-1, keepdim=True)")


def crafted(name, solved=True, edits=(), extra=None):
    """A submission of `name`: solved or not, with `edits`, extra code cells after given cells."""
    notebook = example_class.submission(name, solved, edits)
    for grade_id, sources in (extra or {}).items():
        index = next(i for i, c in enumerate(notebook.cells)
                     if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        for offset, source in enumerate(sources, 1):
            notebook.cells.insert(index + offset, nbformat.v4.new_code_cell(source))
    return notebook


def grade(tmp_path, name, notebook, cell_timeout=120):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(notebook, path)
    result, executed = grading.grade_notebook("crafted", name, path, tmp_path / "work",
                                               grading.TimeLimits(ordinary=cell_timeout))
    return {c.grade_id: c for c in result.cells}, result, executed


def printed(executed, marker):
    """What the learner's cell starting with `marker` printed."""
    return "".join(o.get("text", "") for c in executed.cells if c.source.startswith(marker)
                   for o in c.get("outputs", []))


CONFINED = pytest.mark.skipif(bool(sandbox.confinement_unavailable()), reason="learner code is confined "
                              "only where user namespaces are available (they are in CI)")


def with_forward(name, grade_id, forward_source):
    """The solved notebook, with the given class's forward replaced by `forward_source`."""
    notebook = example_class.submission(name, True)
    cell = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    head, _, _ = cell.source.partition("    def forward(")
    cell.source = head + forward_source
    return notebook


# 1. Patching the comparison functions in the kernel turns nothing into points.
@pytest.mark.slow
def test_monkeypatched_comparisons_do_not_rescue_a_wrong_answer(tmp_path):
    patch = ("import torch, numpy, math, builtins\n"
             "torch.allclose = lambda *a, **k: True\n"
             "torch.testing.assert_close = lambda *a, **k: None\n"
             "numpy.allclose = lambda *a, **k: True\n"
             "math.isclose = lambda *a, **k: True\n"
             "class _Never(Exception): pass\n"
             "builtins.AssertionError = _Never\n")
    cells, _, _ = grade(tmp_path, "01_layernorm",
                        crafted("01_layernorm", edits=[SAMPLE_VARIANCE], extra={"setup": [patch]}))
    assert cells["layernorm_test"].points == 0
    assert "sample variance" in cells["layernorm_test"].message


# 2. Rewriting the graders in the kernel's memory changes no verdict.
@pytest.mark.slow
def test_rewritten_graders_modules_in_the_kernel_change_nothing(tmp_path):
    patch = ("import sys, graders.judging.compare, graders.judging.tolerance, graders.judging.exercise\n"
             "graders.judging.compare.compare = lambda *a, **k: None\n"
             "graders.judging.tolerance.close = lambda *a, **k: True\n"
             "sys.modules['graders.exercises.nb01'].judge_layernorm = lambda *a, **k: None\n"
             "graders.judging.exercise.Exercise.judge = property(lambda self: (lambda *a: None))\n")
    cells, _, _ = grade(tmp_path, "01_layernorm",
                        crafted("01_layernorm", edits=[SAMPLE_VARIANCE], extra={"layernorm_answer": [patch]}))
    assert cells["layernorm_test"].points == 0


# 3. Objects that lie about equality are judged by their numbers.
@pytest.mark.slow
def test_lying_tensor_subclass_fails(tmp_path):
    forward = ("    def forward(self, residual):\n"
               "        class Liar(torch.Tensor):\n"
               "            def __eq__(self, other): return True\n"
               "            def __bool__(self): return True\n"
               "            def allclose(self, *a, **k): return True\n"
               "        return torch.zeros_like(residual).as_subclass(Liar)\n")
    cells, _, _ = grade(tmp_path, "01_layernorm", with_forward("01_layernorm", "layernorm_answer", forward))
    assert cells["layernorm_test"].points == 0
    assert cells["layernorm_test"].status == "failed"


# 4. Solutions (and their hidden tests) and reference activations are out of reach, even the
# activations of the notebook's own visible check (they hold its expected outputs).
@CONFINED
@pytest.mark.slow
def test_solutions_and_reference_activations_cannot_be_read(tmp_path):
    from graders.course.notebooks import SOLUTIONS
    from graders.judging.cases import Case
    from graders.reference.activations import activation_path
    from graders.reference.store import reference_id

    solution = SOLUTIONS / "01_layernorm.ipynb"
    activations = activation_path(reference_id(), Case().tokens())
    assert activations.is_file()
    steal = ("# steal\n"
             "import json\n"
             f"for path in {[str(solution), str(activations)]!r}:\n"
             "    try:\n"
             "        data = open(path, 'rb').read()\n"
             "    except OSError as err:\n"
             "        print('blocked', type(err).__name__)\n"
             "        continue\n"
             "    print('READ', path)\n"
             "    if path.endswith('.ipynb'):  # forge: run the solution's answer cell\n"
             "        cell = next(c for c in json.loads(data)['cells']\n"
             "                    if c['metadata'].get('nbgrader', {}).get('grade_id') == 'layernorm_answer')\n"
             "        exec(''.join(cell['source']))\n")
    notebook = crafted("01_layernorm", edits=[SAMPLE_VARIANCE], extra={"layernorm_answer": [steal]})
    cells, _, executed = grade(tmp_path, "01_layernorm", notebook)
    assert printed(executed, "# steal").split() == ["blocked", "FileNotFoundError"] * 2
    assert cells["layernorm_test"].points == 0
    assert "sample variance" in cells["layernorm_test"].message


# 5. The grading output, other students' folders and the graders cannot be written.
@CONFINED
@pytest.mark.slow
def test_grades_other_students_and_graders_cannot_be_written(tmp_path):
    out, other = tmp_path / "grading", tmp_path / "other-student" / "work" / "records"
    other.mkdir(parents=True)
    (out / "reports").mkdir(parents=True)
    (out / "grades.csv").write_text("student,total,max\ncrafted,0,5\n")
    (out / "results.json").write_text("[]")
    (other / "00001.json").write_text("{}")
    added = Path(grading.__file__).parent / "_written_by_a_submission.py"
    targets = [out / "grades.csv", out / "results.json", out / "reports" / "crafted.txt",
               other / "00001.json", other / "00002.json", Path(grading.__file__), added]
    vandal = ("# vandal\n"
              f"for path in {[str(t) for t in targets]!r}:\n"
              "    try:\n"
              "        with open(path, 'a') as f:\n"
              "            f.write('crafted,1000,5\\n')\n"
              "        print('WROTE', path)\n"
              "    except OSError as err:\n"
              "        print('blocked')\n")
    before = {t: t.read_bytes() for t in targets if t.exists()}
    try:
        cells, result, executed = grade(tmp_path / "submission", "01_layernorm",
                                        crafted("01_layernorm", extra={"layernorm_answer": [vandal]}))
    finally:
        added.unlink(missing_ok=True)
    assert printed(executed, "# vandal").split() == ["blocked"] * len(targets)
    assert {t: t.read_bytes() for t in targets if t.exists()} == before
    assert cells["layernorm_test"].points == 5
    assert not any("grader files changed" in flag for flag in result.flags)


def _processes_naming(marker: str) -> list[str]:
    found = []
    for process in Path("/proc").iterdir():
        try:
            if process.name.isdigit() and marker.encode() in (process / "cmdline").read_bytes():
                found.append(process.name)
        except OSError:   # it ended meanwhile
            continue
    return found


# 4 and 5. Learner code runs as a uid of its own with no groups, without network (it cannot
# reach the grader's Dask cluster or anything else on this machine), cannot start a program,
# sees only its own processes (a PID namespace), and whatever it leaves running (a forked child)
# dies with its kernel.
@pytest.mark.slow
def test_learner_code_runs_unprivileged_offline_and_alone(tmp_path):
    import socket
    import time

    marker = str(tmp_path / "work")   # in the kernel's command line, and so in its forked child's
    with socket.create_server(("127.0.0.1", 0)) as grader_service:
        who = ("# who\nimport os, socket, subprocess\n"
               "print(os.getuid(), os.geteuid(), os.getgid(), len(os.getgroups()))\n"
               "try:\n"
               f"    socket.create_connection(('127.0.0.1', {grader_service.getsockname()[1]}), timeout=5)\n"
               "    print('connected')\n"
               "except OSError as err:\n"
               "    print('offline')\n"
               "try:\n"
               "    subprocess.Popen(['sh', '-c', 'sleep 600'], start_new_session=True)\n"
               "    print('started')\n"
               "except PermissionError:\n"
               "    print('no-programs')\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "    import time\n"
               "    time.sleep(600)\n"
               "    os._exit(0)\n"
               "seen = [open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
               "        for p in os.listdir('/proc') if p.isdigit()]\n"
               "ours = {b'sleep', b'graders.integrity.sandbox_kernel', b'-c'}   # a zombie has no command line\n"
               "print(os.getpid(), [b' '.join(c).decode()[:80] for c in seen\n"
               "                    if c != [b''] and not ours & set(c) and not c[0].endswith(b'bwrap')])\n")
        cells, _, executed = grade(tmp_path, "01_layernorm", crafted("01_layernorm", extra={"setup": [who]}))
    uid, euid, gid, groups, network, programs, pid, others = printed(executed, "# who").split(maxsplit=7)
    assert int(uid) == int(euid) >= sandbox.SANDBOX_UIDS[0] and int(gid) == int(uid) and groups == "0"
    assert network == "offline" and programs == "no-programs"
    assert int(pid) < 10 and others.strip() == "[]", f"the kernel saw processes other than its own: {others}"
    deadline = time.monotonic() + 10   # killed with the kernel's PID namespace; gone from /proc a moment later
    while _processes_naming(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_naming(marker), "a process learner code left running outlived its notebook"
    assert cells["layernorm_test"].points == 5


# A notebook cannot fill the machine under the class graded beside it: its scratch folders are
# memory of a bounded size, no file it writes (records included) grows past a bound, and the
# packages its kernel goes without are empty and read-only.
@CONFINED
@pytest.mark.slow
def test_a_kernel_can_fill_neither_memory_nor_disk(tmp_path):
    from graders.integrity.sandbox_kernel import FILE_MB, SCRATCH_MB
    from graders.reference.paths import cache_dir

    hidden = sandbox.library_paths(("transformers",))[0]
    fill = ("# fill\nimport errno, json, os\n"
            "def outcome(action):\n"
            "    try:\n"
            "        action()\n"
            "        return 'written'\n"
            "    except OSError as err:\n"
            "        return errno.errorcode[err.errno]\n"
            "def flood(folder):\n"
            "    try:\n"
            "        with open(os.path.join(folder, 'flood'), 'wb') as f:\n"
            "            for _ in range(4 * SCRATCH_MB):\n"
            "                f.write(bytes(2**20))\n"
            "    finally:   # the memory back for the rest of the notebook\n"
            "        os.remove(os.path.join(folder, 'flood'))\n"
            "def far(folder):   # a sparse file: past the bound without writing a byte before it\n"
            "    with open(os.path.join(folder, 'far'), 'wb') as f:\n"
            "        f.seek(FILE_MB * 2**20)\n"
            "        f.write(b'x')\n"
            f"SCRATCH_MB, FILE_MB = {SCRATCH_MB}, {FILE_MB}\n"
            f"scratch = ['/tmp', '/dev/shm', {str(cache_dir())!r}, os.getcwd()]\n"
            "print(json.dumps({'sizes': [os.statvfs(p).f_blocks * os.statvfs(p).f_frsize // 2**20 for p in scratch],\n"
            "                  'floods': [outcome(lambda: flood(p)) for p in scratch],\n"
            f"                  'records': outcome(lambda: far({str(tmp_path / 'work' / 'records-0')!r})),\n"
            f"                  'hidden': outcome(lambda: open(os.path.join({str(hidden)!r}, 'x.py'), 'w'))}}))\n")
    cells, _, executed = grade(tmp_path, "01_layernorm", crafted("01_layernorm", extra={"setup": [fill]}))
    assert json.loads(printed(executed, "# fill")) == {
        "sizes": [SCRATCH_MB] * 4, "floods": ["ENOSPC"] * 4, "records": "EFBIG", "hidden": "EROFS"}
    assert cells["layernorm_test"].points == 5


# Its records and sockets are the host's disk: a kernel that floods them is stopped and its cell
# says why; nothing it wrote there is left.
@CONFINED
@pytest.mark.slow
def test_a_kernel_flooding_the_graders_disk_is_stopped(tmp_path):
    import time

    from graders.integrity.disk_watch import MAX_ENTRIES

    records = tmp_path / "work" / "records-0"
    flood = ("# flood\nimport os, time\n"
             "_forward = LayerNorm.forward\n"
             "def flooding_forward(self, x):\n"
             f"    for i in range({MAX_ENTRIES + 1000}):\n"
             f"        open(os.path.join({str(records)!r}, f'junk-{{i}}'), 'w').close()\n"
             "    time.sleep(100)\n"
             "    return _forward(self, x)\n"
             "LayerNorm.forward = flooding_forward\n")
    start = time.monotonic()
    cells, _, _ = grade(tmp_path, "01_layernorm", crafted("01_layernorm", extra={"layernorm_answer": [flood]}))
    assert time.monotonic() - start < 60, "the flood was not stopped before the cell's time limit"
    assert (cells["layernorm_test"].status, cells["layernorm_test"].message) == \
        ("crashed", f"stopped: this cell wrote more than {MAX_ENTRIES:,} files to the grader's disk")
    assert list(records.iterdir()) == []


# 4 and 5. The judge reads only regular files in the records folder: a symlink to a file the
# kernel cannot read, or a FIFO that would block, counts as no record.
def test_records_that_are_not_regular_files_are_ignored(tmp_path):
    import torch
    from safetensors.torch import save_file

    records = tmp_path / "records"
    records.mkdir()
    record = {"cell": "layernorm_test", "exercise": "LayerNorm", "case": {}, "message": "", "tensors": True}
    (tmp_path / "outside.json").write_text(json.dumps(record))
    save_file({"out": torch.zeros(3)}, tmp_path / "outside.safetensors")
    (records / "00001.json").symlink_to(tmp_path / "outside.json")
    os.mkfifo(records / "00002.json")
    (records / "00003.json").write_text(json.dumps(record))
    (records / "00003.safetensors").symlink_to(tmp_path / "outside.safetensors")
    assert grading.load_records(records) == {}


# 6. A deleted test cell, or one stripped of its metadata, is restored and graded.
@pytest.mark.parametrize("how", ["deleted", "metadata stripped"])
@pytest.mark.slow
def test_deleted_or_stripped_test_cell_is_restored_and_graded(tmp_path, how):
    notebook = example_class.submission("01_layernorm", True)
    test = next(c for c in notebook.cells if grading.is_test_cell(c))
    if how == "deleted":
        notebook.cells.remove(test)
    else:
        test.metadata = {}
    cells, result, _ = grade(tmp_path, "01_layernorm", notebook)
    assert cells["layernorm_test"].points == 5
    assert any("layernorm_test was deleted" in flag for flag in result.flags)


# 7. An edited test cell or edited points are put back.
@pytest.mark.slow
def test_edited_test_cell_and_points_are_restored(tmp_path):
    notebook = crafted("01_layernorm", edits=[SAMPLE_VARIANCE])
    test = next(c for c in notebook.cells if grading.is_test_cell(c))
    test.source = "print('all good')"
    test.metadata["nbgrader"]["points"] = 100
    cells, result, _ = grade(tmp_path, "01_layernorm", notebook)
    assert cells["layernorm_test"].points == 0 and cells["layernorm_test"].max_points == 5
    assert any("layernorm_test was edited" in flag for flag in result.flags)


# 8 and 9. An infinite loop, os._exit, a segfault and a memory bomb each cost only their test.
@pytest.mark.parametrize("sabotage,status", [
    ("        while True:\n            pass\n", "timeout"),
    ("        import ctypes\n        ctypes.string_at(0)\n", "crashed"),
    ("        import os\n        os._exit(3)\n", "crashed"),
    ("        hog = bytearray(64 * 2**30)\n", "failed"),
], ids=["infinite loop", "segfault", "os._exit", "memory bomb"])
@pytest.mark.slow
def test_a_sabotaged_exercise_costs_only_its_own_test(tmp_path, sabotage, status):
    forward = ("    def forward(self, tokens):\n" + sabotage +
               "        return self.W_E[tokens]\n")
    notebook = with_forward("02_embeddings", "embed_answer", forward)
    cells, _, _ = grade(tmp_path, "02_embeddings", notebook, cell_timeout=15)
    assert cells["embed_test"].points == 0
    assert cells["embed_test"].status in (status, "error") and cells["embed_test"].message
    if status == "timeout":
        assert "ran past its time limit of 15 s" in cells["embed_test"].message
    if status == "crashed":
        assert "crashed" in cells["embed_test"].message
    assert cells["pos_embed_test"].points == 3


@pytest.mark.slow
def test_a_crash_between_two_passing_tests_costs_neither(tmp_path):
    """The kernel restarted after a crash records again from the start; the records of the
    tests before the crash stay (03: the mask passes, forward crashes, the circuits pass)."""
    notebook = crafted("03_attention", edits=[example_class.CRASH])
    cells, _, _ = grade(tmp_path, "03_attention", notebook)
    assert cells["attention_test"].status == "crashed"
    assert cells["causal_mask_test"].points == cells["causal_mask_test"].max_points
    assert cells["circuits_test"].points == cells["circuits_test"].max_points


@pytest.mark.slow
def test_only_cells_tagged_training_get_the_training_time_limit(tmp_path):
    """The same slow cell finishes when tagged `training` and is interrupted when not."""
    slow = "import time\ntime.sleep(10)\nprint('{} cell finished')"
    notebook = crafted("01_layernorm", extra={"layernorm_answer": [slow.format("training"),
                                                                   slow.format("ordinary")]})
    next(c for c in notebook.cells if "training cell" in c.source).metadata["tags"] = ["training"]
    path = tmp_path / "01_layernorm.ipynb"
    nbformat.write(notebook, path)
    result, executed = grading.grade_notebook("crafted", "01_layernorm", path, tmp_path / "work",
                                               grading.TimeLimits(ordinary=5, training=60))
    assert "training cell finished" in printed(executed, "import time")
    assert "ordinary cell finished" not in printed(executed, "import time")
    assert [c.points for c in result.cells] == [5]  # an interrupted demo cell costs no points


def test_nbgrader_uses_the_same_time_limits_as_the_harness():
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(SOLUTIONS.parent)).load_config()
    tagged, plain = ({"cell_type": "code", "metadata": {"tags": tags}, "source": ""} for tags in (["training"], []))
    assert config.Execute.timeout == grading.TimeLimits().ordinary
    assert config.Execute.timeout_func(tagged) == grading.TimeLimits().training
    assert config.Execute.timeout_func(plain) == grading.TimeLimits().ordinary


# 10. Warnings and stderr output during a passing check do not zero it.
@pytest.mark.slow
def test_stderr_and_warnings_do_not_zero_a_passing_check(tmp_path):
    forward = ("    def forward(self, residual):\n"
               "        import sys, warnings\n"
               "        print('debug: a message on stderr', file=sys.stderr)\n"
               "        warnings.warn('a UserWarning from the learner')\n" + CORRECT_LAYERNORM_BODY)
    cells, _, _ = grade(tmp_path, "01_layernorm", with_forward("01_layernorm", "layernorm_answer", forward))
    assert cells["layernorm_test"].points == 5


# 11. An answer tuned to the visible check fails the hidden variants.
@pytest.mark.slow
def test_answer_tuned_to_the_visible_check_fails_the_hidden_variants(tmp_path):
    forward = ("    def forward(self, residual):\n"
               "        if tuple(residual.shape) != (1, 35, 768):\n"
               "            return residual.clone()\n" + CORRECT_LAYERNORM_BODY)
    cells, _, _ = grade(tmp_path, "01_layernorm", with_forward("01_layernorm", "layernorm_answer", forward))
    assert cells["layernorm_test"].points == 0
    assert "random tokens" in cells["layernorm_test"].message or "block 7" in cells["layernorm_test"].message \
        or "does not match" in cells["layernorm_test"].message


# 12. The library version of the thing to build is refused, also when smuggled in early.
@pytest.mark.parametrize("forward,extra", [
    ("    def forward(self, residual):\n"
     "        return torch.nn.functional.layer_norm(residual, (768,), self.w, self.b, 1e-5)\n", None),
    ("    def forward(self, residual):\n"
     "        return SMUGGLED(residual, (768,), self.w, self.b, 1e-5)\n",
     "import torch\nSMUGGLED = torch.nn.functional.layer_norm\n"),
], ids=["direct call", "reference saved before the check"])
@pytest.mark.slow
def test_library_layer_norm_is_refused(tmp_path, forward, extra):
    notebook = with_forward("01_layernorm", "layernorm_answer", forward)
    if extra:
        setup = next(i for i, c in enumerate(notebook.cells)
                     if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
        notebook.cells.insert(setup + 1, nbformat.v4.new_code_cell(extra))
    cells, _, _ = grade(tmp_path, "01_layernorm", notebook)
    assert cells["layernorm_test"].points == 0
    assert "layer_norm" in cells["layernorm_test"].message


def test_no_solution_answer_trips_a_forbidden_word_of_its_notebook():
    """The grader's own look for library shortcuts in the code never fails a correct answer:
    a word another exercise of the notebook needs (08's beam search counts with .numel) is
    looked for in its own exercise's answer cells only."""
    from graders.course.notebooks import notebook_names
    from graders.exercises import find
    from graders.harness.cells import learner_code, released_notebook, source_notebook
    from graders.harness.manifest import notebook_checks
    from graders.judging.verdict import forbidden_use

    tripped = []
    for name in notebook_names():
        source, released = source_notebook(name), released_notebook(name)
        for grade_id, checks in notebook_checks(name).items():
            code = learner_code(source, released, grade_id)
            assert code.before, (name, grade_id)   # the solution's answers above the test cell
            tripped += [(name, grade_id, used) for key, _ in checks
                        if (used := forbidden_use(find(key), code))]
    assert not tripped


def test_a_word_forbidden_in_its_own_answer_is_still_refused_there():
    from graders.exercises import find
    from graders.judging.verdict import LearnerCode, forbidden_use

    kv_cache_bytes = find(("08_sampling", "kv_cache_bytes"))
    counted = "def kv_cache_bytes(cfg, batch, seq_len, dtype):\n    return cache.numel() * 4\n"
    assert forbidden_use(kv_cache_bytes, LearnerCode(counted, counted)) == ".numel"
    assert forbidden_use(kv_cache_bytes, LearnerCode("scores.topk(min(3, candidates.numel()))", "return 0")) is None
    layer_norm = find(("01_layernorm", "LayerNorm"))
    smuggled = "SMUGGLED = torch.nn.functional.layer_norm"   # in a cell of its own, before the answer
    assert forbidden_use(layer_norm, LearnerCode(smuggled, "return SMUGGLED(x)")) is not None


# 13. A flood of output is truncated and grading goes on.
@pytest.mark.slow
def test_huge_output_is_truncated_and_grading_continues(tmp_path):
    flood = "print('x' * 5_000_000)"
    cells, _, executed = grade(tmp_path, "01_layernorm",
                               crafted("01_layernorm", extra={"layernorm_answer": [flood]}))
    assert cells["layernorm_test"].points == 5
    sizes = [len(o.get("text", "")) for c in executed.cells for o in c.get("outputs", [])]
    assert max(sizes) <= execute.OUTPUT_LIMIT + 100


# 14. The notebook's kernelspec is ignored.
@pytest.mark.slow
def test_a_changed_kernelspec_has_no_effect(tmp_path):
    notebook = example_class.submission("01_layernorm", True)
    notebook.metadata["kernelspec"] = {"name": "evil-kernel", "display_name": "x", "language": "python"}
    cells, _, _ = grade(tmp_path, "01_layernorm", notebook)
    assert cells["layernorm_test"].points == 5


# 15. Detecting the grading run and forging records gains nothing.
@pytest.mark.slow
def test_forged_records_in_grading_mode_gain_nothing(tmp_path):
    forge = ("import json\n"
             "import graders.judging.exercise as g, graders.judging.session as s\n"
             "session = s.kernel().session\n"
             "if session.recording:\n"
             "    g.Exercise.check = lambda self, learner, case, answers=(): None\n"
             "    for n in range(3):\n"
             "        record = {'check': f'layernorm_test/{n}', 'exercise': ['01_layernorm', 'LayerNorm'],\n"
             "                  'message': '', 'tensors': False}\n"
             "        (session.records / f'0000{n}.json').write_text(json.dumps(record))\n")
    notebook = crafted("01_layernorm", edits=[SAMPLE_VARIANCE], extra={"layernorm_answer": [forge]})
    cells, _, _ = grade(tmp_path, "01_layernorm", notebook)
    assert cells["layernorm_test"].points == 0


# 18. Grading the same submission twice gives the same result.
@pytest.mark.slow
def test_regrading_is_deterministic(tmp_path):
    notebook = crafted("01_layernorm", edits=[SAMPLE_VARIANCE])
    first, _, _ = grade(tmp_path / "a", "01_layernorm", copy.deepcopy(notebook))
    second, _, _ = grade(tmp_path / "b", "01_layernorm", copy.deepcopy(notebook))
    assert [(c.points, c.status, c.message) for c in first.values()] == \
           [(c.points, c.status, c.message) for c in second.values()]


def test_the_kernel_is_told_which_reference_the_judge_uses(tmp_path, monkeypatch):
    """A kernel has its own HOME: left to `auto` it would miss a pretrained GPT-2 in the grader's
    Hugging Face cache and produce outputs with other weights than the judge compares with."""
    from graders.integrity.sandbox import sandbox_env
    from graders.reference import store
    from graders.reference.model import ReferenceId, identify

    assert sandbox_env(tmp_path)["GPT2_COURSE_WEIGHTS"] == identify().source
    pretrained = ReferenceId("pretrained", "0" * 64, "pretrained GPT-2 small (test)")
    unpinned = store.reference_id.__wrapped__
    monkeypatch.setattr(store, "reference_id", lambda: pretrained)
    env = sandbox_env(tmp_path / "home")
    assert env["GPT2_COURSE_WEIGHTS"] == "pretrained"
    # The kernel, which cannot see the pretrained folder, takes the judge's reference as named.
    monkeypatch.setenv(store.PINNED_ENV, env[store.PINNED_ENV])
    assert unpinned() == pretrained


def test_only_checks_against_reference_activations_receive_reference_inputs():
    """Training and sampling checks run their own small models: computing GPT-2 activations for
    their cases (2,000 sequences in notebook 07) once took the grader out of memory."""
    from graders.harness.manifest import notebook_checks
    from graders.exercises import find
    from graders.judging.exercise import no_inputs

    wanted = {name: [check for checks in notebook_checks(name).values() for check in checks]
              for name in ("01_layernorm", "07_training", "08_sampling")}
    assert all(find(key).inputs is not no_inputs for key, _ in wanted["01_layernorm"])
    assert all(find(key).inputs is no_inputs for key, _ in wanted["07_training"] + wanted["08_sampling"])
