"""The course's answers are marked where they are defined (graders.marks.course_answer), and the
kernel views seal exactly what is marked: a mark that is not read, or names nothing a notebook
grades, would leave an answer in the kernel unnoticed."""
import ast
import re

from graders.exercises import declared_notebooks
from graders.harness.cells import source_notebook
from graders.integrity import kernel_view
from graders.integrity.course_answers import course_answers
from graders.integrity.origins import PACKAGE


def test_every_mark_is_on_a_top_level_definition_and_is_read():
    """A mark inside a class or function, or with a name that is not a plain string, is not read
    from the source: it must not be written (it would protect nothing)."""
    written = 0
    for path in PACKAGE.rglob("*.py"):
        if path.name == "marks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "course_answer":
                written += 1
    assert written == len(course_answers()) > 0


def _defined_in_solutions() -> set[str]:
    """The top-level functions and classes the solution notebooks' cells define."""
    names = set()
    for notebook in declared_notebooks():
        for cell in source_notebook(notebook).cells:
            if cell.cell_type == "code":
                try:
                    tree = ast.parse(cell.source)
                except SyntaxError:   # IPython magics
                    continue
                names |= {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return names


def test_every_mark_names_what_a_notebook_defines():
    """The name a mark gives is the notebook's name for the answer (a function or class its
    learners write), so the kernel plan can tell which check grades it; 11's hidden texts are the
    one kind of mark that names a check's input instead."""
    defined = _defined_in_solutions() | {"hidden_text", "hidden_corpus"}
    unknown = {(answer.path.name, answer.symbol, answer.named) for answer in course_answers()
               if answer.named not in defined}
    assert not unknown, f"marks naming nothing a notebook defines: {sorted(unknown)}"


def test_a_marked_answer_is_sealed_in_a_kernel_that_does_not_run_it():
    """The course's LayerNorm is marked in graders/reference/components.py and sealed in the kernel
    of 06, whose checks never run it (06's given cells import its parts from the learner's)."""
    components = (PACKAGE / "reference" / "components.py").resolve()
    assert "LayerNorm" in {a.symbol for a in course_answers() if a.path == components}
    assert "LayerNorm" in kernel_view.sealed("01_layernorm", ()).get(components, set())


def _machinery() -> list:
    from graders.integrity.origins import is_machinery

    return [path for path in sorted(PACKAGE.rglob("*.py")) if is_machinery(path)]


def test_machinery_is_marked_where_it_is_written_and_holds_no_answer():
    """A file that says its code may run inside the learner's code (RUNS_IN_LEARNER_CODE = True)
    is never sealed and counts as machinery, not as the course's answers: it must hold no marked
    answer, and the mark is read only as a module-level assignment to True (a line in a docstring,
    or the name set inside a function, marks nothing)."""
    from graders.integrity.origins import MACHINERY_MARK, is_machinery

    machinery = _machinery()
    assert PACKAGE / "judging" / "compare.py" in machinery and PACKAGE / "marks.py" in machinery
    answered = {answer.path for answer in course_answers()}
    assert not answered & set(machinery), sorted(answered & set(machinery))
    written = [path for path in PACKAGE.rglob("*.py")
               if re.search(rf"^{MACHINERY_MARK} = True", path.read_text(), re.M)]
    assert sorted(written) == machinery
    assert not any(is_machinery(answer) for answer in answered)


def test_the_mark_is_read_only_as_a_module_level_true(tmp_path):
    from graders.integrity.origins import is_machinery

    cases = {"marked.py": "import os\n\nRUNS_IN_LEARNER_CODE = True\n",
             "in_docstring.py": '"""\nRUNS_IN_LEARNER_CODE = True\n"""\n',
             "in_function.py": "def f():\n    RUNS_IN_LEARNER_CODE = True\n",
             "false.py": "RUNS_IN_LEARNER_CODE = False\n", "unparsable.py": "RUNS_IN_LEARNER_CODE = True\ndef (\n"}
    for name, source in cases.items():
        (tmp_path / name).write_text(source)
    assert [name for name in cases if is_machinery(tmp_path / name)] == ["marked.py"]


def test_no_machinery_file_is_sealed():
    from graders.exercises import declared_notebooks

    machinery = set(_machinery())
    for notebook in declared_notebooks():
        assert not machinery & set(kernel_view.sealed(notebook, ())), notebook
