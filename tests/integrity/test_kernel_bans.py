"""Torch's kernels for an answer, taken out of a grading kernel's dispatcher before any learner code
runs (graders.integrity.kernel_bans), and a grading kernel that cannot start a program (library
answers refused at the level they run, once the in-kernel watches are switched off).

Arming is for a process's life, so every arming here happens in a process of its own: a child
Python, or a confined grading kernel."""
import json
import subprocess
import sys
import textwrap

import pytest

from graders.course import example_class
from graders.exercises import declared_notebooks, find
from graders.integrity import kernel_plan
from graders.judging.compare import CheckFailed
from test_integrity import CONFINED, grade, printed

# Every way to reach torch's layer norm, each run after 01's refusals are armed.
ROUTES = {
    "torch.native_layer_norm": "torch.native_layer_norm(x, (4,), None, None, 1e-5)",
    "F.layer_norm": "F.layer_norm(x, (4,))",
    "nn.LayerNorm": "nn.LayerNorm(4)(x)",
    "torch.ops.aten": "torch.ops.aten.native_layer_norm.default(x, [4], None, None, 1e-5)",
    "an out= overload": "torch.ops.aten.native_layer_norm.out(x, [4], None, None, 1e-5, out0=torch.empty(2, 4), "
                        "out1=torch.empty(2, 1), out2=torch.empty(2, 1))",
    "_op_dk at the CPU key": "torch.ops.aten.native_layer_norm.default._op_dk(K.CPU, x, [4], None, None, 1e-5)",
    "_op_dk at the composite key": "torch.ops.aten.native_layer_norm.default._op_dk("
                                   "K.CompositeExplicitAutograd, x, [4], None, None, 1e-5)",
    "a tensor that requires grad": "F.layer_norm(x.clone().requires_grad_(), (4,))",
    "bfloat16": "F.layer_norm(x.bfloat16(), (4,))",
    "a nested tensor": "F.layer_norm(torch.nested.nested_tensor([x, x], layout=torch.jagged), (4,))",
    "vmap": "torch.vmap(lambda y: F.layer_norm(y, (4,)))(x[None])",
    "a group norm of one group": "torch.group_norm(x[:, None], 1, None, None, 1e-5)",
    "an instance norm": "F.instance_norm(x[None])",
    "another thread": "concurrent.futures.ThreadPoolExecutor(1).submit(F.layer_norm, x, (4,)).result()",
    "the learner's registration over it, released": "released(x)",
}
PROGRAM = textwrap.dedent("""
    import concurrent.futures, gc, json, os, sys, warnings
    import torch
    import torch.nn.functional as F
    from torch import nn
    from graders.exercises import find
    from graders.integrity.kernel_bans import arm, exercise_bans
    from graders.judging.compare import CheckFailed

    K = torch._C.DispatchKey
    x = torch.randn(2, 4)

    def released(x):   # a learner's own kernel over the refusal, then released
        mine = torch._C._dispatch_library("IMPL", "aten", "")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mine.impl("native_layer_norm", "CPU", lambda *a, **k: "mine", False)
        assert torch.native_layer_norm(x, (4,), None, None, 1e-5) == "mine"
        del mine
        gc.collect()
        return torch.native_layer_norm(x, (4,), None, None, 1e-5)

    arm(exercise_bans(find(("01_layernorm", "LayerNorm"))))
    gc.collect()
    found = {}
    for name, route in json.loads(sys.argv[1]).items():
        try:
            eval(route)
            found[name] = "ran"
        except CheckFailed as refused:
            found[name] = str(refused)
        except Exception as err:
            found[name] = f"{type(err).__name__}: {err}"
    found["handles"] = sum(type(o).__name__ == "_DispatchModule" for o in gc.get_objects())
    ordinary = (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, unbiased=False) + 1e-5).sqrt()
    found["ordinary"] = bool(torch.isfinite(ordinary).all() and x.softmax(-1).sum(-1).allclose(torch.ones(2)))
    child = os.fork()
    if child == 0:   # a forked child keeps the refusals
        try:
            F.layer_norm(x, (4,))
            os._exit(1)
        except CheckFailed:
            os._exit(0)
    found["forked child refused"] = os.waitpid(child, 0)[1] == 0
    print(json.dumps(found))
""")


