"""Shared fixtures: the synthetic reference, the course's 35-token text, a small GPT-2 in Hugging
Face format, and a Jupyter server run for a test."""
import contextlib
import dataclasses
import fcntl
import os
import signal
import socket
import subprocess
import time

import pytest
import torch

TEXT = ("I am an amazing autoregressive, decoder-only, GPT-2 style transformer. "
        "One day I will exceed human level intelligence and take over the world!")
# The ids of TEXT with BOS, written out (not computed) so that the tokenizer is tested against them.
TOKEN_IDS = [50256, 40, 716, 281, 4998, 1960, 382, 19741, 11, 875, 12342, 12, 8807, 11, 402, 11571,
             12, 17, 3918, 47385, 13, 1881, 1110, 314, 481, 7074, 1692, 1241, 4430, 290, 1011,
             625, 262, 995, 0]


def pytest_configure(config):
    """Each pytest-xdist worker, and every process it starts (Validate's, `make solutions`' and
    `make check`'s kernels, a lab server's), computes on its share of the cores: a thread per
    core beside a busy worker spends much of its CPU waiting on the other threads. A value of
    OMP_NUM_THREADS already set is kept; grading kernels get the sandbox's own (one thread). Only
    workers set it: the controller's environment is the one they start with."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(items):
    """Long work first: the tests marked slow, and within each tier the xdist groups (several
    tests bound to one worker) before single tests. `make test` has pytest-xdist hand out work
    in this order (--no-loadscope-reorder), so the long kernel and training runs start at once
    and the many short in-process tests fill the gaps and even out the end."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("xdist_group") is None))


@contextlib.contextmanager
def cache_lock():
    """Serialise first-time generation in the shared cache across pytest-xdist workers."""
    from graders.reference.paths import cache_dir

    with open(cache_dir() / ".tests.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def reference():
    from graders.reference.model import load_reference

    with cache_lock():
        return load_reference("synthetic", quiet=True)


@pytest.fixture(scope="session")
def reference_tokens() -> torch.Tensor:
    return torch.tensor([TOKEN_IDS])


@pytest.fixture(scope="session")
def reference_acts(reference, reference_tokens):
    """The synthetic reference's graded activations on the 35-token text (default cache)."""
    from graders.reference.activations import reference_activations

    with cache_lock():
        return reference_activations(reference, reference_tokens)


SMALL_GPT2 = dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=50257)


@pytest.fixture(scope="session")
def small_gpt2_dir(tmp_path_factory):
    """A small GPT-2 saved in Hugging Face format, standing in for downloaded pretrained weights.

    Biases and LayerNorm parameters are randomised too (Hugging Face initialises them to 0 and 1),
    so that leaving one out is visible.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng():
        torch.manual_seed(1234)
        model = GPT2LMHeadModel(GPT2Config(**SMALL_GPT2))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(".bias"):
                    param.normal_(0.0, 0.3)
                elif ".ln_" in name:
                    param.normal_(1.0, 0.5)
    folder = tmp_path_factory.mktemp("small-gpt2")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def graded_example_class(tmp_path_factory):
    """The output folder of the example class graded once per session, every notebook with test
    cells (a module-scoped fixture is set up again each time pytest-xdist interleaves another
    module's test, which once graded it twice). Its tests share xdist_group("classroom")."""
    from graders.course import example_class
    from graders.course.notebooks import notebook_names
    from graders.harness import classroom, grading

    names = [n for n in notebook_names() if grading.test_cells(grading.source_notebook(n))]
    submissions = example_class.write(tmp_path_factory.mktemp("example_class"))
    out = tmp_path_factory.mktemp("grading")
    classroom.grade_class(submissions, out, names, workers=2, scheduler=None, limits=grading.TimeLimits())
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def served(command: list[str], log_path, answers, seconds: float, **popen):
    """Run a server `command` in its own process group, logging to `log_path`, until `answers()`
    returns without an OSError or ValueError (within `seconds`); stop the whole group after."""
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, **popen)
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                answers()
                break
            except (OSError, ValueError):
                assert server.poll() is None, f"the server exited:\n{log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, \
                    f"the server did not answer in {seconds} s:\n{log_path.read_text()[-3000:]}"
                time.sleep(0.5)
        yield server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


@pytest.fixture(autouse=True)
def graded_as_shown(request, monkeypatch, tmp_path_factory):
    """In the catalog tests, every verdict a check shows is also reached the grading way: its
    outputs go through a record (safetensors, as from a grading kernel) and are judged as a
    test cell by graders.harness.grading.judge_cell; the two must agree, point for point, word
    for word and mistake for mistake. Each catalog case thereby proves the contract once more.
    And a verdict that names a likely mistake carries that mistake's key, by which a class's
    results count it (graders.harness.insights) whatever its words."""
    if not request.module.__name__.startswith("test_catalog_"):
        yield
        return
    from graders.harness.grading import judge_cell
    from graders.judging import exercise as exercise_module
    from graders.judging.compare import LIKELY
    from graders.judging.records import load_records
    from graders.judging.session import Session, save_record

    decide = exercise_module.decide
    folder = tmp_path_factory.mktemp("records")

    def decide_both_ways(exercise, case, outputs, failure, code, failure_mistake=None):
        shown = decide(exercise, case, outputs, failure, code, failure_mistake)
        records = folder / f"{len(list(folder.iterdir()))}"
        records.mkdir()
        save_record(Session(records=records), "cell/0", exercise.key, outputs, failure, failure_mistake)
        cell = {"metadata": {"nbgrader": {"grade_id": "cell", "points": 1}}}
        graded = judge_cell(cell, [(exercise.key, dataclasses.asdict(case))], load_records(records),
                            None, "", code)
        assert (graded.points, graded.message, graded.mistake) == \
            (float(shown.passed), shown.message, shown.mistake), (exercise.key, case)
        assert shown.mistake or LIKELY not in shown.message, \
            f"{exercise.key} names a likely mistake without its key (declare it a Mistake):\n{shown.message}"
        return shown

    monkeypatch.setattr(exercise_module, "decide", decide_both_ways)
    yield
