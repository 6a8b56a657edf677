"""A diagnosis's corrected code (its last line, `  Show the fix: <code>`) is folded away by the
displays, so that a learner reads what is wrong before the answer, and kept whole in every text
(the check cell's plain text, Validate, `make check`, the grade report). A message without the
line displays as before.
"""
from __future__ import annotations

import pytest

from graders.judging.compare import CheckFailed
from graders.judging.rendering import FIX_PREFIX, fix_line, message_html, render, split_fix, strip_ansi

DIAGNOSIS = "LayerNorm output does not match the reference.\n  largest error 0.3 at [batch=0, position=2]"
FIX = "variance = centred.pow(2).mean(dim=-1, keepdim=True)"
WITH_FIX = DIAGNOSIS + fix_line(FIX)


def test_the_fix_line_is_split_from_what_is_shown_only_when_it_is_the_last_line():
    assert WITH_FIX.endswith(f"\n  Show the fix: {FIX}")
    assert split_fix(WITH_FIX) == (DIAGNOSIS, FIX)
    assert split_fix(DIAGNOSIS) == (DIAGNOSIS, None)
    not_last = WITH_FIX + "\n  Hint: look up torch.var."
    assert split_fix(not_last) == (not_last, None)
    assert split_fix(f"Show the fix: {FIX}") == (f"Show the fix: {FIX}", None)   # not on a line of its own


def test_plain_text_keeps_the_fix_whole_and_a_fold_leaves_it_out():
    long_fix = "x = " + " + ".join(f"term_{i}" for i in range(30))   # longer than a rendered line
    whole = [strip_ansi(line) for line in render(CheckFailed(DIAGNOSIS + fix_line(long_fix)))]
    assert whole[-1] == FIX_PREFIX + long_fix, whole
    folded = [strip_ansi(line) for line in render(CheckFailed(WITH_FIX), fold=True)]
    assert folded == [strip_ansi(line) for line in render(CheckFailed(DIAGNOSIS))]
    assert not [line for line in folded if "Show the fix" in line or FIX in line], folded


def test_without_a_fix_line_folding_changes_nothing():
    assert render(CheckFailed(DIAGNOSIS), fold=True) == render(CheckFailed(DIAGNOSIS))
    assert "<details>" not in message_html(DIAGNOSIS)


def test_the_html_shows_the_diagnosis_and_folds_the_fix():
    page = message_html(WITH_FIX.replace("dim=-1", "dim=-1 if a < b else 0"))
    shown, _, fold = page.partition("<details>")
    assert "does not match the reference" in shown and "Show the fix" not in shown and "centred" not in shown
    assert fold.startswith("<summary>Show the fix</summary><pre>") and fold.endswith("</pre></details>")
    assert "if a &lt; b else 0" in fold   # code is escaped, not read as HTML


def test_the_verdict_box_folds_in_html_and_keeps_the_line_in_its_text():
    from graders.harness.feedback import _verdict_output

    output = _verdict_output({"status": "failed", "points": 0, "max_points": 5, "message": WITH_FIX})
    assert output["data"]["text/plain"] == f"FAILED: 0 / 5 points\n{WITH_FIX}"
    box = output["data"]["text/html"]
    assert "<details><summary>Show the fix</summary>" in box and box.index(FIX) > box.index("<details>")
    plain = _verdict_output({"status": "failed", "points": 0, "max_points": 5, "message": DIAGNOSIS})
    assert "<details>" not in plain["data"]["text/html"]


def test_the_feedback_page_folds_the_comment_and_the_gradebook_keeps_it_whole():
    import nbformat

    from graders.harness.cells import source_notebook
    from graders.harness.feedback import answer_comments, feedback_html

    cells = [{"grade_id": "layernorm_test", "points": 0, "max_points": 5, "status": "failed", "message": WITH_FIX}]
    assert answer_comments("01_layernorm", cells)["layernorm_answer"].endswith(fix_line(FIX))
    notebook = nbformat.from_dict(source_notebook("01_layernorm"))
    page = feedback_html(notebook, "01_layernorm", cells)
    assert "<details><summary>Show the fix</summary>" in page, page[-2000:]
    shown, _, fold = page.partition("<details><summary>Show the fix</summary>")
    assert FIX not in shown[shown.index("Comments:"):] and FIX in fold.partition("</details>")[0]