def test_an_armed_kernel_refuses_every_route_to_a_refused_operator():
    """Each route to torch's layer norm raises 01's refusal, in the words of its check; ordinary
    operators still run; nothing the learner's code can find undoes it (no registration object to
    release, and a learner's own registration released gives the refusal back, not torch's kernel)."""
    done = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(ROUTES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    for name in ROUTES:
        assert found[name].startswith("LayerNorm: your LayerNorm runs aten::"), (name, found[name])
        assert "torch's own kernel for LayerNorm, however it is called" in found[name], name
    assert found["torch.native_layer_norm"] == find(("01_layernorm", "LayerNorm")).forbidden[0].kernel_refusal(
        "LayerNorm", "aten::native_layer_norm")
    assert found["handles"] == 0 and found["ordinary"] and found["forked child refused"]


def test_every_refused_operator_is_replaced_at_every_key_that_computes_it():
    """Every exercise's refusals, armed: each overload of each refused operator has, at every
    dispatch key but Meta (shapes only), the refusal as its active kernel and torch's own inactive."""
    program = textwrap.dedent("""
        import json, re, torch
        from graders.exercises import declared_notebooks, find
        from graders.harness.manifest import notebook_checks
        from graders.integrity.kernel_bans import arm, exercise_bans, operators
        bans = {p: r for nb in declared_notebooks() for checks in notebook_checks(nb).values()
                for key, _ in checks for p, r in exercise_bans(find(key))}
        arm(bans.items())
        active = {op: re.findall(r"^(\\w+)(?:\\[alias\\])?: registered at (\\S+)", torch._C._dispatch_dump(op), re.M)
                  for pattern in bans for op in operators(pattern)}
        print(json.dumps({"patterns": sorted(bans), "active": active}))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert {"aten::native_layer_norm", "aten::gelu", "aten::linear", "aten::_foreach_*",
            "aten::_log_softmax", "aten::_fused_adamw_", "aten::cross_entropy_loss"} <= set(found["patterns"])
    assert len(found["active"]) > 200   # the families ("_foreach_*", "nll_loss*") with every overload
    torch_own = {op: [key for key, where in keys if key not in ("debug", "Meta") and where != "/dev/null:0"]
                 for op, keys in found["active"].items()}
    assert {op: keys for op, keys in torch_own.items() if keys} == {}
    assert all(keys for keys in found["active"].values())


# --- the plan: which kernel arms what --------------------------------------------------------------

@pytest.mark.parametrize("notebook", sorted(declared_notebooks()))
def test_no_kernel_refuses_what_an_exercise_it_grades_may_run(notebook):
    from graders.integrity.kernels import matches

    for group in kernel_plan.kernel_groups(notebook):
        refused = [pattern for pattern, _ in kernel_plan.refused_kernels(notebook, group)]
        may_run = {op for grade_id in group for exercise in kernel_plan._graded(notebook).get(grade_id, ())
                   for op in exercise.guard.may_run}
        assert not [(p, op) for p in refused for op in may_run if matches(p, op)], group


def test_an_exercise_refusing_what_another_runs_is_graded_apart():
    """12's loss refuses softmax and F.cross_entropy's kernels, which the course's model and training
    step run in its checkpoint check: the loss (with AdamW and clipping, which refuse the
    multi-tensor kernels clip_grad_norm_ runs there) is graded in a kernel that stops after them.
    04's MLP refuses the GELU kernel itself (the notebook says so), so 04 takes one kernel."""
    groups = kernel_plan.kernel_groups("12_training_step")
    assert groups == (("state_bytes_test", "memory_test", "checkpoint_test"),
                      ("cross_entropy_test", "adamw_test", "clip_test"))
    assert kernel_plan.refused_kernels("12_training_step", groups[0]) == ()
    refused = dict(kernel_plan.refused_kernels("12_training_step", groups[1]))
    assert {"aten::_log_softmax", "aten::_fused_adamw_", "aten::_foreach_*"} <= set(refused)
    assert refused["aten::_log_softmax"].startswith("cross_entropy: your cross_entropy runs aten::{op} (log-softmax)")
    assert kernel_plan.kernel_groups("04_mlp") == (("gelu_test", "mlp_test"),)
    assert [p for p, _ in kernel_plan.refused_kernels("04_mlp", ("gelu_test", "mlp_test"))] == ["aten::gelu"]
    (swiglu,) = [g for g in kernel_plan.kernel_groups("10_modern_decoder") if "swiglu_test" in g]
    assert swiglu == ("swiglu_test",)


# --- in a grading kernel, every in-kernel watch switched off ---------------------------------------

# What a learner's cell can do to the checks' own code in its kernel: replace every watch (the
# kernel watch, notebook 12's dispatch-mode watch, the tripwires, 11's look through an answer's
# objects, the profiler of Python calls) by one that watches nothing.
SWITCH_OFF = textwrap.dedent("""
    import contextlib as _contextlib, importlib as _importlib, sys as _sys
    _importlib.import_module("gra" + "ders.exercises.{module}")
    @_contextlib.contextmanager
    def _unwatched(*args, **kwargs):
        yield None
    class _Blind:
        def __init__(self, *args, **kwargs):
            pass
        def __enter__(self):
            return self
        def __exit__(self, *args):
            return False
        def refusal(self, *args, **kwargs):
            return None
        library_answer = refusal
    for _module in list(_sys.modules.values()):
        if getattr(_module, "__name__", "").startswith("gra" + "ders."):
            for _watch in ("ref" + "used", "_trip" + "wires", "refuse_library" + "_parts"):
                if hasattr(_module, _watch):
                    setattr(_module, _watch, _unwatched)
            if hasattr(_module, "Wat" + "ch") and _module.__name__.endswith("provenance"):
                setattr(_module, "Wat" + "ch", _Blind)
""")
# A LayerNorm whose forward is `_normalise`, torch's layer norm as some route reaches it.
LAYERNORM_BY = """
    class LayerNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.w, self.b = nn.Parameter(torch.ones(cfg.d_model)), nn.Parameter(torch.zeros(cfg.d_model))

        def forward(self, residual):
            return _normalise(residual, [residual.shape[-1]], self.w, self.b, self.cfg.layer_norm_eps)[0]
    """
# Torch's own kernel for the answer, taken under a computed name when the cell runs.
FORMS = {
    ("01_layernorm", "layernorm_answer", "layernorm_test", "nb01", "check_layernorm", "LayerNorm"):
        '_normalise = getattr(torch, "native_" + "layer" + "_norm")\n' + textwrap.dedent(LAYERNORM_BY),
    ("02_embeddings", "embed_answer", "embed_test", "nb02", "check_embed", "Embed"): """
        _kernel = getattr(torch, "embed" + "ding")

        class Embed(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.cfg = cfg
                self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

            def forward(self, tokens):
                return _kernel(self.W_E, tokens)
        """,
    ("04_mlp", "gelu_answer", "gelu_test", "nb04", "check_gelu_new", "gelu_new"): """
        _kernel = getattr(torch._C._nn, "ge" + "lu")

        def gelu_new(x):
            return _kernel(x, approximate="tanh")
        """,
    ("06_gpt2", "unembed_answer", "unembed_test", "nb06", "check_unembed", "Unembed"): """
        class Unembed(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.cfg = cfg
                self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
                self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab), requires_grad=False)

            def forward(self, normalized_resid_final):
                return getattr(torch._C._nn, "lin" + "ear")(normalized_resid_final, self.W_U.T, self.b_U)
        """,
    ("10_modern_decoder", "rms_norm_answer", "rms_norm_test", "nb10", "check_rms_norm", "RMSNorm"): """
        _kernel = getattr(torch, "rms" + "_norm")

        class RMSNorm(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.cfg = cfg
                self.w = nn.Parameter(torch.ones(cfg.d_model))

            def forward(self, x):
                return _kernel(x.float(), (x.shape[-1],), None, self.cfg.rms_norm_eps).to(x.dtype) * self.w
        """,
    ("12_training_step", "cross_entropy_answer", "cross_entropy_test", "nb12", "check_cross_entropy",
     "cross_entropy"): """
        _kernel = getattr(torch._C._nn, "cross_entropy" + "_loss")

        def cross_entropy(logits, targets, ignore_index=-100):
            return _kernel(logits.float().flatten(0, 1), targets.flatten(), None, 1, ignore_index, 0.0)
        """,
    ("12_training_step", "clip_answer", "clip_test", "nb12", "check_clip_grad_norm", "clip_grad_norm"): """
        _norms = getattr(torch, "_foreach" + "_norm")

        def clip_grad_norm(parameters, max_norm):
            grads = [p.grad for p in parameters if p.grad is not None]
            total_norm = torch.stack(list(_norms(grads))).norm()
            coefficient = max_norm / (total_norm + 1e-6)
            if coefficient < 1:
                for g in grads:
                    g.mul_(coefficient)
            return total_norm
        """,
    ("13_post_training", "sft_loss_answer", "sft_loss_test", "nb13", "check_sft_loss", "sft_loss"): """
        _kernel = getattr(torch._C._nn, "cross_entropy" + "_loss")

        def sft_loss(logits, labels):
            return _kernel(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), None, 1, -100, 0.0)
        """,
}


def _defined(form: str, name: str):
    import torch
    from torch import nn

    namespace = {"torch": torch, "nn": nn}
    exec(textwrap.dedent(form), namespace)
    return namespace[name]


def refused_then_right(check, form: str, name: str, refusal: str, monkeypatch) -> None:
    """In this process (nothing armed, nothing sealed): `check` refuses `name` as `form` defines
    it, matching `refusal`, and passes it with every watch switched off, so that a grading
    kernel's 0 for the same form is the kernel's own doing."""
    with pytest.raises(CheckFailed, match=refusal):
        check(_defined(form, name))
    _watches_off(monkeypatch)
    check(_defined(form, name))


def answered(notebook: str, grade_id: str, source: str, solved: bool = True):
    """The example class's submission of `notebook` (solved or not) with the answer cell
    `grade_id` holding `source`."""
    submission = example_class.submission(notebook, solved)
    (cell,) = [c for c in submission.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    cell.source = source
    return submission


def _watches_off(monkeypatch):
    """SWITCH_OFF in this process, undone when the test ends."""
    exec(SWITCH_OFF.replace("{module}", "nb01").replace("setattr(_module", "_patch(_module"),
         {"_patch": monkeypatch.setattr})


@pytest.mark.parametrize("key", FORMS, ids=[f"{k[0]}-{k[5]}" for k in FORMS])
def test_each_form_is_a_right_answer_that_only_the_refusal_stops(key, monkeypatch):
    import importlib

    notebook, _, _, module, check, name = key
    check_fn = getattr(importlib.import_module(f"graders.exercises.{module}"), check)
    refused_then_right(check_fn, FORMS[key], name, "torch's own kernel", monkeypatch)


@CONFINED
@pytest.mark.slow
@pytest.mark.parametrize("notebook", sorted({k[0] for k in FORMS}))
def test_library_kernels_score_nothing_with_every_watch_switched_off(notebook, tmp_path):
    """Each form, in its answer cell after code that switches off every in-kernel watch, scores 0
    in the grade, in the words of the check cell (which refuses the form with its watch on); the
    notebook's other exercises keep their points."""
    import importlib

    forms = {k: f for k, f in FORMS.items() if k[0] == notebook}
    submission = example_class.submission(notebook, True)
    expected = {}
    for (_, answer, test, module, check, name), form in forms.items():
        (cell,) = [c for c in submission.cells if c.metadata.get("nbgrader", {}).get("grade_id") == answer]
        cell.source = SWITCH_OFF.format(module=module) + textwrap.dedent(form)
        with pytest.raises(CheckFailed) as refused:
            getattr(importlib.import_module(f"graders.exercises.{module}"), check)(_defined(form, name))
        expected[test] = str(refused.value)
    cells, _, _ = grade(tmp_path, notebook, submission)
    for grade_id, cell in cells.items():
        if grade_id in expected:
            assert cell.points == 0 and cell.message == expected[grade_id], (grade_id, cell.message)
        else:
            assert cell.points == cell.max_points, (grade_id, cell.message)


WORKER = textwrap.dedent("""\
    # worker
    import io, struct, subprocess, sys
    _child = ("import io, struct, sys, torch\\n"
              "while True:\\n"
              "    n = struct.unpack('<Q', sys.stdin.buffer.read(8))[0]\\n"
              "    x = torch.load(io.BytesIO(sys.stdin.buffer.read(n)))\\n"
              "    out = io.BytesIO(); torch.save(torch.nn.functional.gelu(x, approximate='tanh'), out)\\n"
              "    sys.stdout.buffer.write(struct.pack('<Q', len(out.getvalue())) + out.getvalue())\\n"
              "    sys.stdout.buffer.flush()\\n")
    try:
        _worker = subprocess.Popen([sys.executable, "-c", _child], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    except OSError as err:
        print("not started:", err)

    def gelu_new(x):
        data = io.BytesIO(); torch.save(x, data)
        _worker.stdin.write(struct.pack('<Q', len(data.getvalue())) + data.getvalue()); _worker.stdin.flush()
        n = struct.unpack('<Q', _worker.stdout.read(8))[0]
        return torch.load(io.BytesIO(_worker.stdout.read(n)))
""")


@CONFINED
@pytest.mark.slow
def test_a_worker_process_started_before_the_check_cannot_compute_the_answer(tmp_path):
    """A fresh Python started by the learner's cell would have torch's kernels and none of the
    watches: a grading kernel cannot start a program (the same worker, in a learner's own kernel,
    starts and answers: test_each_form... above shows such a GELU is right)."""
    cells, _, executed = grade(tmp_path, "04_mlp", answered("04_mlp", "gelu_answer", WORKER, solved=False))
    assert cells["gelu_test"].points == 0
    assert printed(executed, "# worker").startswith("not started: [Errno 1] Operation not permitted")


# Torch's Python clipping (its per-gradient path runs ordinary operators, which no dispatcher
# refusal touches), called, and compiled again from the bytecode torch ships beside it.
PYTHON_ROUTES = {
    "called": """
        import importlib
        _clip = getattr(importlib.import_module("torch.nn.utils." + "clip_grad"), "clip_grad_norm" + "_")

        def clip_grad_norm(parameters, max_norm):
            return _clip(list(parameters), max_norm, foreach=False)
        """,
    "from its bytecode": """
        import importlib.util, marshal
        _compiled = importlib.util.cache_from_source(importlib.util.find_spec("torch.nn.utils." + "clip_grad").origin)
        _laundered = {"__name__": "laundered"}
        with open(_compiled, "rb") as _file:
            exec(marshal.loads(_file.read()[16:]), _laundered)

        def clip_grad_norm(parameters, max_norm):
            return _laundered["clip_grad_norm" + "_"](list(parameters), max_norm, foreach=False)
        """,
}


@pytest.mark.parametrize("form", PYTHON_ROUTES)
def test_torchs_python_clipping_is_right_once_the_watches_are_off(form, monkeypatch):
    from graders.exercises import nb12

    refused_then_right(nb12.check_clip_grad_norm, PYTHON_ROUTES[form], "clip_grad_norm", "clip_grad", monkeypatch)


@CONFINED
@pytest.mark.slow
@pytest.mark.parametrize("form", PYTHON_ROUTES)
def test_torchs_python_routines_are_sealed_in_the_kernel_that_grades_them(form, tmp_path):
    """With every in-kernel watch off, torch's clip_grad_norm_ (called, or its shipped bytecode
    run again) is a sealed copy in the kernel grading 12's clipping (graders.integrity.library_seals);
    the kernel grading 12's checkpoints, whose course code runs clip_grad_norm_, has the real one."""
    source = SWITCH_OFF.format(module="nb12") + textwrap.dedent(PYTHON_ROUTES[form])
    cells, _, _ = grade(tmp_path, "12_training_step", answered("12_training_step", "clip_answer", source))
    assert cells["clip_test"].points == 0
    assert "torch.nn.utils.clip_grad.clip_grad_norm_ is taken out of this grading kernel" in cells["clip_test"].message
    assert all(c.points == c.max_points for g, c in cells.items() if g != "clip_test"), cells


# Torch's reference implementations (torch._refs, the decomposition table): layer norm from
# ordinary operators, which no dispatcher refusal touches.
REFERENCE_ROUTES = {
    "torch._refs": """
        import importlib
        _normalise = getattr(importlib.import_module("torch." + "_refs"), "native_" + "layer" + "_norm")
        """,
    "torch._decomp's table": """
        import importlib
        _table = importlib.import_module("torch." + "_decomp").decomposition_table
        _normalise = _table[getattr(torch.ops.aten, "native_" + "layer" + "_norm").default]
        """,
}


@pytest.mark.parametrize("route", REFERENCE_ROUTES)
def test_torchs_reference_layernorm_is_right_once_the_watches_are_off(route, monkeypatch):
    from graders.exercises import nb01

    form = textwrap.dedent(REFERENCE_ROUTES[route]) + textwrap.dedent(LAYERNORM_BY)
    refused_then_right(nb01.check_layernorm, form, "LayerNorm", "library version|torch's own", monkeypatch)


@CONFINED
@pytest.mark.slow
@pytest.mark.parametrize("route", REFERENCE_ROUTES)
def test_torchs_reference_implementations_are_sealed_in_the_kernel_that_grades_them(route, tmp_path):
    source = (SWITCH_OFF.format(module="nb01") + textwrap.dedent(REFERENCE_ROUTES[route])
              + textwrap.dedent(LAYERNORM_BY))
    cells, _, _ = grade(tmp_path, "01_layernorm", answered("01_layernorm", "layernorm_answer", source))
    assert cells["layernorm_test"].points == 0
    assert "native_layer_norm is taken out of this grading kernel" in cells["layernorm_test"].message


def test_a_sealed_module_keeps_what_runs_as_torch_loads():
    """clip_grad's `_no_grad` decorates its functions as the module loads, and torch._decomp's
    `register_decomposition` decorates other modules' functions as torch loads: both stay real,
    or torch would not load in the kernel; the routines that compute answers are sealed."""
    from graders.integrity.library_seals import seals

    (clip,) = seals(["torch.nn.utils.clip_grad"]).values()
    assert "clip_grad_norm_" in clip and "_get_total_norm" in clip and "_no_grad" not in clip
    references = {path.as_posix().split("/torch/")[1]: names
                  for path, names in seals(["torch._refs", "torch._decomp"]).items()}
    assert "native_layer_norm" in references["_refs/__init__.py"]
    assert "register_decomposition" not in references["_decomp/__init__.py"]


# GPT-2's own tokenizer (tiktoken's compiled encoder, as the course builds it offline) for 11's decode.
TIKTOKEN_DECODE = """
    import importlib
    _encoding = getattr(importlib.import_module("graders.reference." + "tokenizer"), "gpt2" + "_encoding")

    def decode(ids):
        return _encoding().decode(ids)
    """


def test_tiktoken_decoding_is_right_once_the_watches_are_off(monkeypatch):
    from graders.exercises import nb11

    refused_then_right(nb11.check_decode, TIKTOKEN_DECODE, "decode", "tiktoken|library", monkeypatch)


@CONFINED
@pytest.mark.slow
def test_a_grading_kernel_of_11_holds_no_tokenizer_library(tmp_path):
    """tiktoken and HF tokenizers are not in 11's grading kernels (`Notebook.without_libraries`):
    with every watch off, decoding with tiktoken scores 0; the solution keeps every point."""
    source = SWITCH_OFF.format(module="nb11") + textwrap.dedent(TIKTOKEN_DECODE)
    cells, _, _ = grade(tmp_path, "11_tokenizer", answered("11_tokenizer", "decode_answer", source))
    assert cells["decode_test"].points == 0
    assert all(c.points == c.max_points for g, c in cells.items() if g != "decode_test"), cells


# 03's Attention (the solution's class, its masking included) with torch's attention kernel in its
# forward.
SDPA_FORWARD = """
        x = normalized_resid_pre[:, None]
        q, k, v = (x @ w + b[:, None]
                   for w, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V)))
        return (_attend(q, k, v, is_causal=True) @ self.W_O).sum(dim=1) + self.b_O
"""
SDPA = '_attend = getattr(torch._C._nn, "scaled_dot_product" + "_attention")\n'
IN_PROCESS = "from __future__ import annotations\nimport math\n"   # what the notebook's setup gives the cell


def _attention_by_kernel():
    """The solved 03 and its answer cell, whose forward's body is SDPA_FORWARD."""
    import re

    notebook = example_class.submission("03_attention", True)
    (cell,) = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "attention_answer"]
    body = re.compile(r"        x = normalized_resid_pre\n.*?        return \(z @ self\.W_O\)[^\n]*\n", re.S)
    assert body.search(cell.source), "the solution's forward has changed: change SDPA_FORWARD's place too"
    cell.source = body.sub(SDPA_FORWARD.lstrip("\n"), cell.source, count=1)
    return notebook, cell


def test_attention_by_torchs_kernel_is_right_once_the_watches_are_off(monkeypatch):
    from graders.exercises import nb03

    _, cell = _attention_by_kernel()
    refused_then_right(nb03.check_attention, IN_PROCESS + SDPA + cell.source, "Attention",
                       "aten::scaled_dot_product_attention", monkeypatch)


@CONFINED
@pytest.mark.slow
def test_attention_by_torchs_kernel_scores_nothing_with_every_watch_switched_off(tmp_path):
    from graders.exercises import nb03

    notebook, cell = _attention_by_kernel()
    with pytest.raises(CheckFailed) as refused:
        nb03.check_attention(_defined(IN_PROCESS + SDPA + cell.source, "Attention"))
    cell.source = SWITCH_OFF.format(module="nb03") + SDPA + cell.source
    cells, _, _ = grade(tmp_path, "03_attention", notebook)
    assert cells["attention_test"].points == 0 and cells["attention_test"].message == str(refused.value)
    assert all(c.points == c.max_points for g, c in cells.items() if g != "attention_test"), cells
