"""The kernel a submission runs in during grading: an IPython kernel under a memory cap.

Launched by the grading harness as `python -m graders.harness.sandbox_kernel --session JSON -f
CONNECTION_FILE`, with a scrubbed environment and its own working folder. The session (what the
kernel's checks do: graders.judging.session) is installed before IPython starts, so no learner
code runs before it. A memory bomb then fails inside the kernel
(MemoryError, or the kernel dies) and costs only the cell that ran it.

A root harness also passes a plan (`$GPT2_COURSE_SANDBOX_PLAN`, JSON, see `confine`): the
kernel then gets mount and network namespaces of its own (no network; a root holding only the
plan's paths) and drops to an unprivileged uid of its own before IPython starts. Solutions,
hidden tests, the course cache, the grading output and other students' folders are simply not
there, and only its own folders are writable.
"""
import ctypes
import json
import os
import resource
import sys

MEMORY_ENV = "GPT2_COURSE_SANDBOX_MEMORY_MB"
SESSION_ARG = "--session"
PLAN_ENV = "GPT2_COURSE_SANDBOX_PLAN"
CLONE_NEWNS, CLONE_NEWNET, PR_SET_NO_NEW_PRIVS = 0x00020000, 0x40000000, 38
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000, 0x40000)
CONNECTION_FILE = "/tmp/kernel-connection.json"  # inside the new root's private /tmp

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    encode = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(_libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)),
           f"mount {source} on {target}")


def private_namespace() -> None:
    """Mount and network namespaces of our own: nothing mounted from here on is seen by other
    processes, and there is no network (not even the grader's Dask cluster on localhost); the
    harness talks to the kernel over Unix sockets in a folder both see."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(CLONE_NEWNS | CLONE_NEWNET)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def _mountpoint(target: str, is_dir: bool, uid: int) -> None:
    """Create `target` (and missing parents, owned by `uid` so that it can write in its own
    tmpfs mounts; the rest of the new root is made read-only at the end)."""
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        _mountpoint(parent, True, uid)
    if not os.path.lexists(target):
        if is_dir:
            os.mkdir(target, 0o755)
        else:
            open(target, "x").close()
        os.chown(target, uid, uid)


def confine(plan: dict, connection_file: str) -> str:
    """Build the kernel's root and drop privileges; return the connection file's new path.

    `plan["mounts"]` lists (path, kind), each mounted at the same path in the new root:
    "ro" bound read-only, "link" a copy of a symlink (/bin -> usr/bin), "rw" bound writable
    (the kernel's folder), "tree" bound with its submounts (/dev, /proc, /sys), "tmp" a fresh
    tmpfs owned by the kernel's uid, "empty" an empty read-only tmpfs (hides a folder that a
    shallower mount would show), and (path, "over", source) the file `source` shown read-only at
    `path`.
    """
    uid, root = plan["uid"], plan["root"]
    with open(connection_file) as f:  # mode 0600, root's: read it before dropping privileges
        connection = f.read()
    private_namespace()
    size = f"size={os.environ.get(MEMORY_ENV, '8192')}m"
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    read_only = [root]
    for path, kind, *source in sorted(plan["mounts"], key=lambda m: m[0].rstrip("/").count("/")):
        target = root + path
        if kind == "over":   # a file shown as another (a sealed copy of a graders module)
            _mount(source[0], target, None, MS_BIND)
            read_only.append(target)
            continue
        if kind == "link":
            _mountpoint(os.path.dirname(target), True, uid)
            os.symlink(os.readlink(path), target)
            continue
        _mountpoint(target, os.path.isdir(path) or kind in ("tmp", "empty"), uid)
        if kind in ("tmp", "empty"):
            owner = f"uid={uid},gid={uid}," if kind == "tmp" else ""
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"{owner}mode=0755,{size}")
        else:
            _mount(path, target, None, MS_BIND | (MS_REC if kind == "tree" else 0))
        if kind == "rw":
            _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
        if kind in ("ro", "empty"):
            read_only.append(target)
    # Mount points are all made: now nothing but the kernel's own folders stays writable.
    for target in read_only:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir(plan["cwd"])
    handle = os.open(CONNECTION_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.write(handle, connection.encode())
    os.fchown(handle, uid, uid)
    os.close(handle)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    return CONNECTION_FILE


def main() -> None:
    if sys.argv[1:] == ["--probe"]:  # can this machine confine a kernel? (the harness asks once)
        private_namespace()
        return
    limit = int(os.environ.get(MEMORY_ENV, "8192")) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    args = sys.argv[1:]
    at = args.index(SESSION_ARG)
    session = args[at + 1]
    del args[at:at + 2]
    plan = os.environ.pop(PLAN_ENV, None)
    if plan:
        at = args.index("-f") + 1
        args[at] = confine(json.loads(plan), args[at])
        # A new program: nothing of this root process stays in the learner's memory.
        os.execv(sys.executable, [sys.executable, "-m", "graders.harness.sandbox_kernel",
                                  SESSION_ARG, session, *args])
    from ipykernel import kernelapp

    from graders.judging.session import Session, install

    install(Session.from_json(session))
    kernelapp.launch_new_instance(argv=args)


if __name__ == "__main__":
    main()
