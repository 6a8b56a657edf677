"""The documentation stays true to the repository, and the README stays a front door.

- docs/architecture.md names every module under graders/, by its path, and nothing that does not
  exist;
- every repository path that the README or a page of docs/ names in backticks exists, every
  `graders.x.y` name is a module (or a name defined in one), and every relative Markdown link
  resolves, its #anchor included;
- every `make TARGET` they name is a target of the Makefile;
- the README is at most 170 lines, and links every page of docs/ by a relative link.

Reads files only: no kernel, no import of the course.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_LINES = 170   # the before-stop check warns past this many lines

FENCE = re.compile(r"^[ \t]*```([^\n]*)\n(.*?)^[ \t]*```", re.M | re.S)
SHELL = {"", "bash", "sh", "shell", "console"}
SPAN = re.compile(r"`([^`]+)`")
# A path of the repository, in the folders whose names are unambiguous in prose.
REPO_PATH = re.compile(r"(?<![\w./~-])((?:graders|benchmarks|tests|docs|solutions|exercises|data)/[\w./<>*-]*)")
DOTTED = re.compile(r"(?<![\w.])graders(?:\.\w+)+")
# The placeholders of docs/adding-a-notebook.md (`solutions/NN_topic.ipynb`) and of paths such as
# `grading/reports/<student>.txt`: a path holding one must match at least one real path.
PLACEHOLDERS = ((re.compile(r"<[^>]*>"), "*"), (re.compile(r"NN"), "[0-9][0-9]"),
                (re.compile(r"(?<![a-z])topic(?![a-z])"), "*"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAKE_OPTIONS_WITH_VALUE = {"-o", "-C", "-f", "-j", "-W"}


def _code(text: str) -> list[str]:
    """The code a Markdown text holds: each fenced block (shell comments dropped), each code span."""
    blocks = [re.sub(r"#.*", "", block) for _, block in FENCE.findall(text)]
    return blocks + SPAN.findall(FENCE.sub("", text))


def _prose(text: str) -> str:
    return SPAN.sub("", FENCE.sub("", text))


def _repo_paths(page: Path) -> list[str]:
    """The repository paths in the page's code spans and shell blocks (a Python block's are
    Python's: a `course_code` glob there is relative to graders/)."""
    text = page.read_text()
    code = [block for language, block in FENCE.findall(text) if language.strip() in SHELL]
    code += SPAN.findall(FENCE.sub("", text))
    return [path.rstrip(".") for piece in code for path in REPO_PATH.findall(piece)]


def _exists(path: str) -> bool:
    """Whether a path names something in the repository; a placeholder must match something."""
    pattern = path
    for placeholder, glob in PLACEHOLDERS:
        pattern = placeholder.sub(glob, pattern)
    if not any(character in pattern for character in "*?["):
        target = ROOT / path
        return target.is_dir() if path.endswith("/") else target.exists()
    return any(ROOT.glob(pattern.rstrip("/")))


def _top_level_names(module: Path) -> set[str]:
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _dotted_exists(name: str) -> bool:
    """`graders.a.b[.attr]`: the longest prefix that is a module, then a name defined in it."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[end:]
            return not rest or rest[0] in _top_level_names(module) or (base / f"{rest[0]}.py").is_file()
    return False


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _make_targets_named(page: Path) -> list[str]:
    targets = []
    for code in _code(page.read_text()):
        for command in re.findall(r"(?<![\w-])make((?:[ \t]+[^\s;&|)#]+)*)", code):
            words, skip = command.split(), False
            for word in words:
                if skip:
                    skip = False
                elif word in MAKE_OPTIONS_WITH_VALUE:
                    skip = True
                elif not (word.startswith("-") or "=" in word):
                    if not re.fullmatch(r"[a-z][\w-]*", word):
                        break
                    targets.append(word)
    return targets


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)[ \t]*:(?!=)", (ROOT / "Makefile").read_text(), re.M))


def _modules() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "graders").rglob("*.py")
                  if "__pycache__" not in path.parts)


def _architecture_names() -> set[str]:
    """What docs/architecture.md names in backticks that looks like a path or a module file,
    relative to the repository or to graders/, as a repository path."""
    names = set()
    for code in _code(ARCHITECTURE.read_text()):
        for token in re.findall(r"[\w./-]+", code):
            if "/" not in token and not token.endswith(".py"):
                continue
            token = token.rstrip(".")
            if not (ROOT / token).exists() and (ROOT / "graders" / token).exists():
                token = f"graders/{token}"
            names.add(token)
    return names


def test_the_architecture_page_names_every_module_under_graders():
    """Every `.py` file under graders/ is named in docs/architecture.md by its path (relative to
    the repository or to graders/); a package's `__init__.py` may be named by its folder."""
    names = _architecture_names()
    missing = [module for module in _modules()
               if module not in names and not (module.endswith("/__init__.py")
                                               and module.removesuffix("__init__.py") in names)]
    assert not missing, f"docs/architecture.md does not name {missing}: add a line on each"


