"""Exercises are generated from the solution notebooks by nbgrader, never edited by hand.

`python -m graders.course.notebooks exercises` (what `make exercises` runs) rewrites `exercises/` from
`solutions/`; `python -m graders.course.notebooks release DIR` (what `make release` runs) makes DIR
an nbgrader course: each notebook an assignment in DIR/gradebook.db, its student version in
DIR/release/<notebook>/, ready for `nbgrader release_assignment` or an LMS upload.
"""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from graders.layout import EXERCISES, ROOT, SOLUTIONS, notebook_names  # noqa: F401  (the course's names)


def venv_env() -> dict:
    """The environment with this interpreter's bin/ first on PATH (nbgrader calls `alembic`)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def gradable(names: list[str]) -> None:
    """Refuse to build the course when a source test cell cannot be read without running it
    (graders.harness.manifest): such a cell would otherwise score 0 for everybody."""
    from graders.harness.manifest import UnreadableTestCell, notebook_checks

    problems = [str(checks) for name in names for checks in notebook_checks(name).values()
                if isinstance(checks, UnreadableTestCell)]
    if problems:
        raise UnreadableTestCell("the course cannot be built:\n  " + "\n  ".join(problems))


def generate(out_dir: Path, names: list[str] | None = None) -> list[Path]:
    """The student notebooks, as `release` makes them in a throwaway course, written to out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as course:
        return [Path(shutil.copy(path, out_dir / path.name)) for path in release(Path(course), names)]


class ReleaseError(RuntimeError):
    """nbgrader refused to generate an assignment (the message has nbgrader's reason)."""


def release(course: Path, names: list[str] | None = None) -> list[Path]:
    """Make `course` an nbgrader course: source/<nb>/<nb>.ipynb from solutions/, then nbgrader's
    generate_assignment for each, which records the assignment (its cells and points) in the
    course's gradebook and writes the student version to release/<nb>/<nb>.ipynb. Run again, it
    brings the course up to date with solutions/ (submissions and grades are kept)."""
    from nbgrader.converters import GenerateAssignment
    from nbgrader.converters.base import NbGraderException

    gradable(names or notebook_names())
    os.environ["PATH"] = venv_env()["PATH"]  # a new gradebook asks the `alembic` command its version
    from graders.harness.gradebook import nbgrader_course

    coursedir, config = nbgrader_course(course)
    released = []
    for name in names or notebook_names():
        source = Path(coursedir.format_path(coursedir.source_directory, ".", name), f"{name}.ipynb")
        source.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOLUTIONS / f"{name}.ipynb", source)
        coursedir.assignment_id = name
        converter = GenerateAssignment(coursedir=coursedir, config=config)
        converter.force = converter.create_assignment = True
        try:
            converter.start()
        except NbGraderException as err:
            raise ReleaseError(f"nbgrader generate_assignment {name} failed in {course}: {err}") from None
        released.append(Path(coursedir.format_path(coursedir.release_directory, ".", name), f"{name}.ipynb"))
    return released


def run_solutions(out_dir: Path, names: list[str] | None = None) -> list[str]:
    """Execute the solution notebooks in order (the reference run), saving each with an HTML copy.

    Returns the names of those that failed; a failure does not stop the others.
    """
    import time

    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    out_dir.mkdir(parents=True, exist_ok=True)
    names = names or notebook_names()
    failed = []
    for number, name in enumerate(names, 1):
        start = time.time()
        notebook = nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)
        status = "ok"
        try:
            # Test cells are tagged raises-exception (Run All goes on past a learner's failing
            # check); a solution's failing check is still a failure of the reference run.
            NotebookClient(notebook, timeout=1800, kernel_name="python3", force_raise_errors=True,
                           resources={"metadata": {"path": str(SOLUTIONS)}}).execute()
        except Exception as err:  # keep going: the HTML shows where it failed
            status = f"FAILED ({type(err).__name__})"
            failed.append(name)
        nbformat.write(notebook, out_dir / f"{name}.ipynb")
        html, _ = HTMLExporter(template_name="lab").from_notebook_node(notebook)
        (out_dir / f"{name}.html").write_text(html)
        print(f"[{number}/{len(names)}] {name}: {status} in {time.time() - start:.0f} s", flush=True)
    return failed


def stripped(path: Path) -> dict:
    """A notebook's JSON without outputs or execution counts (what we commit)."""
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return notebook


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m graders.course.notebooks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("exercises", help="regenerate exercises/ from solutions/")
    release_parser = sub.add_parser("release", help="make a folder an nbgrader course of every notebook")
    release_parser.add_argument("course_dir", type=Path)
    run = sub.add_parser("run-solutions", help="execute every solution notebook into a folder, with HTML")
    run.add_argument("out_dir", type=Path)
    run.add_argument("names", nargs="*", help="only these notebooks (file stems); default: all")
    args = parser.parse_args(argv)
    from graders.judging.testcells import UnreadableTestCell

    try:
        if args.command == "exercises":
            for path in generate(EXERCISES):
                print(f"wrote {path.relative_to(ROOT)}")
        elif args.command == "run-solutions":
            failed = run_solutions(args.out_dir, args.names)
            if failed:
                print(f"{len(failed)} solution notebook(s) failed: {', '.join(failed)} (see their HTML)")
                return 1
        else:
            for path in release(args.course_dir):
                print(f"released {path}")
    except (ReleaseError, UnreadableTestCell) as err:   # the instructor's to fix: the message alone
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
