"""Running a restored notebook in a fresh sandbox kernel, cell by cell, within time limits.

The kernel's session (graders.judging.session) is made here and handed to the kernel at its
start: a grading kernel's test cells record what the learner's code produced. A kernel that dies (os._exit, a
segfault, memory) is restarted; the cell that killed it is skipped and the learner's other
cells are replayed, so only the affected tests are lost. So is a confined kernel that floods the
host folders it writes (graders.integrity.disk_watch), after those folders are emptied.
"""
from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
from pathlib import Path

import nbformat

from graders.harness.cells import KERNEL_NAME, cell_label, is_test_cell, name_cells, nbgrader_meta
from graders.harness.limits import TimeLimits
from graders.integrity.host import DiskWatch, KernelPlan, confine, kernel_argv, sandbox_env
from graders.judging.session import Session

MAX_RESTARTS = 6
OUTPUT_LIMIT = 20_000  # characters kept per cell output: a flood never reaches the gradebook


def _kernel_dir(root: Path, session: Session) -> Path:
    """The folder of kernelspecs holding this session's kernel."""
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": kernel_argv(session.to_json()),
        # Interrupted by a message: a signal would reach bubblewrap, not the kernel inside it.
        "display_name": "GPT-2 course sandbox", "language": "python", "interrupt_mode": "message"}))
    return root / "kernels"


def run(notebook, records: Path | None, workdir: Path, limits: TimeLimits, kernel: KernelPlan | None = None,
        inputs_dir: Path | None = None, demonstrations: bool = True, around_test_cells: tuple | None = None,
        deliveries: Path | None = None) -> dict[int, str]:
    """Execute the restored notebook; return {cell index: problem} for cells that failed to run.

    With `records`, test cells record outputs for the judge and receive their inputs from
    `inputs_dir` (reference activations are withheld); without, they judge in the kernel (the
    learner's own pre-submission check). `kernel` is a grading kernel's plan
    (graders.integrity.host): the test cells it grades (the others are graded in another kernel),
    whether it stops after the last of them, the notebook's given parts, the torch kernels it has
    refused, and its confinement, if any. Without `demonstrations`, the demonstration cells skip
    themselves, as they do in grading. `around_test_cells` is a pair of callables, each given a
    test cell's grade_id, called as it starts and when it has run; the kernel takes what the first
    leaves in `deliveries` (graders.integrity.deliveries).
    """
    given, refused = (kernel.given, kernel.refused_kernels) if kernel else ((), ())
    session = Session(records, inputs_dir, demonstrations and records is None, given, deliveries, refused)
    tests, stop = (set(kernel.tests), kernel.stop) if kernel else (None, False)
    with tempfile.TemporaryDirectory(prefix="gpt2-kernel-") as private:
        # Outside `workdir`: a confined kernel owns that folder, and a kernelspec it could
        # rewrite would start the next kernel as root. Found by this kernel's manager only (not
        # through JUPYTER_PATH): other kernels of the same grading may be starting meanwhile.
        specs = _kernel_dir(Path(private), session)
        env = sandbox_env(workdir)
        if kernel is not None and kernel.confinement is not None:
            config, watched = confine(kernel.confinement, env, workdir, records, Path(private), deliveries)
            return _run_kernels(notebook, records, workdir, limits, env, config, specs, tests, stop,
                                around_test_cells, watched=watched)
        # Unix sockets in this private folder rather than TCP on localhost: no other user can
        # connect, and the kernel has no plain-text TCP to warn about.
        config = {"KernelManager": {"transport": "ipc", "ip": str(Path(private) / "kernel")}}
        return _run_kernels(notebook, records, workdir, limits, env, config, specs, tests, stop,
                            around_test_cells)


def _test_cell_prelude(grade_id: str) -> str:
    """The line a grading kernel runs before a test cell: its checks record under its id."""
    return f"from graders.judging.session import enter_cell as _enter_cell; _enter_cell({grade_id!r})\n"