def test_the_architecture_page_names_nothing_that_does_not_exist():
    """Every path docs/architecture.md names in backticks exists (relative to the repository or
    to graders/), and every bare `name.py` is a module under graders/. (Its `graders.x.y` names
    are checked with every page's, below.)"""
    basenames = {Path(module).name for module in _modules()}
    absent = [name for name in _architecture_names()
              if not ((ROOT / name).exists() if "/" in name else name in basenames)]
    assert not absent, f"docs/architecture.md names what does not exist: {absent}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    """Every repository path (graders/, benchmarks/, tests/, docs/, solutions/, exercises/,
    data/) the page names in backticks exists, a path with a placeholder (`NN`, `topic`,
    `<student>`) matching at least one; every `graders.x.y` it names is a module or a name
    defined in one."""
    text = page.read_text()
    absent = [path for path in _repo_paths(page) if not _exists(path)]
    absent += [name for code in _code(text) for name in DOTTED.findall(code) if not _dotted_exists(name)]
    assert not absent, f"{page.relative_to(ROOT)} names what does not exist: {absent}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_of_a_page_resolves(page):
    """Every relative Markdown link of the page leads to a file of the repository, and its
    #anchor, if any, to a heading of that file."""
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue   # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or ROOT not in linked.parents:
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} has links that do not resolve: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_make_target_a_page_names_is_in_the_makefile(page):
    """Every `make TARGET` the page names in code (a code span or a fenced block) is a target of
    the Makefile."""
    unknown = sorted(set(_make_targets_named(page)) - _makefile_targets())
    assert not unknown, f"{page.relative_to(ROOT)} names make targets the Makefile lacks: {unknown}"


def test_the_readme_stays_a_front_door():
    """The README is at most 170 lines (its depth is in docs/), and links every page of docs/
    by a relative link, `docs/<page>.md`."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES, (
        f"README.md has {len(text.splitlines())} lines: move depth into a page of docs/")
    linked = {target.partition("#")[0] for target in LINK.findall(_prose(text))}
    unlinked = [f"docs/{page.name}" for page in sorted(DOCS.glob("*.md")) if f"docs/{page.name}" not in linked]
    assert not unlinked, f"README.md does not link {unlinked}"


def test_every_path_the_code_names_in_its_docstrings_and_comments_exists():
    """A module of graders/ or benchmarks/ that points the reader at a test, a page or a notebook
    by its path points at one that exists (tests move when a catalog is split by topic)."""
    absent = []
    for module in sorted([*(ROOT / "graders").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]):
        text = module.read_text()
        for found in REPO_PATH.finditer(text):
            path = found.group(1).rstrip(".")
            quoted = text[found.start() - 1] in "\"'"   # a string the code reads, relative to graders/
            if not quoted and "..." not in path and path.endswith((".py", ".md", ".ipynb")) and not _exists(path):
                absent.append(f"{module.relative_to(ROOT)}: {path}")
    assert not absent, absent
