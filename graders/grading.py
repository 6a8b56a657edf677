"""Grade one submitted notebook: run it in a sandboxed kernel, judge in this clean process.

1. Restore: every locked cell of the source notebook (test cells, given code) replaces the
   submission's version, by nbgrader grade_id; a deleted test cell is put back where it was.
2. Run: a fresh kernel (`graders.sandbox_kernel`: memory cap, scrubbed environment, own folder)
   executes the cells with a per-cell timeout. A root grader also confines it: no network, and
   only the system, Python, the graders package, the reference files its checks read (all
   read-only) and its own folder, as a uid no other process has. Test cells run in recording
   mode: each check saves what the learner's code produced (tensors in safetensors files,
   never pickles). A kernel that dies (os._exit, segfault, memory) is restarted; the cell that
   killed it is skipped and the learner's other cells are replayed, so only the affected tests
   are lost.
3. Judge: this process, which never runs learner code, replays each test cell's source from
   the *source* notebook to list the checks it must contain, and judges each recorded output
   with the exercise's `judge`. A test cell scores its points only if all its checks pass.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import secrets
import stat
import subprocess
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from graders.notebooks import SOLUTIONS

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
KERNEL_NAME = "gpt2-course-sandbox"
MAX_RESTARTS = 6
OUTPUT_LIMIT = 20_000  # characters kept per cell output: a flood never reaches the gradebook
SANDBOX_UIDS = (1_000_000_000, 2_000_000_000)  # no account has these: each kernel draws its own


@dataclass(frozen=True)
class TimeLimits:
    """Seconds a cell may run before it is interrupted: one policy for nbgrader (see
    nbgrader_config.py) and the course's harness. Cells tagged "training" (notebook 07's
    budgeted runs, 1-2 min on one core) get minutes; every other cell needs seconds (the
    slowest graded one about 10 s on one core), so an infinite loop there costs 2 min instead
    of the 5 min the former single limit allowed."""
    ordinary: int = 120
    training: int = 600

    def of(self, cell) -> int:
        return self.training if "training" in cell.get("metadata", {}).get("tags", []) else self.ordinary


@dataclass
class CellResult:
    grade_id: str
    points: float
    max_points: float
    status: str          # passed | failed | error | timeout | crashed | missing-notebook
    message: str = ""


@dataclass
class NotebookResult:
    student: str
    notebook: str
    cells: list[CellResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)   # restored cells, renamed notebook, ...

    @property
    def score(self) -> float:
        return sum(c.points for c in self.cells)

    def to_json(self) -> dict:
        return {"student": self.student, "notebook": self.notebook, "flags": self.flags,
                "cells": [asdict(c) for c in self.cells]}


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_test_cell(cell) -> bool:
    meta = _nbgrader(cell)
    return bool(meta.get("grade")) and not meta.get("solution") and cell["cell_type"] == "code"


def source_notebook(name: str):
    return nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)


def test_cells(source) -> list:
    return [cell for cell in source.cells if is_test_cell(cell)]


def restore(submission, source) -> tuple[object, list[str]]:
    """The submission with every locked source cell put back as the source has it."""
    flags = []
    theirs = {_nbgrader(c).get("grade_id"): c for c in submission.cells if _nbgrader(c).get("grade_id")}
    restored = []
    for cell in source.cells:
        meta = _nbgrader(cell)
        grade_id = meta.get("grade_id")
        if meta.get("solution") and grade_id in theirs:
            answer = copy.deepcopy(theirs[grade_id])
            answer["metadata"]["nbgrader"] = copy.deepcopy(meta)
            restored.append(answer)
        elif meta.get("solution"):
            flags.append(f"answer cell {grade_id} is missing: graded as unanswered")
            restored.append(_unanswered(cell))
        elif grade_id:  # locked: tests and given code always come from the source
            if grade_id not in theirs:
                flags.append(f"cell {grade_id} was deleted: restored from the source")
            elif theirs[grade_id].get("source") != _released_source(cell):
                flags.append(f"cell {grade_id} was edited: restored from the source")
            restored.append(copy.deepcopy(cell))
        else:
            continue
    # The learner's own extra cells run in place, after the cell they followed.
    extras = _extra_cells(submission)
    result = nbformat.v4.new_notebook()
    for cell in restored:
        result.cells.append(cell)
        result.cells.extend(extras.get(_nbgrader(cell).get("grade_id"), []))
    result.cells[0:0] = extras.get(None, [])
    result.metadata = {"kernelspec": {"name": KERNEL_NAME, "display_name": "sandbox",
                                      "language": "python"}}
    return result, flags


def _released_source(cell) -> str:
    """What a test cell looks like in the student version (hidden tests removed)."""
    lines, hidden = [], False
    for line in cell["source"].splitlines():
        if line.strip() == HIDDEN_BEGIN:
            hidden = True
        elif line.strip() == HIDDEN_END:
            hidden = False
        elif not hidden:
            lines.append(line)
    return "\n".join(lines)


def _unanswered(cell):
    blank = copy.deepcopy(cell)
    blank["source"] = "raise NotImplementedError()"
    return blank


def _extra_cells(submission) -> dict:
    """Cells the learner added (no nbgrader id), keyed by the grade_id of the cell before them."""
    extras, previous = {}, None
    for cell in submission.cells:
        grade_id = _nbgrader(cell).get("grade_id")
        if grade_id:
            previous = grade_id
        elif cell["cell_type"] == "code":
            extras.setdefault(previous, []).append(copy.deepcopy(cell))
    return extras


# --- Running the submission --------------------------------------------------------------

def _kernel_dir(root: Path) -> Path:
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "graders.sandbox_kernel", "-f", "{connection_file}"],
        "display_name": "GPT-2 course sandbox", "language": "python"}))
    return root


def sandbox_env(home: Path) -> dict:
    """A scrubbed environment: nothing of the grader's but what Python needs to run."""
    keep = ("PATH", "LANG", "LC_ALL", "GPT2_COURSE_CACHE", "GPT2_COURSE_WEIGHTS",
            "GPT2_COURSE_PRETRAINED_DIR", "GPT2_COURSE_SHAKESPEARE", "GPT2_COURSE_SANDBOX_MEMORY_MB")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    if "GPT2_COURSE_CACHE" not in env:
        env["GPT2_COURSE_CACHE"] = str(Path.home() / ".cache" / "gpt2-from-scratch")
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", MPLBACKEND="Agg", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.update(pinned_reference())
    return env


