"""A graded notebook as the student and the instructor see it afterwards.

`annotated` is the notebook nbgrader's autograded/ folder holds (what formgrader shows): the
executed cells with the source notebook's markdown put back in place (the harness runs code
cells only), each test cell as the student saw it (hidden tests removed) with its verdict as
its only output, in green or red (a diagnosis's `Show the fix:` line folded away in its HTML,
whole in its text), and the grading notes on top. The kernel's own output of a
test cell is dropped: while grading it names the hidden cases it recorded.

`feedback_html` renders that notebook with nbgrader's own feedback template, scores and comments
filled in the way `nbgrader generate_feedback` fills them from the gradebook, so that both give
the same page. `answer_comments` is the comment each answer cell gets: nbgrader keeps comments
on answer cells only, so the diagnosis of a failed test goes to the answer cell it checks.
"""
from __future__ import annotations

import copy
import functools
import html
from pathlib import Path

import nbformat
from nbconvert.preprocessors import CoalesceStreamsPreprocessor

from graders.harness.cells import is_test_cell, nbgrader_meta, released_source, source_notebook
from graders.judging.rendering import fold_html, message_html, split_fix

PASS_COLOURS = ("#1b5e20", "#e8f5e9")   # text and background of a passed test's verdict
FAIL_COLOURS = ("#b71c1c", "#ffebee")


def annotated(executed, name: str, cells: list[dict], notes: list[str]):
    """The executed notebook with markdown, released test cells and verdicts (see above)."""
    verdicts = {c["grade_id"]: c for c in cells}
    notebook = nbformat.v4.new_notebook(metadata=copy.deepcopy(source_notebook(name).metadata))
    notebook.cells = _with_markdown(executed, source_notebook(name))
    for cell in notebook.cells:
        if is_test_cell(cell):
            cell["source"] = released_source(cell)
            verdict = verdicts.get(nbgrader_meta(cell)["grade_id"])
            cell["outputs"] = [_verdict_output(verdict)] if verdict else []
    if notes:
        notebook.cells.insert(0, nbformat.v4.new_markdown_cell(
            "**Grading notes**\n\n" + "".join(f"- {note}\n" for note in notes)))
    # How a kernel's prints are split into stream messages depends on timing; the pages must not.
    CoalesceStreamsPreprocessor().preprocess(notebook, {})
    return notebook


def _with_markdown(executed, source) -> list:
    """The executed cells in order, with the source's cells that have no nbgrader id (markdown,
    demo code) interleaved where the source has them. Between two graded cells the learner's own
    code cells stand for the source's demo cells, in order; any extra ones follow."""
    after: dict[str | None, list] = {None: []}   # the source's cells after each graded cell
    anchor = None
    for cell in source.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if grade_id:
            anchor = grade_id
            after[anchor] = []
        else:
            after[anchor].append(cell)
    cells: list = []

    def place(anchor, learner_cells):
        learner_cells = list(learner_cells)
        for cell in after.get(anchor, []):
            if cell["cell_type"] != "code":
                cells.append(copy.deepcopy(cell))
            elif learner_cells:
                cells.append(learner_cells.pop(0))
        cells.extend(learner_cells)

    anchor, learner_cells = None, []
    for cell in executed.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if grade_id:
            place(anchor, learner_cells)
            cells.append(copy.deepcopy(cell))
            anchor, learner_cells = grade_id, []
        else:
            learner_cells.append(copy.deepcopy(cell))
    place(anchor, learner_cells)
    return cells


def verdict_text(verdict: dict) -> str:
    return (f"{verdict['status'].upper()}: {verdict['points']:g} / {verdict['max_points']:g} points"
            + (f"\n{verdict['message']}" if verdict["message"] else ""))


def _verdict_output(verdict: dict):
    passed = verdict["points"] >= verdict["max_points"]
    colour, background = PASS_COLOURS if passed else FAIL_COLOURS
    headline, _, message = verdict_text(verdict).partition("\n")
    detail = message_html(message) if message else ""
    box = (f'<div class="gpt2-verdict gpt2-verdict-{"pass" if passed else "fail"}" style="border-left: '
           f'6px solid {colour}; background: {background}; color: {colour}; padding: 0.4em 0.8em;">'
           f"<b>{html.escape(headline)}</b>{detail}</div>")
    return nbformat.v4.new_output("display_data",
                                  data={"text/html": box, "text/plain": verdict_text(verdict)})


def answer_comments(name: str, cells: list[dict], fold: bool = False) -> dict[str, str]:
    """{answer cell id: the diagnoses of the failed tests below it} (the closest answer cell
    above a test cell in the source notebook is the one it checks). With `fold`, for the page
    (which reads a comment as markdown), each diagnosis's corrected code is folded away."""
    checked_by, answer = {}, None
    for cell in source_notebook(name).cells:
        meta = nbgrader_meta(cell)
        if meta.get("solution"):
            answer = meta["grade_id"]
        elif is_test_cell(cell) and answer:
            checked_by[meta["grade_id"]] = answer
    comments: dict[str, list[str]] = {}
    for cell in cells:
        if cell["points"] < cell["max_points"] and cell["grade_id"] in checked_by:
            comment = (f"{cell['grade_id']}: {cell['points']:g} / {cell['max_points']:g} ({cell['status']}). "
                       f"{cell['message']}".strip())
            shown, fix = split_fix(comment)
            if fold and fix is not None:
                comment = f"{shown}\n\n{fold_html(fix)}"
            comments.setdefault(checked_by[cell["grade_id"]], []).append(comment)
    return {answer: "\n\n".join(lines) for answer, lines in comments.items()}


def feedback_html(notebook, name: str, cells: list[dict]) -> str:
    """The annotated notebook as nbgrader's feedback page: score per test cell, comments under
    the answer cells, the notebook's total at the top."""
    notebook = copy.deepcopy(notebook)
    verdicts = {c["grade_id"]: c for c in cells}
    comments = answer_comments(name, cells, fold=True)
    for cell in notebook.cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade_id") in verdicts:
            meta["score"] = verdicts[meta["grade_id"]]["points"]
            meta["points"] = verdicts[meta["grade_id"]]["max_points"]
        if meta.get("solution"):
            meta["comment"] = comments.get(meta["grade_id"])
    resources = {"nbgrader": {"notebook": name, "score": sum(c["points"] for c in cells),
                              "max_score": sum(c["max_points"] for c in cells), "late_penalty": 0}}
    body, _ = _exporter().from_notebook_node(notebook, resources=resources)
    return body


@functools.lru_cache(maxsize=1)
def _exporter():
    """nbconvert's HTML exporter with nbgrader's feedback template (as GenerateFeedback sets it up)."""
    import nbgrader
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    formgrader = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    config = Config()
    config.HTMLExporter.template_name = "feedback"
    config.HTMLExporter.extra_template_basedirs = [str(formgrader / "templates")]
    config.HTMLExporter.extra_template_paths = [
        str(formgrader / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    config.HTMLExporter.preprocessors = ["nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
    return HTMLExporter(config=config)
