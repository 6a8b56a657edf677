"""Finding code objects by what they compute, not by their names: a function's bytecode, its
constants and the names it uses, for it and every function nested in it. Used by the test that
walks a confined kernel for the course's sealed implementations; self-contained, because its
source is also run inside that kernel as a learner cell."""
import hashlib
import importlib.util
import marshal
import os
import types
import warnings

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
        if path.endswith(".pyc"):   # another Python's bytecode can crash this one's marshal
            return [marshal.loads(data[16:])] if data[:4] == importlib.util.MAGIC_NUMBER else []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [compile(data, path, "exec", dont_inherit=True)]
    except Exception:   # not Python 3.11's: it cannot hold a code object of ours
        return []


def walk_files(root: str, wanted: set[str], skip=("/proc", "/sys", "/dev")) -> dict[str, int]:
    """{file: how many of `wanted`'s digests its code holds} under `root`. Every .pyc of this
    Python is loaded, and every .py that has no compiled copy beside it is compiled (compiling
    every library source would take minutes, and nothing in a kernel can write beside them)."""
    hits: dict[str, int] = {}
    for folder, dirs, files in os.walk(root):
        if any(folder == s or folder.startswith(s + "/") for s in skip):
            dirs[:] = []
            continue
        compiled = set(os.listdir(os.path.join(folder, "__pycache__"))) if "__pycache__" in dirs else set()
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py"):
                if any(c.startswith(name[:-3] + ".") for c in compiled):
                    continue
            elif not name.endswith(".pyc"):
                continue
            count = sum(len(fingerprints(code) & wanted) for code in file_codes(path))
            if count:
                hits[path] = count
    return hits


def loaded_module_hits(wanted: set[str]) -> dict[str, int]:
    """{module: how many of `wanted`'s digests the code of its functions and classes holds}. Read
    from the modules' own dictionaries: no attribute is computed (some modules compute them lazily)."""
    import sys

    hits: dict[str, int] = {}
    for name, module in list(sys.modules.items()):
        found = set()
        for value in list(getattr(module, "__dict__", {}).values()):
            members = list(value.__dict__.values()) if isinstance(value, type) else [value]
            for member in members:
                function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if isinstance(function, types.FunctionType):
                    found |= fingerprints(function.__code__) & wanted
        if found:
            hits[name] = len(found)
    return hits