def pinned_reference() -> dict:
    """The judge's reference, named explicitly for the kernel. The kernel has another HOME (and,
    confined, another file system), so left to `auto` it would not find a pretrained GPT-2 in
    the grader's Hugging Face cache and would produce outputs with other weights than the
    judge's."""
    from graders import reference

    if reference.identify().source == "synthetic":
        return {"GPT2_COURSE_WEIGHTS": "synthetic"}
    return {"GPT2_COURSE_WEIGHTS": "pretrained",
            "GPT2_COURSE_PRETRAINED_DIR": str(reference._pretrained_folder())}


@functools.lru_cache(maxsize=1)
def confinement_unavailable() -> str | None:
    """Why learner code cannot be confined here (None when it can): that needs root and private
    mount and network namespaces, which a throwaway process tries once."""
    if os.geteuid() != 0:
        return "the grader does not run as root"
    probe = subprocess.run([sys.executable, "-m", "graders.sandbox_kernel", "--probe"],
                           capture_output=True, text=True)
    if probe.returncode:
        return f"no private namespaces here ({(probe.stderr.strip().splitlines() or ['?'])[-1]})"
    return None


def uses_activations(exercise: str) -> bool:
    """Whether an exercise's grader compares with reference activations (notebooks 01-06 do;
    training and sampling checks use their own small models, and computing GPT-2 activations
    for their cases, e.g. 2,000 sequences, would only cost time and memory)."""
    from graders.common import EXERCISES

    return "activations" in vars(sys.modules[EXERCISES[exercise].produce.__module__])


def activation_file(case) -> Path:
    """The cached reference activations of `case` (a graders.common.Case), computed if missing."""
    from graders import activations, common
    from graders.paths import cache_dir

    common.activations(case)
    key = activations._key(common.reference_id().fingerprint, case.tokens())
    return cache_dir("activations") / f"{key}.safetensors"