FAILING_CELL = """from graders.judging.compare import CheckFailed
failure = CheckFailed({message!r})
failure.folds_fix = {folds}
raise failure
"""


@pytest.mark.slow
@pytest.mark.parametrize("folds", [True, False])
def test_a_learners_kernel_shows_the_fix_in_a_fold_after_the_error(folds, tmp_path):
    """In a learner's own kernel the error leaves the line out and a display after it folds it
    (its text holds the line); a kernel that does not fold (Validate, `make check`) keeps it in
    the error, which is what they read."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = new_notebook(cells=[new_code_cell(FAILING_CELL.format(message=WITH_FIX, folds=folds))])
    NotebookClient(notebook, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = notebook.cells[0].outputs
    error = strip_ansi("\n".join(outputs[0].traceback))
    assert outputs[0].output_type == "error" and "does not match the reference" in error
    if not folds:
        assert error.endswith(FIX_PREFIX + FIX) and len(outputs) == 1, outputs
        return
    assert FIX not in error and "Show the fix" not in error, error
    assert [o.output_type for o in outputs] == ["error", "display_data"], outputs
    assert outputs[1].data["text/plain"] == FIX_PREFIX + FIX
    assert outputs[1].data["text/html"].startswith("<details><summary>Show the fix</summary>")


def test_a_comparison_hints_only_when_no_mistake_is_named_and_puts_the_fix_last():
    import torch

    from graders.judging.compare import compare

    expected, ones = torch.zeros(2, 3), torch.ones(2, 3)
    args = dict(mistakes={"every value is one": ones}, hint="look up torch.zeros.",
                fixes={"every value is one": "out = torch.zeros(2, 3)"})
    with pytest.raises(CheckFailed) as named:
        compare("out", ones, expected, ("a", "b"), **args)
    message = str(named.value)
    assert "Likely mistake: every value is one" in message.splitlines()[0] and "Hint:" not in message, message
    assert message.endswith(fix_line("out = torch.zeros(2, 3)")), message
    with pytest.raises(CheckFailed) as unnamed:
        compare("out", 2 * ones, expected, ("a", "b"), **args)
    assert str(unnamed.value).endswith("\n  Hint: look up torch.zeros."), str(unnamed.value)
    with pytest.raises(CheckFailed) as placed:
        compare("out", 2 * ones, expected, ("a", "b"), **args, fix="out = x - x")
    assert str(placed.value).endswith("  Hint: look up torch.zeros." + fix_line("out = x - x")), str(placed.value)


def _judge_naming_late(case, outputs):
    """A judge that names the mistake under its details, and a fix before a note."""
    raise CheckFailed("out does not match the reference.\n  largest error 1 at [a=0]\n"
                      "  Likely mistake: every value is one" + fix_line("out = torch.zeros(2, 3)") +
                      "\n  (checked on seed 0)")


def test_every_verdict_names_its_mistake_first_and_its_fix_last_whatever_the_judge_wrote():
    from types import SimpleNamespace

    from graders.judging.cases import Case
    from graders.judging.verdict import LearnerCode, decide

    # an exercise as decide reads it, not registered among the course's
    exercise = SimpleNamespace(notebook="98_wording", name="wording", judge=_judge_naming_late, forbidden=())
    verdict = decide(exercise, Case(), {}, "", LearnerCode())
    lines = verdict.message.splitlines()
    assert lines[0] == "out does not match the reference. Likely mistake: every value is one", lines
    assert lines[1:] == ["  largest error 1 at [a=0]", "  (checked on seed 0)",
                         FIX_PREFIX + "out = torch.zeros(2, 3)"], lines
