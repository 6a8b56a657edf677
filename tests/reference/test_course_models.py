"""The models the course builds for notebook 13 are the same bits on every machine, whatever the
building process did first: they are seeded, draw nothing from the caller's generator, and are
checked against the fingerprints committed in data/post_training_models.json (a cached file that
is not the committed model is built again; a build that is not it is refused)."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from graders.exercises.nb13 import tasks
from graders.reference.paths import CACHE_ENV
from graders.reference.synthetic import fingerprint

BUILD = textwrap.dedent("""
    import sys
    import torch
    torch.manual_seed(int(sys.argv[1]))
    torch.rand(int(sys.argv[2]))                   # the process has drawn other numbers first
    from graders.exercises.nb13 import tasks
    from graders.reference.synthetic import fingerprint
    if sys.argv[3] == "base first":
        tasks.base_weights()
        torch.randn(7)
    print(fingerprint(tasks.sft_weights()))
""")


def _cache_with_the_base(tmp_path):
    """A course cache holding only the machine's base model (pretraining it again takes a minute)."""
    tasks.base_weights()                               # built here once, if this machine has not yet
    base = tasks.cached_file("base")
    (tmp_path / "post-training").mkdir(parents=True)
    shutil.copy(base, tmp_path / "post-training")
    return tmp_path


@pytest.mark.slow
def test_the_finetuned_model_is_the_same_in_processes_that_drew_other_numbers_first(tmp_path):
    found = set()
    for seed, draws, order in ((1, 10, "base first"), (2, 333, "base inside")):
        cache = _cache_with_the_base(tmp_path / order.replace(" ", "_"))
        done = subprocess.run([sys.executable, "-c", BUILD, str(seed), str(draws), order], capture_output=True,
                              text=True, env={**os.environ, CACHE_ENV: str(cache)}, timeout=300)
        assert done.returncode == 0, done.stderr
        found.add(done.stdout.split()[-1])
    assert found == {tasks.expected_fingerprint("sft")}


def test_the_cached_models_are_the_committed_ones():
    assert fingerprint(tasks.base_weights()) == tasks.expected_fingerprint("base")
    assert fingerprint(tasks.sft_weights()) == tasks.expected_fingerprint("sft")


def test_pretraining_gives_the_same_weights_whatever_the_generator_held(monkeypatch):
    monkeypatch.setitem(tasks.PRETRAIN, "steps", 3)
    built = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        built.append(fingerprint(tasks.pretrain().state_dict()))
    assert built[0] == built[1]


def test_loading_a_course_model_draws_nothing_from_the_callers_generator():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    tasks.base_model()
    tasks.sft_model()
    assert torch.equal(torch.rand(3), expected)


def test_a_cached_file_that_is_not_the_committed_model_is_built_again(tmp_path, monkeypatch):
    cache = _cache_with_the_base(tmp_path)
    monkeypatch.setenv(CACHE_ENV, str(cache))
    stale = tasks.cached_file("sft")
    torch.save(tasks.base_weights(), stale)           # a model of the right shapes, not the finetuned one
    model = tasks._cached("sft", lambda: tasks.loaded(tasks.sft_weights()))
    assert fingerprint(model.state_dict()) == tasks.expected_fingerprint("sft")
    assert fingerprint(torch.load(stale, weights_only=True)) == tasks.expected_fingerprint("sft")


def test_a_build_that_is_not_the_committed_model_is_refused_in_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="sft model built on this machine .* is not the committed one"):
        tasks._cached("sft", tasks.base_model)
    assert not tasks.cached_file("sft").exists()


@pytest.mark.slow
def test_the_notebooks_finetuning_demonstration_is_the_checks_visible_run():
    """13's demonstration cell seeds torch with 0 and finetunes tasks.base_model() on seed 0's
    batches; the check's seed-0 run builds the base model, then seeds: the same model comes out."""
    from graders.exercises.nb13 import reference as ref
    from graders.exercises.nb13 import runs
    from graders.judging.cases import Case

    case = Case(text=None, seed=0)
    checked = runs.produce_finetune(ref.finetune, case, runs.sft_inputs(case))
    tokens, labels = tasks.sft_batches(0, runs.SFT_STEPS, runs.SFT_BATCH)
    batches = iter(zip(tokens, labels))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        with runs.one_thread():
            demonstrated = ref.finetune(tasks.base_model(), lambda: next(batches), runs.SFT_STEPS)
    assert torch.equal(runs._answers(demonstrated, runs.sft_inputs(case)), checked["answers"])