def reference_files(wanted: dict) -> list[Path]:
    """The grader's files a confined kernel may read, made now (the judge needs them too) and
    readable by anyone: the course weights, the reference activations of the listed checks
    only, the reference model files (to compute activations it was not given), tiny Shakespeare.
    None of them is secret; the course cache as a whole is kept from the kernel."""
    from graders import common, data, reference, synthetic
    from graders.paths import cache_dir

    files = [common._weights_file()]
    for checks in wanted.values():
        if not isinstance(checks, Exception):
            files += [activation_file(common.Case(**case)) for exercise, case in checks
                      if uses_activations(exercise)]
    files += [cache_dir() / name for name in ("tokenizer-gpt2", "fingerprints",
                                              f"synthetic-gpt2-v{synthetic.VERSION}")]
    with contextlib.suppress(data.DataFileError):
        files.append(data.tinyshakespeare_path(download=False))
    if reference.identify().source == "pretrained":   # its folder, and where its links point
        folder = reference._pretrained_folder()
        files += [folder, *{p.resolve().parent for p in folder.iterdir()}]
    files = sorted({Path(os.path.abspath(f)) for f in files if f.exists()})
    for path in files:  # the cache writes files 0600 (atomic_write): let the kernel's uid read
        for where in [path, *(path.rglob("*") if path.is_dir() else ())]:
            readable = 0o555 if where.is_dir() else 0o444
            if where.stat().st_mode & readable != readable:
                where.chmod(where.stat().st_mode | readable)
    return files


def _sandbox_plan(workdir: Path, root: Path, files: list[Path], uid: int, sockets: Path) -> dict:
    """What a confined kernel sees (see graders.sandbox_kernel.confine): the system, Python and
    the graders package read-only, `files`, its own folder and sockets; a fresh /tmp and course
    cache; and nothing else of the course folder: no solutions/, .git, tests, grading output."""
    from graders.paths import cache_dir

    package = Path(__file__).parent
    system = [(p, "link" if os.path.islink(p) else "ro")
              for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
              if os.path.lexists(p)]
    mounts = system + [("/dev", "tree"), ("/proc", "tree"), ("/sys", "tree"), ("/tmp", "tmp"),
                       ("/dev/shm", "tmp"), (str(package.parent), "empty"), (str(cache_dir()), "tmp")]
    mounts += [(str(p), "ro") for p in {Path(sys.base_prefix).resolve(), Path(sys.prefix), package,
                                        package.parent / "data", *files} if p.exists()]
    mounts += [(str(workdir), "rw"), (str(sockets), "rw")]
    return {"uid": uid, "root": str(root), "cwd": str(workdir), "mounts": sorted(mounts)}


def _recording_prelude(records: Path, grade_id: str) -> str:
    return (f"import graders.common as _grading\n"
            f"_grading.Recorder.start({str(records)!r}, {grade_id!r})\n")


def run(notebook, records: Path | None, workdir: Path, limits: TimeLimits,
        confined_to: list[Path] | None = None) -> dict[int, str]:
    """Execute the restored notebook; return {cell index: problem} for cells that failed to run.

    With `records`, test cells record outputs for the judge; without, they judge in the kernel
    (the learner's own pre-submission check). With `confined_to` (a root grader), the kernel is
    confined and sees those of the grader's files only (see `_sandbox_plan`).
    """
    with tempfile.TemporaryDirectory(prefix="gpt2-kernel-") as private:
        # Outside `workdir`: a confined kernel owns that folder, and a kernelspec it could
        # rewrite would start the next kernel as root.
        os.environ["JUPYTER_PATH"] = str(_kernel_dir(Path(private)))
        env, config = sandbox_env(workdir), {}
        if confined_to is not None:
            from graders.sandbox_kernel import PLAN_ENV

            uid = secrets.randbelow(SANDBOX_UIDS[1] - SANDBOX_UIDS[0]) + SANDBOX_UIDS[0]
            root, sockets = Path(private) / "root", Path(private) / "sockets"
            root.mkdir()
            sockets.mkdir()
            for folder in (workdir, records, sockets):
                os.chown(folder, uid, uid)
            env[PLAN_ENV] = json.dumps(_sandbox_plan(workdir, root, confined_to, uid, sockets))
            # The kernel has no network: it talks to this process over Unix sockets.
            config = {"KernelManager": {"transport": "ipc", "ip": str(sockets / "kernel")}}
            try:
                return _run_kernels(notebook, records, workdir, limits, env, config)
            finally:
                _end_processes_of(uid)
        return _run_kernels(notebook, records, workdir, limits, env, config)


