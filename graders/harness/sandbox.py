"""The learner's kernel: a scrubbed environment, and (for a root grader) a confined file system.

A confined kernel (see `graders.harness.sandbox_kernel.confine`) sees the system, Python and the
graders package read-only, the latter as its notebook's kernel view (the course's
implementations and judges sealed: graders.harness.kernel_view); the course weights it loads
the learner's modules with; the tokenizer files; tiny Shakespeare; the inputs its checks
receive; its own folder and sockets; a fresh /tmp and course cache. It never sees the reference
activations, the reference model's own files, solutions/, .git, the grading output or other
students' folders.
"""
from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

SANDBOX_UIDS = (1_000_000_000, 2_000_000_000)  # no account has these: each kernel draws its own


def sandbox_env(home: Path) -> dict:
    """A scrubbed environment: nothing of the grader's but what Python needs to run."""
    from graders.reference.store import pinned_env, reference_id

    keep = ("PATH", "LANG", "LC_ALL", "GPT2_COURSE_CACHE", "GPT2_COURSE_SHAKESPEARE",
            "GPT2_COURSE_SANDBOX_MEMORY_MB")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    if "GPT2_COURSE_CACHE" not in env:
        env["GPT2_COURSE_CACHE"] = str(Path.home() / ".cache" / "gpt2-from-scratch")
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", MPLBACKEND="Agg", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               # The kernel runs the graders this grader runs (a checkout's own, not another
               # one an editable install points at), mounted where it is when confined.
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    # matplotlib's font list, kept in the course cache: under the fresh HOME every kernel
    # rebuilt it (0.4 s). A confined kernel's course cache is a fresh tmpfs: it builds its own.
    env["MPLCONFIGDIR"] = str(Path(env["GPT2_COURSE_CACHE"]) / "matplotlib")
    # The judge's reference, named for the kernel: it has another HOME (and, confined, another
    # file system), so left to `auto` it would pick other weights than the judge's.
    env["GPT2_COURSE_WEIGHTS"] = reference_id().source
    env.update(pinned_env())
    return env


@functools.lru_cache(maxsize=1)
def confinement_unavailable() -> str | None:
    """Why learner code cannot be confined here (None when it can): that needs root and private
    mount and network namespaces, which a throwaway process tries once."""
    if os.geteuid() != 0:
        return "the grader does not run as root"
    probe = subprocess.run([sys.executable, "-m", "graders.harness.sandbox_kernel", "--probe"],
                           capture_output=True, text=True)
    if probe.returncode:
        return f"no private namespaces here ({(probe.stderr.strip().splitlines() or ['?'])[-1]})"
    return None


def unconfined_notice(why: str) -> str:
    """What an instructor is told, once at the start of grading, when kernels cannot be confined."""
    return (f"NOT CONFINED: {why}. Learner code will run with your own file access and network: it "
            "can read solutions/ (and the hidden tests in them), the course's implementations, the "
            "course cache and other students' folders. An answer that is the course's own code still "
            "fails its check (graders/judging/provenance.py), but code that first disables that "
            "check is not stopped. To confine every kernel, grade as root (sudo make grade ...) or "
            "inside a container.")


def kernel_files(inputs_dir: Path) -> list[Path]:
    """The grader's files a confined kernel may read, made readable by its uid: the course
    weights (learner modules are loaded with them), the tokenizer, tiny Shakespeare and the
    inputs its checks receive. None of them holds an expected output."""
    from graders.reference import data
    from graders.reference.paths import cache_dir
    from graders.reference.store import weights_file

    files = [weights_file(), cache_dir("tokenizer-gpt2"), inputs_dir]
    with contextlib.suppress(data.DataFileError):
        files.append(data.tinyshakespeare_path(download=False))
    files = sorted({Path(os.path.abspath(f)) for f in files if f.exists()})
    for path in files:  # the cache writes files 0600 (atomic_write): let the kernel's uid read
        for where in [path, *(path.rglob("*") if path.is_dir() else ())]:
            readable = 0o555 if where.is_dir() else 0o444
            if where.stat().st_mode & readable != readable:
                where.chmod(where.stat().st_mode | readable)
    return files


def sandbox_plan(workdir: Path, root: Path, files: list[Path], uid: int, sockets: Path,
                 overlays: list[tuple[Path, Path]] = ()) -> dict:
    """What a confined kernel sees: the system, Python and the graders package read-only (with
    each of `overlays`' files shown as its sealed copy: graders.harness.kernel_view), `files`,
    its own folder and sockets; a fresh /tmp and course cache; nothing else of the course folder."""
    from graders.reference.paths import cache_dir

    package = Path(__file__).resolve().parents[1]
    system = [(p, "link" if os.path.islink(p) else "ro")
              for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
              if os.path.lexists(p)]
    mounts = system + [("/dev", "tree"), ("/proc", "tree"), ("/sys", "tree"), ("/tmp", "tmp"),
                       ("/dev/shm", "tmp"), (str(package.parent), "empty"), (str(cache_dir()), "tmp")]
    mounts += [(str(p), "ro") for p in {Path(sys.base_prefix).resolve(), Path(sys.prefix), package,
                                        package.parent / "data", *files} if p.exists()]
    mounts += [(str(workdir), "rw"), (str(sockets), "rw")]
    mounts += [(str(path), "over", str(copy)) for path, copy in overlays]
    return {"uid": uid, "root": str(root), "cwd": str(workdir), "mounts": sorted(mounts)}


def end_processes_of(uid: int) -> None:
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
