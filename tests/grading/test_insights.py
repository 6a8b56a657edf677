"""The insights page and its tables: what the class got wrong, from results.json alone."""
import json
import re

import pytest

from graders.harness import insights
from graders.harness.insights import figures


def cell(grade_id, points, status="passed", message="", mistake=None, hidden_only=False, max_points=5.0):
    return {"grade_id": grade_id, "points": points, "max_points": max_points, "status": status,
            "message": message, "mistake": mistake, "hidden_only": hidden_only}


def entry(student, cells, notebook="01_layernorm", seconds=10.0, flags=(), copies=()):
    return {"student": student, "notebook": notebook, "cells": cells, "seconds": seconds,
            "flags": list(flags), "copies": list(copies), "notes": []}


SAMPLE = "01_layernorm/layernorm/sample_variance"
CLASS = [
    entry("ada", [cell("layernorm_test", 5.0)], seconds=12.0),
    entry("bob", [cell("layernorm_test", 0.0, "failed", "LayerNorm output (blocks.0.ln1) does not match. "
                       "Likely mistake: sample variance, as bob wrote in /home/bob/answers.py", SAMPLE)]),
    entry("cy", [cell("layernorm_test", 0.0, "failed", "LayerNorm output (blocks.7.ln2) does not match. "
                      "Likely mistake: the sample variance (reworded)", SAMPLE, hidden_only=True)]),
    entry("dee", [cell("layernorm_test", 0.0, "failed", "LayerNorm: not written yet: write it in the cell above.")]),
    entry("eve", [cell("layernorm_test", 0.0, "crashed", "the kernel died")], seconds=None),
    entry("fay", [cell("layernorm_test", 0.0, "missing-notebook", "01_layernorm.ipynb was not submitted")],
          seconds=None),
    entry("gus", [cell("layernorm_test", 0.0, "failed", "LayerNorm output (blocks.3.ln1) is 2.5 off")],
          flags=["answer cell layernorm_answer: LayerNorm.forward matches the course's solution "
                 "(solutions/01_layernorm.ipynb: LayerNorm.forward) (100% of its code, once names, comments "
                 "and formatting are normalised); its points stand, please review it"]),
]


def test_each_test_cell_has_its_mean_median_shares_crashes_and_histogram_over_who_handed_it_in():
    (row,) = figures(CLASS)["cells"]
    assert (row["students"], row["not_handed_in"]) == (6, 1)
    assert (row["mean"], row["median"]) == (round(5 / 6, 3), 0.0)
    assert (row["full_marks"], row["not_written"], row["crashed"], row["timeout"]) == (0.167, 0.167, 1, 0)
    assert row["histogram"] == [5, 0, 0, 0, 1]


def test_mistakes_are_counted_by_their_key_whatever_their_words_and_the_rest_by_where_they_were_found():
    rows = {(r["kind"], r["mistake"]): r["students"] for r in figures(CLASS)["mistakes"]}
    assert rows == {("key", SAMPLE): 2, ("localised", "LayerNorm output (blocks.#.ln#) is # off"): 1}


def test_a_mistake_named_without_a_key_is_counted_by_its_words():
    unkeyed = [entry(s, [cell("t", 0.0, "failed", f"out at {s}. Likely mistake: eps outside\n  detail")])
               for s in ("ada", "bob")]
    assert [(r["kind"], r["mistake"], r["students"]) for r in figures(unkeyed)["mistakes"]] == \
           [("named, no key", "eps outside", 2)]


def test_example_messages_name_no_student_and_no_path():
    examples = " ".join(r["example"] for r in figures(CLASS)["mistakes"])
    assert "Likely mistake: sample variance" in examples
    for name in ("ada", "bob", "cy", "dee", "gus", "/home"):
        assert name not in examples.replace("<student>", ""), name


def test_hidden_only_failures_and_copy_flags_name_their_students_for_the_instructor():
    found = figures(CLASS)
    assert [(r["cell"], r["who"]) for r in found["hidden_only"]] == [("layernorm_test", "cy")]
    assert [(r["answer_cell"], r["who"], r["reports"]) for r in found["copies"]] == \
           [("layernorm_answer", "gus", "reports/gus.txt")]


def test_grading_time_per_notebook_counts_only_graded_notebooks():
    (row,) = figures(CLASS)["timing"]
    assert (row["graded"], row["max_seconds"], row["total_seconds"]) == (5, 12.0, 52.0)


def test_the_heat_map_orders_students_by_total():
    heat = figures(CLASS)["heat_map"]
    assert heat["students"][0] == "ada" and heat["shares"][0] == [1.0]
    assert heat["totals"] == sorted(heat["totals"], reverse=True)


def test_the_tables_load_in_pandas_with_the_page_figures(tmp_path):
    pandas = pytest.importorskip("pandas")
    (tmp_path / "results.json").write_text(json.dumps(CLASS))
    assert insights.main([str(tmp_path)]) == 0
    found = json.loads((tmp_path / "insights.json").read_text())
    cells = pandas.read_csv(tmp_path / "insights" / "cells.csv")
    assert cells.loc[0, "mean"] == found["cells"][0]["mean"] and cells.loc[0, "bin_0"] == 5
    mistakes = pandas.read_csv(tmp_path / "insights" / "mistakes.csv")
    assert mistakes.set_index("mistake").loc[SAMPLE, "students"] == 2
    page = (tmp_path / "insights.html").read_text()
    assert "data:image/png;base64," in page and f'data-mistake="{SAMPLE}"' in page


@pytest.mark.parametrize("content, says", [(None, "does not exist"), ("{not json", "cannot be read"),
                                          ('{"a": 1}', "not a list of graded notebooks"),
                                          ('[{"cells": [{"grade_id": 1}]}]', "cannot count")])