def _end_processes_of(uid: int) -> None:
    """Kill what learner code left running under its sandbox uid: a background process would
    otherwise outlive its notebook. Repeated while any appear (a process may fork meanwhile)."""
    import signal

    for _ in range(20):
        found = False
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == uid:
                        os.kill(int(entry.name), signal.SIGKILL)
                        found = True
        if not found:
            return


def _run_kernels(notebook, records, workdir, limits: TimeLimits, env, config) -> dict[int, str]:
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from traitlets.config import Config

    problems: dict[int, str] = {}
    test_indices = {i for i, c in enumerate(notebook.cells) if is_test_cell(c)}
    done: set[int] = set()
    for _attempt in range(MAX_RESTARTS):
        order = [i for i in range(len(notebook.cells))
                 if notebook.cells[i]["cell_type"] == "code" and i not in problems and i not in done]
        if not order:
            break
        cells = []
        for i in order:
            cell = copy.deepcopy(notebook.cells[i])
            if i in test_indices and records is not None:
                cell["source"] = _recording_prelude(records, _nbgrader(cell)["grade_id"]) + cell["source"]
            cells.append(cell)
        batch = nbformat.v4.new_notebook(cells=cells, metadata=notebook.metadata)
        current = {"index": None}
        client = NotebookClient(
            batch, timeout=limits.ordinary, timeout_func=limits.of, kernel_name=KERNEL_NAME, allow_errors=True,
            interrupt_on_timeout=True, startup_timeout=120,
            resources={"metadata": {"path": str(workdir)}},
            on_cell_start=lambda cell, cell_index: current.update(index=order[cell_index]),
            config=Config(config),
        )
        try:
            client.execute(env=env, cwd=str(workdir))
        except DeadKernelError:
            died = current["index"]
            problems[died] = "crashed: the kernel died while running this cell (os._exit, a " \
                             "segfault, or running out of memory)"
            done.update(i for i in order if i < died and i in test_indices)
            _copy_outputs(batch, order, notebook, problems, limits)
            continue
        _copy_outputs(batch, order, notebook, problems, limits)
        break
    return problems


def _copy_outputs(batch, order, notebook, problems, limits: TimeLimits) -> None:
    for cell, index in zip(batch.cells, order):
        outputs = cell.get("outputs", [])
        for output in outputs:
            if output.get("output_type") == "error" and output.get("ename") in (
                    "CellTimeoutError", "KeyboardInterrupt"):  # the harness interrupts on timeout
                problems.setdefault(index, f"timeout: the cell ran past its time limit of "
                                           f"{limits.of(cell)} s (an infinite loop, or far too slow)")
            if isinstance(output.get("text"), str) and len(output["text"]) > OUTPUT_LIMIT:
                output["text"] = output["text"][:OUTPUT_LIMIT] + "\n... [output truncated]"
        if outputs:
            notebook.cells[index]["outputs"] = outputs


# --- Judging (no learner code runs here) ----------------------------------------------------

class _AnyName(dict):
    """Names a test cell refers to that are not graders' (the learner's classes): placeholders."""
    def __missing__(self, key):
        import builtins
        import importlib
        import re

        if re.fullmatch(r"nb\d\d", key) or key == "graders":
            return importlib.import_module("graders" if key == "graders" else f"graders.{key}")
        if hasattr(builtins, key):
            raise KeyError(key)
        return f"<learner's {key}>"


