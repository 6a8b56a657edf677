"""Finding code objects by what they compute, not by their names: a function's bytecode, its
constants and the names it uses, for it and every function nested in it. Used by the test that
walks a confined kernel for the course's sealed implementations; self-contained, because its
source is also run inside that kernel as a learner cell."""
import hashlib
import marshal
import os
import types

MIN_CODE_BYTES = 40   # shorter bytecode (a one-line accessor) is too common to say anything


def fingerprints(code: types.CodeType) -> set[str]:
    """A digest of each code object in `code` (itself and those nested in it) long enough to tell."""
    found, stack = set(), [code]
    while stack:
        current = stack.pop()
        consts = []
        for const in current.co_consts:
            if isinstance(const, types.CodeType):
                stack.append(const)
            else:
                consts.append(repr(const))
        # A comprehension or a lambda alone is too common to tell whose it is.
        if len(current.co_code) >= MIN_CODE_BYTES and not current.co_name.startswith("<"):
            digest = hashlib.sha256(current.co_code + repr((consts, current.co_names)).encode())
            found.add(digest.hexdigest())
    return found


def file_codes(path: str) -> list[types.CodeType]:
    """The module code in a .py or .pyc file (none when it does not compile or load)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".pyc"):
            return [marshal.loads(data[16:])]
        return [compile(data, path, "exec", dont_inherit=True)]
    except Exception:
        return []


def walk_files(root: str, wanted: set[str], skip=("/proc", "/sys", "/dev"), source_markers=()) -> dict[str, int]:
    """{file: how many of `wanted`'s digests its code holds} under `root`. Every .pyc is loaded;
    a .py is compiled when its text holds one of `source_markers` (lines of the wanted code:
    compiling every library source would take minutes) or when no compiled copy is beside it."""
    hits: dict[str, int] = {}
    for folder, dirs, files in os.walk(root):
        if any(folder == s or folder.startswith(s + "/") for s in skip):
            dirs[:] = []
            continue
        compiled = set(os.listdir(os.path.join(folder, "__pycache__"))) if "__pycache__" in dirs else set()
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py"):
                beside = any(c.startswith(name[:-3] + ".") for c in compiled)
                if beside and source_markers:
                    try:
                        with open(path, "rb") as f:
                            text = f.read()
                    except OSError:
                        continue
                    if not any(marker in text for marker in source_markers):
                        continue
            elif not name.endswith(".pyc"):
                continue
            count = sum(len(fingerprints(code) & wanted) for code in file_codes(path))
            if count:
                hits[path] = count
    return hits


def loaded_module_hits(wanted: set[str]) -> dict[str, int]:
    """{module: how many of `wanted`'s digests the code of its functions and classes holds}."""
    import sys

    hits: dict[str, int] = {}
    for name, module in list(sys.modules.items()):
        found = set()
        for value in list(vars(module).values()) if module is not None else ():
            members = vars(value).values() if isinstance(value, type) else [value]
            for member in members:
                code = getattr(getattr(member, "__func__", member), "__code__", None)
                if isinstance(code, types.CodeType):
                    found |= fingerprints(code) & wanted
        if found:
            hits[name] = len(found)
    return hits