def test_a_missing_or_corrupt_results_file_gets_one_line_and_no_traceback(tmp_path, capsys, content, says):
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    assert insights.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err


# --- The example class, graded once per worker (conftest's graded_example_class) -------------

ONE_GRADING = pytest.mark.xdist_group("classroom")
# The key each example bug's mistake is counted under, by the test cell it fails.
EXAMPLE_KEYS = {
    ("01_layernorm", "layernorm_test"): "01_layernorm/layernorm/sample_variance",
    ("02_embeddings", "pos_embed_test"): "02_embeddings/posembed/offset_by_one",
    ("03_attention", "attention_test"): "03_attention/attention/scaled_by_d_model",
    ("04_mlp", "gelu_test"): "04_mlp/gelu_new/squared_not_cubed",
    ("05_transformer_block", "block_test"): "05_transformer_block/transformerblock/no_attention_residual",
    ("06_gpt2", "model_test"): "06_gpt2/demotransformer/no_pos_embed",
    ("07_training", "train_test"): "07_training/train_reversal_task/no_zero_grad",
    ("07_training", "shakespeare_test"): "07_training/train_tiny_shakespeare_short_run/no_zero_grad",
    ("08_sampling", "top_p_test"): "08_sampling/apply_top_p/one_too_few",
    ("09_transformer_family", "sinusoidal_test"): "09_transformer_family/sinusoidal_encoding/sin_cos_swapped",
    ("10_modern_decoder", "gqa_test"): "10_modern_decoder/gqattention/repeat_not_interleave",
    ("11_tokenizer", "encode_test"): "11_tokenizer/encode/special_token_split",
    ("12_training_step", "adamw_test"): "12_training_step/adamw/l2_decay",
    ("13_post_training", "chat_tokens_test"): "13_post_training/chat_tokens/end_masked",
    ("14_rl_verifiable_rewards", "reward_test"): "14_rl_verifiable_rewards/reward/end_optional",
}


@ONE_GRADING
@pytest.mark.slow
def test_the_buggy_students_mistakes_are_counted_under_their_keys(graded_example_class):
    results = json.loads((graded_example_class / "results.json").read_text())
    buggy = {(e["notebook"], c["grade_id"]): c["mistake"] for e in results if e["student"] == "buggy"
             for c in e["cells"] if c["status"] == "failed"}
    assert {cell: key for cell, key in buggy.items() if key} == EXAMPLE_KEYS
    found = json.loads((graded_example_class / "insights.json").read_text())
    counted = {(r["notebook"], r["cell"]): (r["mistake"], r["students"]) for r in found["mistakes"]
               if r["kind"] == "key"}
    assert counted == {cell: (key, 1) for cell, key in EXAMPLE_KEYS.items()}


@ONE_GRADING
@pytest.mark.slow
def test_no_feedback_page_names_a_student(graded_example_class):
    """A learner's page holds no student's name (the example class's names are words: one the
    notebook itself uses, "partial" say, may appear as that word)."""
    from graders.harness.cells import released_notebook

    names = {e["student"] for e in json.loads((graded_example_class / "results.json").read_text())}
    pages = list((graded_example_class / "feedback").rglob("*.html"))
    assert pages
    for page in pages:
        notebook = json.dumps(released_notebook(page.stem))
        named = {name for name in names if re.search(rf"\b{name}\b", page.read_text())}
        assert named <= {name for name in names if re.search(rf"\b{name}\b", notebook)}, page


@ONE_GRADING
@pytest.mark.slow
def test_the_page_opens_offline_and_shows_the_figures_of_results_json(graded_example_class, tmp_path):
    """Chromium, with every request but the file itself refused, shows the page's tables and its
    heat map; each test cell's figures on it are those computed here from results.json."""
    from playwright.sync_api import sync_playwright
    from test_browser import CHROMIUM_FLAGS, SHOTS, _chromium

    results = json.loads((graded_example_class / "results.json").read_text())
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        try:
            page = chromium.new_page(viewport={"width": 1400, "height": 900})
            refused = []
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else (refused.append(route.request.url), route.abort()))
            page.goto((graded_example_class / "insights.html").as_uri())
            rows = page.eval_on_selector_all("table[data-table=cells] tr[data-cell]",
                                             "rows => rows.map(r => ({...r.dataset}))")
            mistakes = page.eval_on_selector_all("table[data-table=mistakes] tr[data-mistake]",
                                                 "rows => rows.map(r => ({...r.dataset}))")
            heat_width = page.eval_on_selector("img.heat", "img => img.complete ? img.naturalWidth : 0")
            SHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SHOTS / "insights.png"))
        finally:
            chromium.close()
    assert not refused and heat_width > 0
    for row in rows:
        handed = [c for e in results if e["notebook"] == row["notebook"] for c in e["cells"]
                  if c["grade_id"] == row["cell"] and c["status"] != "missing-notebook"]
        points = [c["points"] for c in handed]
        assert int(row["students"]) == len(handed), row
        assert float(row["mean"]) == pytest.approx(sum(points) / len(points), abs=1e-3), row
        assert float(row["fullMarks"]) == pytest.approx(
            sum(c["points"] == c["max_points"] for c in handed) / len(handed), abs=1e-3), row
    assert len(rows) == len({(e["notebook"], c["grade_id"]) for e in results for c in e["cells"]})
    shown = {m["mistake"]: int(m["students"]) for m in mistakes if m["kind"] == "key"}
    assert shown == {key: 1 for key in EXAMPLE_KEYS.values()}