def expected_checks(test_source: str) -> list[tuple[str, dict]]:
    """The (exercise, case) pairs a source test cell asks for, without running learner code."""
    from graders import common

    listed: list[tuple[str, dict]] = []
    with common.listing_checks(listed):
        exec(compile(test_source, "<test cell>", "exec"), {"__builtins__": __builtins__}, _AnyName())
    return listed


def load_records(records: Path) -> dict[str, list[dict]]:
    """Recorded outputs by test cell. Only JSON and safetensors are read: nothing executable.

    Only regular files directly in `records` count: a symlink planted there by a confined
    kernel would make this process read a file that the kernel itself could not.
    """
    from safetensors.torch import load

    by_cell: dict[str, list[dict]] = {}
    try:
        folder = os.open(records, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return by_cell
    try:
        for name in sorted(n for n in os.listdir(folder) if n.endswith(".json")):
            try:
                record = json.loads(_regular_file(folder, name))
                tensors = name[:-len(".json")] + ".safetensors"
                record["outputs"] = load(_regular_file(folder, tensors)) if record.get("tensors") else None
            except Exception:  # a malformed record counts as a missing one
                continue
            by_cell.setdefault(str(record.get("cell")), []).append(record)
    finally:
        os.close(folder)
    return by_cell


def _regular_file(folder: int, name: str) -> bytes:
    handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(handle, "rb") as f:
        if not stat.S_ISREG(os.fstat(handle).st_mode):  # a FIFO would block the grader
            raise OSError(f"{name} is not a regular file")
        return f.read()


def learner_code(notebook, source) -> str:
    """The code the learner wrote: answer cells and cells that are not the course's, without
    comments and strings."""
    import io
    import tokenize

    course_cells = {c["source"] for c in source.cells}
    parts = []
    for cell in notebook.cells:
        meta = _nbgrader(cell)
        if cell["cell_type"] == "code" and (
                meta.get("solution") or (not meta.get("grade_id") and cell["source"] not in course_cells)):
            try:
                tokens = [t for t in tokenize.generate_tokens(io.StringIO(cell["source"]).readline)
                          if t.type not in (tokenize.COMMENT, tokenize.STRING)]
                parts.append(tokenize.untokenize(tokens))
            except (tokenize.TokenError, IndentationError, SyntaxError):
                parts.append(cell["source"])
    return "\n".join(parts)


def forbidden_use(exercise: str, code: str) -> str | None:
    """The first library shortcut or grader internal the learner's code names, if any."""
    from graders.common import EXERCISES
    from graders.engine import ALWAYS_FORBIDDEN_WORDS, Forbidden, _mentions

    module = sys.modules[EXERCISES[exercise].produce.__module__]
    words = set(ALWAYS_FORBIDDEN_WORDS) | {"graders"}
    for value in vars(module).values():
        if isinstance(value, Forbidden):
            words |= set(value.source_words)
    return next((w for w in sorted(words) if _mentions(code, w)), None)


def _listed(cell) -> list[tuple[str, dict]] | Exception:
    """The checks a source test cell asks for, or why they could not be listed."""
    try:
        return expected_checks(cell["source"])
    except Exception as err:  # a source test cell we cannot read is the course's bug, not theirs
        return err


def judge_cell(cell, wanted: list[tuple[str, dict]] | Exception, records: list[dict],
               problem: str | None, cell_error: str, code: str = "") -> CellResult:
    from graders.common import EXERCISES, Case
    from graders.engine import CheckFailed

    meta = _nbgrader(cell)
    grade_id, points = meta["grade_id"], float(meta.get("points", 0))

    def failed(status: str, message: str) -> CellResult:
        return CellResult(grade_id, 0.0, points, status, message)

    if isinstance(wanted, Exception):
        return failed("error", f"grader could not list this cell's checks: {wanted}")
    for exercise, case in wanted:
        found = next((r for r in records if r.get("exercise") == exercise and r.get("case") == case), None)
        if found is None:
            status = "crashed" if problem else "error"
            if problem and problem.startswith("timeout"):
                status = "timeout"
            return failed(status, problem or cell_error or f"{exercise} did not run (an error before it?)")
        if found["outputs"] is None:
            return failed("failed", found.get("message", ""))
        used = forbidden_use(exercise, code)
        if used:
            return failed("failed", f"{exercise}: your code uses `{used}`. Build it yourself from "
                                    "tensor operations; library versions and the course's own "
                                    "graders are not allowed in answers.")
        try:
            EXERCISES[exercise].judge(Case(**case), found["outputs"])
        except CheckFailed as failure:
            return failed("failed", str(failure))
        except Exception as err:  # malformed outputs (wrong keys, types): the learner's loss
            return failed("failed", f"{exercise}: the recorded outputs are unusable ({type(err).__name__}: {err})")
    if not wanted and cell_error:
        return failed("error", cell_error)
    return CellResult(grade_id, points, points, "passed")


def _cell_error(cell) -> str:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output.get('ename')}: {output.get('evalue')}"[:2000]
    return ""


