"""The course's answer is not in a notebook's grading kernel, in any form (issue 43): no code
object of the notebook's implementations, compared by bytecode, constants and names used (not by
the names they go by), in the graders package the kernel sees, nor anywhere on its file system,
nor in what it has loaded; and a kernel writes nothing that outlives it."""
import importlib
import inspect
import json
from pathlib import Path

import pytest

from code_search import fingerprints, walk_files
from graders.exercises import declared_notebooks
from graders.harness import grading, kernel_view, sandbox
from graders.judging.origins import PACKAGE
from graders.judging.provenance import allowed_code
from test_integrity import crafted, grade, printed

CONFINED = pytest.mark.skipif(bool(sandbox.confinement_unavailable()), reason="no user namespaces here")

# Checks whose `produce` still runs a course implementation of the same notebook in its kernel
# (a table, a batch or a model the check builds there). They are the work left of issue 43: each
# must receive what it needs as inputs instead. The test fails when one is fixed, so that the
# list only shrinks, and when any other appears.
KNOWN_IN_KERNEL = {
    ("06_gpt2", False): {"Unembed"},
    ("07_training", False): {"reference_reversal"},
    ("07_training", True): {"reference_reversal"},
    ("08_sampling", False): {"apply_frequency_penalty", "token_counts"},
    ("09_transformer_family", False): {"BertEmbeddings", "BertForMLM", "BertMLP", "EncoderBlock", "FusedLayerNorm",
                                       "MLMHead", "PostNormBlock", "TiedUnembed", "gelu_erf",
                                       "reference_mask_tokens"},
    ("09_transformer_family", True): {"BertForMLM", "EncoderBlock", "MLMHead"},
    ("10_modern_decoder", False): {"DecoderLayer", "GQAttention", "ModernDecoder", "RMSNorm", "SwiGLU",
                                   "apply_rope", "attention", "rms_norm", "rope_cos_sin", "rotate_half", "swiglu"},
    ("10_modern_decoder", True): {"DecoderLayer", "GQAttention", "RMSNorm", "SwiGLU", "attention", "rms_norm",
                                  "swiglu"},
}


def _codes(obj) -> list:
    if isinstance(obj, type):
        return [m.__code__ for m in vars(obj).values() if inspect.isfunction(m)]
    return [inspect.unwrap(obj).__code__]


def implementations(notebook: str, composites: bool) -> dict[str, str]:
    """{fingerprint: name} of `notebook`'s own implementations; in the kernel that grades its
    composites, less the parts those supply (they are real there on purpose)."""
    supplied = set()
    if composites:   # the supplied parts, and the course's parts they run
        parts = tuple(p for e in kernel_view._exercises_of(notebook) for p in kernel_view.supplied_parts(e))
        supplied = {code.co_qualname.split(".")[0] for code in allowed_code(parts)}
    found = {}
    for entry in declared_notebooks()[notebook].implementations:
        file, _, name = entry.partition(":")
        if name in supplied:
            continue
        module = importlib.import_module("graders." + file[:-3].replace("/", "."))
        for code in _codes(getattr(module, name)):
            found.update(dict.fromkeys(fingerprints(code), name))
    return found


def _kernels():
    for notebook in sorted(declared_notebooks()):
        composite = any(kernel_view.supplied_parts(e) for e in kernel_view._exercises_of(notebook))
        yield from [(notebook, False)] + ([(notebook, True)] if composite else [])


@pytest.mark.parametrize("notebook, composites", list(_kernels()))
def test_the_kernel_package_holds_no_implementation_of_its_notebook(notebook, composites):
    wanted = implementations(notebook, composites)
    view = kernel_view.kernel_package(notebook, composites)
    assert not list(view.rglob("*.py")) or list(view.rglob("*.pyc")), "the view is compiled"
    found = set()
    for path in walk_files(str(view), set(wanted)):
        from code_search import file_codes
        for code in file_codes(path):
            found |= {wanted[f] for f in fingerprints(code) if f in wanted}
    assert found == KNOWN_IN_KERNEL.get((notebook, composites), set())


def test_the_search_finds_a_relabelled_copy(tmp_path):
    """The search compares code, not names: LayerNorm's forward under another file name, function
    name and line is found (the test above can fail)."""
    from graders.reference.components import LayerNorm

    wanted = implementations("01_layernorm", False)
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
    whose text holds a line of the wanted code, or with no compiled copy, compiled) and every
    function it has loaded: none is the notebook's answer."""
    notebook = "12_training_step"
    wanted = implementations(notebook, False)
    markers = set()
    for entry in declared_notebooks()[notebook].implementations:
        file, _, name = entry.partition(":")
        source = inspect.getsource(getattr(importlib.import_module("graders." + file[:-3].replace("/", ".")), name))
        markers |= {line.strip().encode() for line in source.splitlines() if len(line.strip()) > 30}
    search = (Path(__file__).parent / "code_search.py").read_text()
    walk = (f"# walk\n{search}\nimport json\nwanted = set({sorted(wanted)!r})\n"
            f"hits = walk_files('/', wanted, source_markers={sorted(markers)!r})\n"
            "print(json.dumps([hits, loaded_module_hits(wanted)]))\n")
    notebook_cells = crafted(notebook)
    notebook_cells.cells.append(__import__("nbformat").v4.new_code_cell(walk))
    cells, _, executed = grade(tmp_path, notebook, notebook_cells, cell_timeout=600)
    files, modules = json.loads(printed(executed, "# walk"))
    assert files == {} and modules == {}
    assert all(c.points == c.max_points for c in cells.values())


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
