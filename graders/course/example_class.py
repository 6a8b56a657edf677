"""The bundled example class, generated from solutions/ and exercises/ (never edited by hand).

`python -m graders.course.example_class OUT` writes nbgrader's `submitted/<student>/<notebook>/` layout:
- perfect: every answer cell holds the solution;
- untouched: the released notebooks as they are;
- partial: solved 01-03 only;
- buggy: a typical mistake in each notebook (each notebook's declared example bug);
- crasher: perfect, except that Attention.forward kills its kernel with os._exit; hands in
  01-06 only (the later notebooks are reported as not handed in; their gradings, 07's training
  runs the longest, would repeat the perfect student's).
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from graders.course.notebooks import EXERCISES, SOLUTIONS, notebook_names


def _bugs() -> list[tuple[str, str, str, str]]:
    """(notebook, answer cell, text in the solution, replacement): the classic mistake each
    graded notebook declares (graders.exercises.nbNN.NOTEBOOK.example_bug)."""
    from graders.exercises import declaration
    from graders.harness.manifest import notebook_checks

    bugs = [(name, declaration(name).example_bug) for name in notebook_names() if notebook_checks(name)]
    return [(name, bug.answer, bug.find, bug.replace) for name, bug in bugs]


BUGS = _bugs()
CRASHER_STOPS_AFTER = "06_gpt2"
CRASH = ("03_attention", "attention_answer", "        x = normalized_resid_pre\n",
         "        import os; os._exit(1)\n        x = normalized_resid_pre\n")


def solution_answers(name: str) -> dict[str, str]:
    """The solution notebook's answer cells, solution markers removed, by grade_id."""
    answers = {}
    for cell in nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            answers[meta["grade_id"]] = "\n".join(
                line for line in cell.source.splitlines()
                if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))
    return answers


def submission(name: str, solved: bool, edits=()) -> nbformat.NotebookNode:
    """The released notebook, with answers filled in when `solved`, then `edits` applied."""
    notebook = nbformat.read(EXERCISES / f"{name}.ipynb", as_version=4)
    answers = solution_answers(name) if solved else {}
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
        for notebook_name, cell_id, old, new in edits:
            if notebook_name == name and cell_id == grade_id:
                if old not in cell.source:
                    raise ValueError(f"{name}/{cell_id}: the solution no longer contains {old!r}")
                cell.source = cell.source.replace(old, new)
    return notebook


def students() -> dict[str, dict[str, nbformat.NotebookNode]]:
    names = notebook_names()
    return {
        "perfect": {n: submission(n, True) for n in names},
        "untouched": {n: submission(n, False) for n in names},
        "partial": {n: submission(n, n[:2] <= "03") for n in names},
        "buggy": {n: submission(n, True, BUGS) for n in names},
        "crasher": {n: submission(n, True, [CRASH]) for n in names if n <= CRASHER_STOPS_AFTER},
    }


def write(out: Path) -> Path:
    for student, notebooks in students().items():
        for name, notebook in notebooks.items():
            target = out / "submitted" / student / name / f"{name}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(copy.deepcopy(notebook), target)
    return out


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m graders.course.example_class", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?", default=Path("build/example_class"), metavar="OUT",
                        help="the folder to write the class to (default: build/example_class)")
    args = parser.parse_args(argv)
    print(f"example class written to {write(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