def _run_kernels(notebook, records, workdir, limits: TimeLimits, env, config, specs: Path, tests=None,
                 stop=False, around_test_cells=None, watched: tuple[Path, ...] = ()) -> dict[int, str]:
    """`watched`: the host folders a confined kernel writes (graders.integrity.disk_watch)."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from traitlets.config import Config

    problems: dict[int, str] = {}
    test_indices = {i for i, c in enumerate(notebook.cells) if is_test_cell(c)}
    done = {i for i in test_indices if tests is not None and nbgrader_meta(notebook.cells[i])["grade_id"] not in tests}
    if stop:
        done |= set(range(max(test_indices - done, default=-1) + 1, len(notebook.cells)))
    for _attempt in range(MAX_RESTARTS):
        order = [i for i in range(len(notebook.cells))
                 if notebook.cells[i]["cell_type"] == "code" and i not in problems and i not in done]
        if not order:
            break
        cells = []
        for i in order:
            cell = copy.deepcopy(notebook.cells[i])
            if i in test_indices and records is not None:
                cell["source"] = _test_cell_prelude(nbgrader_meta(cell)["grade_id"]) + cell["source"]
            cells.append(cell)
        batch = nbformat.v4.new_notebook(cells=cells, metadata=notebook.metadata)
        current = {"index": None}
        before, after = around_test_cells or (None, None)

        def started(index: int) -> None:
            current.update(index=index)
            if before and index in test_indices:
                before(nbgrader_meta(notebook.cells[index])["grade_id"])

        def ended(index: int) -> None:
            if after and index in test_indices:
                after(nbgrader_meta(notebook.cells[index])["grade_id"])
        manager = AsyncKernelManager(kernel_name=KERNEL_NAME, config=Config(config),
                                     kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)]))
        client = NotebookClient(
            batch, km=manager, timeout=limits.ordinary, timeout_func=limits.of, kernel_name=KERNEL_NAME,
            allow_errors=True,
            interrupt_on_timeout=True, startup_timeout=120,
            # Every cell has run and its outputs and records are in: a kernel asked to shut
            # down took 1-2.5 s to exit (torch's teardown), at 2.5 s being sent SIGTERM.
            shutdown_kernel="immediate",
            resources={"metadata": {"path": str(workdir)}},
            on_cell_start=lambda cell, cell_index: started(order[cell_index]),
            on_cell_executed=lambda cell, cell_index, execute_reply: ended(order[cell_index]),
            config=Config(config),
        )

        def stop_kernel() -> None:   # its launcher is bubblewrap, which takes the kernel with it
            process = getattr(manager.provisioner, "process", None)
            if process is not None:
                process.kill()
        watch = DiskWatch(list(watched), stop_kernel) if watched else contextlib.nullcontext()
        try:
            with watch:
                client.execute(env=env, cwd=str(workdir))
        except DeadKernelError:
            died = current["index"]
            if getattr(watch, "exceeded", None):   # none of its records count; the others were taken
                for folder in watched:
                    _empty(folder)
                problems[died] = f"stopped: this cell wrote {watch.exceeded} to the grader's disk"
            else:
                ended(died)   # what its checks recorded before the kernel died still counts
                problems[died] = "crashed: the kernel died while running this cell (os._exit, a " \
                                 "segfault, or running out of memory)"
            done.update(i for i in order if i < died and i in test_indices)
            _copy_outputs(batch, order, notebook, problems, limits)
            continue
        _copy_outputs(batch, order, notebook, problems, limits)
        break
    return problems


def _empty(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _copy_outputs(batch, order, notebook, problems, limits: TimeLimits) -> None:
    """Each executed cell's outputs into `notebook`: time limits found, floods cut, and the cells
    a traceback names called what they are (graders.harness.cells.cell_label), not by the
    kernel's execution counter."""
    labels = {cell["execution_count"]: cell_label(notebook.cells[index])
              for cell, index in zip(batch.cells, order) if cell.get("execution_count")}
    for cell, index in zip(batch.cells, order):
        outputs = cell.get("outputs", [])
        for output in outputs:
            name_cells(output, labels)
            if output.get("output_type") == "error" and output.get("ename") in (
                    "CellTimeoutError", "KeyboardInterrupt"):  # the harness interrupts on timeout
                problems.setdefault(index, f"timeout: the cell ran past its time limit of "
                                           f"{limits.of(cell)} s (an infinite loop, or far too slow)")
            if isinstance(output.get("text"), str) and len(output["text"]) > OUTPUT_LIMIT:
                output["text"] = output["text"][:OUTPUT_LIMIT] + "\n... [output truncated]"
        if outputs:
            notebook.cells[index]["outputs"] = outputs


@contextlib.contextmanager
def scratch_dir():
    with tempfile.TemporaryDirectory(prefix="gpt2-grade-") as folder:
        yield Path(folder)
