"""An instructor's slip is refused early, in one clear line."""
import subprocess
import sys

import pytest

from graders.harness import cells


def test_a_release_with_unreadable_test_cells_prints_every_one_without_a_traceback(monkeypatch, tmp_path, capsys):
    from graders.course import notebooks
    from graders.harness import manifest

    broken = cells.source_notebook("03_attention")
    tests = [c for c in broken.cells if cells.is_test_cell(c)]
    tests[0].source = "nb03.check_apply_causal_mask(Attention, block=cfg.n_layers - 1)"
    tests[1].source = "for b in range(3):\n    nb03.check_attention(Attention, block=b)"
    monkeypatch.setattr(manifest, "source_notebook",
                        lambda name: broken if name == "03_attention" else cells.source_notebook(name))
    assert notebooks.main(["release", str(tmp_path / "course")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the course cannot be built:") and "Traceback" not in err, err
    assert f"test cell {tests[0].metadata.nbgrader.grade_id}, line 1: the argument block= is computed" in err
    assert f"test cell {tests[1].metadata.nbgrader.grade_id}, line 1: not a call" in err
    assert not (tmp_path / "course").exists()


@pytest.fixture
def mistyped_pretrained_dir(monkeypatch, tmp_path):
    from graders.reference import model, store

    folder = tmp_path / "gpt2-wieghts"
    monkeypatch.setenv(model.PRETRAINED_DIR_ENV, str(folder))
    monkeypatch.setenv(model.SOURCE_ENV, "auto")
    monkeypatch.delenv(store.PINNED_ENV, raising=False)
    for cached in (model.identify, model.load_reference, store.reference_id):
        cached.cache_clear()
    yield folder
    for cached in (model.identify, model.load_reference, store.reference_id):
        cached.cache_clear()


def test_a_mistyped_pretrained_folder_is_an_error_naming_it_not_a_fallback(mistyped_pretrained_dir):
    from graders.reference.model import ReferenceUnavailable, identify, load_reference

    for find in (identify, load_reference):
        with pytest.raises(ReferenceUnavailable) as failure:
            find("auto")
        message = str(failure.value)
        assert str(mistyped_pretrained_dir) in message and "\n" not in message, message


def test_grading_with_a_mistyped_pretrained_folder_stops_before_grading_in_one_line(mistyped_pretrained_dir,
                                                                                  tmp_path, capsys):
    from graders.harness import classroom

    assert classroom.main(["--submissions", str(tmp_path), "--out", str(tmp_path / "out"), "--plain"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: $GPT2_COURSE_PRETRAINED_DIR is ") and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_counting_parameters_on_the_hidden_configs_prints_no_transformers_warning():
    code = ("import dataclasses\n"
            "from graders.exercises.nb06.parameter_count import config_for, expected_counts\n"
            "from graders.judging.cases import Case\n"
            "for seed in range(1, 9):\n"
            "    expected_counts(dataclasses.astuple(config_for(Case(seed=seed))))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "token_id" not in run.stdout + run.stderr, run.stdout + run.stderr
