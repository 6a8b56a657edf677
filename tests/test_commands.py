"""Every command answers --help: each module of graders with a `__main__` block (`python -m ...`)
prints its usage for --help and for -h and exits 0, without running and without a traceback, and
a wrong argument gets argparse's one-line error; each benchmark (`python benchmarks/....py`)
answers --help without running. The commands are found by their `__main__` blocks, so a new one
cannot forget it, and every command the README, the Makefile and docs/ name is among them."""
import ast
import os
import re
import subprocess
import sys

import pytest

from graders.layout import ROOT


def _is_command(path) -> bool:
    return any(isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
               for node in ast.parse(path.read_text()).body)


MODULES = sorted(".".join(path.relative_to(ROOT).with_suffix("").parts)
                 for path in (ROOT / "graders").rglob("*.py") if _is_command(path))
BENCHMARKS = sorted(path.name for path in (ROOT / "benchmarks").glob("*.py") if _is_command(path))
# (how it is started, the program its usage names, the flag): a benchmark is asked --help only,
# each run costs its imports (torch, for several)
COMMANDS = [(["-m", module], f"python -m {module}", flag) for module in MODULES for flag in ("--help", "-h")] + \
    [([str(ROOT / "benchmarks" / name)], name, "--help") for name in BENCHMARKS]


def _run(command: list[str], argument: str, folder):
    """The command started as a user starts it, in an empty `folder`, with this checkout's graders."""
    return subprocess.run([sys.executable, *command, argument], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_the_commands_the_course_documents_are_found_by_their_main_blocks():
    modules, benchmarks = set(), set()
    for path in [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").rglob("*.md")]:
        modules |= set(re.findall(r"-m (graders(?:\.\w+)+)", path.read_text()))
        benchmarks |= set(re.findall(r"benchmarks/(\w+\.py)", path.read_text()))
    assert modules and modules <= set(MODULES), modules - set(MODULES)
    assert benchmarks and benchmarks <= set(BENCHMARKS), benchmarks - set(BENCHMARKS)


@pytest.mark.parametrize("command, program, flag", COMMANDS, ids=[f"{program} {flag}" for _, program, flag in COMMANDS])
def test_a_command_answers_help_with_its_usage_without_running(command, program, flag, tmp_path):
    run = _run(command, flag, tmp_path)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stdout.startswith(f"usage: {program}"), run.stdout[:1000]
    assert not list(tmp_path.iterdir()), "it ran: it wrote where it was started"


@pytest.mark.parametrize("module", MODULES)
def test_a_wrong_argument_is_argparses_one_line_error(module, tmp_path):
    run = _run(["-m", module], "--no-such-option", tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.splitlines()[-1].startswith(f"python -m {module}: error: "), run.stderr
