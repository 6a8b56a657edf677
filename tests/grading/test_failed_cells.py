"""An answer cell that does not run (a SyntaxError, an exception while it runs) is named at its
check with the error and its line, in the learner's kernel and in grading alike, instead of a bare
NameError; and a traceback in `make check` or a graded notebook names a cell by what it defines,
not by the kernel's execution counter ("Cell In[7]")."""
from __future__ import annotations

import re

import nbformat
import pytest

from graders.course import example_class
from graders.harness import grading
from graders.harness.check import check_cells
from graders.harness.execute import scratch_dir
from graders.judging.failed_cells import DidNotRun, defined_names, did_not_run

SYNTAX_ERROR = "def text_to_bytes(text):\n    return list(text.encode('utf-8')\n\n\ndef bytes_to_text(values):\n" \
               "    return bytes(values).decode('utf-8')\n"
STDLIB_RE = "import re\n\nPATTERN = re.compile(r\"\"\" ?\\p{L}+| ?\\p{N}+|\\s+\"\"\")\n\n\n" \
            "def pretokenize(text):\n    return PATTERN.findall(text)\n"
CRASH_INSIDE = "def decode(ids):\n    ids = list(ids)\n    return ids[10**9]\n"


@pytest.fixture
def shell():
    """An IPython shell of this process whose cells are watched as a learner's kernel watches them."""
    from IPython.core.interactiveshell import InteractiveShell

    from graders.judging.session import CellHistory

    shell = InteractiveShell.instance()
    CellHistory(shell)
    yield shell
    InteractiveShell.clear_instance()


def test_a_cell_that_does_not_parse_leaves_stand_ins_that_name_its_error_and_line(shell):
    shell.run_cell(SYNTAX_ERROR)
    for name in ("text_to_bytes", "bytes_to_text"):
        assert isinstance(shell.user_ns[name], DidNotRun)
    assert str(did_not_run("bytes", (shell.user_ns["bytes_to_text"],))) == (
        "bytes: the cell that defines `bytes_to_text` did not run: it raised SyntaxError at its line 2 "
        "(`return list(text.encode('utf-8')`): '(' was never closed. Fix that cell and run it again.")


def test_a_cell_that_raises_leaves_stand_ins_for_what_it_did_not_define_only(shell):
    shell.run_cell("def pretokenize(text):\n    return text.split()\n")   # an earlier run that worked
    shell.run_cell("def helper(x):\n    return x\n\n" + STDLIB_RE)
    assert not isinstance(shell.user_ns["helper"], DidNotRun)   # defined before the line that raised: it ran
    stale = shell.user_ns["pretokenize"]
    assert isinstance(stale, DidNotRun), stale   # the earlier version is not what the cell says now
    with pytest.raises(AssertionError, match=r"the cell that defines `pretokenize` did not run: it raised re\.error "
                                             r"at its line 6 \(`PATTERN = re\.compile.*`\): bad escape \\p"):
        stale("a demonstration calls it")
    shell.run_cell(STDLIB_RE.replace("\\p{L}", "[a-z]").replace("\\p{N}", "[0-9]"))
    assert shell.user_ns["pretokenize"]("ab 12") == ["ab", " 12"]   # fixed and run again: the learner's own


def test_names_of_a_cell_are_read_even_when_it_does_not_parse():
    assert defined_names("class A:\n    def inner(self): pass\nasync def b(:\n") == ["A", "b"]
    assert defined_names("import x\n\ndef f():\n    pass\n") == ["f"]


def test_a_demonstration_waits_for_an_answer_whose_cell_did_not_run(shell, capsys):
    from graders.judging.progress import ready

    shell.run_cell(STDLIB_RE)
    assert not ready(shell.user_ns["pretokenize"])
    assert "needs your pretokenize (the cell that defines it did not run: it raised re.error at its line 3" \
        in capsys.readouterr().out


NAME = "11_tokenizer"


def _broken_tokenizer():
    """11 unanswered but for three answer cells: one that does not parse, one that raises as it runs
    (the stdlib's `re` does not know `\\p{L}`), a correct one, and a decode that crashes inside."""
    notebook = example_class.submission(NAME, False)
    answers = example_class.solution_answers(NAME)
    sources = {"bytes_answer": SYNTAX_ERROR, "pretokenize_answer": STDLIB_RE,
               "table_answer": answers["table_answer"], "decode_answer": CRASH_INSIDE}
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.source = sources.get(grade_id, cell.source)
    return notebook


@pytest.mark.slow
def test_a_check_below_a_cell_that_did_not_run_says_why_in_make_check_and_in_the_grade(tmp_path):
    path = tmp_path / f"{NAME}.ipynb"
    nbformat.write(_broken_tokenizer(), path)
    shown = {grade_id: (earned, diagnosis) for grade_id, earned, _, diagnosis in check_cells(path)}
    with scratch_dir() as workdir:
        graded, executed = grading.grade_notebook("learner", NAME, path, workdir)
    said = {c.grade_id: c for c in graded.cells}
    expected = {
        "bytes_test": "text_to_bytes and bytes_to_text: the cell that defines `text_to_bytes` did not run: it raised "
                      "SyntaxError at its line 2 (`return list(text.encode('utf-8')`): '(' was never closed. "
                      "Fix that cell and run it again.",
        "pretokenize_test": "pretokenize: the cell that defines `pretokenize` did not run: it raised re.error at "
                            "its line 3 (`PATTERN = re.compile(r\"\"\" ?\\p{L}+| ?\\p{N}+|\\s+\"\"\")`): bad "
                            "escape \\p at position 2. Fix that cell and run it again.",
    }
    for grade_id, message in expected.items():
        assert said[grade_id].points == 0 and said[grade_id].message == message, said[grade_id]
        assert shown[grade_id][0] == 0 and message in " ".join(shown[grade_id][1].split()), shown[grade_id]
        assert "NameError" not in shown[grade_id][1]
    assert said["table_test"].status == "passed" and shown["table_test"][0] == said["table_test"].max_points

    # make check's traceback and the graded notebook's name the cell, never the kernel's counter
    decode_crash = shown["decode_test"][1]
    assert "IndexError raised in your code:" in decode_crash, decode_crash
    assert "the answer cell of `decode`, line 3, in decode" in decode_crash, decode_crash
    answer = next(c for c in executed.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "pretokenize_answer")
    [error] = [o for o in answer.outputs if o.output_type == "error"]
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))
    assert "the answer cell of `pretokenize`, line 3" in traceback, traceback
    assert not re.search(r"Cell In\[\d+\]", traceback + decode_crash)