def grade_notebook(student: str, name: str, path: Path | None, workdir: Path,
                   limits: TimeLimits = TimeLimits(), flags: list[str] | None = None) -> tuple[NotebookResult, object]:
    """Grade one student's notebook; returns the result and the executed, restored notebook."""
    source = source_notebook(name)
    result = NotebookResult(student, name, flags=list(flags or []))
    if path is None:
        result.cells = [CellResult(_nbgrader(c)["grade_id"], 0.0, float(_nbgrader(c).get("points", 0)),
                                   "missing-notebook", f"{name}.ipynb was not submitted")
                        for c in test_cells(source)]
        return result, None
    try:
        submission = nbformat.read(path, as_version=4)
    except Exception as err:
        submission = nbformat.v4.new_notebook()
        result.flags.append(f"the notebook could not be read ({type(err).__name__}); graded as empty")
    notebook, restore_flags = restore(submission, source)
    result.flags += restore_flags
    records = workdir / "records"
    records.mkdir(parents=True, exist_ok=True)
    # Listing the checks imports every module the judge needs before learner code runs, and
    # the grader's files are checked afterwards: a submission cannot change the judge.
    tests = {_nbgrader(c)["grade_id"]: c for c in test_cells(source)}
    wanted = {grade_id: _listed(c) for grade_id, c in tests.items()}
    unavailable = confinement_unavailable()
    if unavailable:
        warnings.warn(f"learner code runs unconfined, with this grader's file access "
                      f"(solutions/, the course cache, other students' files): {unavailable}. "
                      "Grade as root to confine it.", RuntimeWarning, stacklevel=2)
    files = None if unavailable else reference_files(wanted)
    before = graders_snapshot()
    problems = run(notebook, records, workdir, limits, files)
    tampered = changed_graders(before)
    if tampered:
        result.flags.append(f"grader files changed while this notebook ran: {tampered}. Its tests "
                            "were judged by the grader as loaded before it ran; check those files "
                            "(e.g. `git status graders/`) before grading more.")
    recorded = load_records(records)
    code = learner_code(notebook, source)
    for index, cell in enumerate(notebook.cells):
        if is_test_cell(cell):
            grade_id = _nbgrader(cell)["grade_id"]
            result.cells.append(judge_cell(tests[grade_id], wanted[grade_id], recorded.get(grade_id, []),
                                           problems.get(index), _cell_error(cell), code))
    return result, notebook


def graders_snapshot() -> dict[Path, bytes]:
    """The bytes of every file of the graders package."""
    package = Path(__file__).resolve().parent
    return {p: p.read_bytes() for p in sorted(package.glob("*.py"))}


def changed_graders(snapshot: dict[Path, bytes]) -> list[str]:
    """Names of grader files that differ from `snapshot` (changed, added or removed).

    Nothing is written back: the judge of this run already imported every module it needs
    before learner code ran, and rewriting files could undo an instructor's own edit. The
    change is reported so that the instructor can see it and restore the files.
    """
    now = graders_snapshot()
    return sorted({p.name for p in snapshot.keys() | now.keys() if snapshot.get(p) != now.get(p)})


@contextlib.contextmanager
def scratch_dir():
    with tempfile.TemporaryDirectory(prefix="gpt2-grade-") as folder:
        yield Path(folder)
