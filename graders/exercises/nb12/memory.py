"""Notebook 12, exercise 4: where a training step's memory goes.

`training_state_bytes(model, mixed_precision)`: the bytes of the parameters, their gradients and
AdamW's two moments, judged against what a real step holds: the judge trains a course GPT-2 (whose
unembedding bias is frozen: no gradient, no moments) for one step, under bf16 autocast or not, and
measures the tensors after backward() and step().

`saved_activation_bytes(model, *inputs)`: the bytes of what autograd
keeps for the backward pass while `model(*inputs)` runs, judged against the judge's own
measurement through torch.autograd.graph.saved_tensors_hooks: the distinct storages saved, at
their size in bytes, the model's parameters left out (they are counted as parameters). Cases: a
course TransformerBlock in float32 and under bfloat16 autocast (which saves bf16 copies of its
matrix products' inputs and weights), and a small course GPT-2 on tokens.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from graders.integrity.library_kernels import SOFTMAX_RUNS
from graders.exercises.nb12.loss import NOTEBOOK
from graders.exercises.nb12.readers import described_keys, items_of, shown, whole_number
from graders.judging.cases import Case
from graders.judging.compare import CheckFailed, Mistake, mistake_key
from graders.integrity import Guard
from graders.judging.exercise import Exercise
from graders.judging.learner import Forbidden, run_learner
from graders.reference.config import Config
from graders.marks import course_answer

FORBIDDEN = Forbidden("the measure of saved activations", source_words=["torch.cuda.memory", "memory_stats"],
                      instead="with torch.autograd.graph.saved_tensors_hooks", notebook_wide=False)
CASES = (("a TransformerBlock, float32", "block", False), ("a TransformerBlock under bfloat16 autocast", "block", True),
         ("a 2-layer GPT-2 on tokens, float32", "model", False))
# Hidden: a saved tensor that shows only part of its storage (the course's modules save none).
PARTIAL_VIEW = ("a module whose sin saves three quarters of a tensor (a view), float32", "view", False)


def cases(case: Case) -> tuple:
    return CASES if case.seed == 0 else (*CASES, PARTIAL_VIEW)


class SavesAPartialView(torch.nn.Module):
    """x @ W, then sin of its first three quarters of columns: sin saves that view, whose storage
    holds the whole product."""

    def __init__(self, d: int):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        product = x @ self.W
        return product[..., : 3 * product.shape[-1] // 4].sin()


def small_config(case: Case) -> Config:
    if case.seed == 0:
        return Config(d_vocab=60, n_ctx=16, d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=128)
    return Config(d_vocab=45, n_ctx=24, d_model=24, n_layers=2, n_heads=3, d_head=8, d_mlp=96)


def measured_run(case: Case, what: str):
    """(module, inputs) of a case: seeded, so that kernel and judge build the same."""
    from graders.reference.components import DemoTransformer, TransformerBlock

    cfg = small_config(case)
    with torch.random.fork_rng():
        torch.manual_seed(case.seed)
        if what == "block":
            return TransformerBlock(cfg), (torch.randn(case.batch, case.seq, cfg.d_model, requires_grad=True),)
        if what == "view":
            return SavesAPartialView(cfg.d_model), (torch.randn(case.batch, case.seq, cfg.d_model, requires_grad=True),)
        return DemoTransformer(cfg), (torch.randint(0, cfg.d_vocab, (case.batch, case.seq)),)


def produce(saved_activation_bytes, case: Case, inputs: dict) -> dict:
    if not callable(saved_activation_bytes):
        raise CheckFailed(f"saved_activation_bytes: expected your function, got {saved_activation_bytes!r}.")
    outputs = {}
    for i, (label, what, mixed) in enumerate(cases(case)):
        model, args = measured_run(case, what)
        with torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed), \
                _pack_hooks() as packs:
            found = run_learner("saved_activation_bytes", _with_grad, saved_activation_bytes, model, *args,
                                forbidden=FORBIDDEN)
        outputs["pack_returns_none"] = torch.tensor(bool(outputs.get("pack_returns_none", False)) or _drops(packs))
        if whole_number(found) is None:
            raise CheckFailed(f"saved_activation_bytes returned {shown(found)} on {label}; return a number of bytes, "
                              "a Python int.")
        outputs[f"bytes_{i}"] = torch.tensor(whole_number(found), dtype=torch.int64)
    return outputs


@contextlib.contextmanager
def _pack_hooks():
    """The pack hooks given to saved_tensors_hooks while the body runs (the class's own __init__ is
    wrapped, so a name bound before the check still leads here)."""
    hooks = torch.autograd.graph.saved_tensors_hooks
    original, packs = hooks.__init__, []

    def __init__(self, pack_hook, unpack_hook):
        packs.append(pack_hook)
        original(self, pack_hook, unpack_hook)
    hooks.__init__ = __init__
    try:
        yield packs
    finally:
        hooks.__init__ = original


def _drops(packs: list) -> bool:
    """Whether a pack hook of the learner's returns None for a tensor (autograd then keeps nothing)."""
    for pack in packs:
        try:
            if pack(torch.zeros(1)) is None:
                return True
        except Exception:   # the learner's hook on a probe it was not written for: no verdict from it
            continue
    return False


def _with_grad(fn, *args):
    """Autograd on (run_learner runs the learner's code under no_grad): nothing is saved without it."""
    with torch.enable_grad():
        return fn(*args)


@course_answer("saved_activation_bytes")
def saved_records(model: torch.nn.Module, args: tuple, mixed: bool) -> list[dict]:
    """Every tensor autograd saves while `model(*args)` runs: its storage, the storage's bytes, its
    own address, bytes and element size, whether it is a parameter's storage, whether it is a parameter
    object itself."""
    owned = list(model.parameters())
    parameters = {p.untyped_storage().data_ptr() for p in owned}
    records = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        records.append({"storage": storage.data_ptr(), "storage_bytes": storage.nbytes(), "address": t.data_ptr(),
                        "bytes": t.numel() * t.element_size(), "element": t.element_size(),
                        "parameter": storage.data_ptr() in parameters,
                        "parameter_object": any(t is p for p in owned)})
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        kept = model(*args)   # alive until the records are made: no storage is freed and reused
    del kept
    return records


PACK_RETURNS_NONE = Mistake(
    "pack_returns_none",
    "the pack hook returns None, so autograd keeps nothing: each saved tensor can be freed at once and its "
    "storage's address given to the next, so what is counted depends on the allocator, and the backward pass "
    "fails. Return the tensor from pack, and from unpack what pack returned")


def counts_mistakes(records: list[dict]) -> dict[str, int]:
    """What the measure gives, counted rightly ("") and as each listed mistake counts."""
    distinct = {r["storage"]: r for r in records if not r["parameter"]}
    with_parameters = {r["storage"]: r for r in records}
    return {
        "": sum(r["storage_bytes"] for r in distinct.values()),
        Mistake("storage_counted_twice", "a storage saved twice is counted twice (a tensor and its view, or one "
                "tensor saved by two operations): count each storage once, by untyped_storage().data_ptr()"):
            sum(r["storage_bytes"] for r in records if not r["parameter"]),
        Mistake("numbers_not_bytes", "numbers are counted, not bytes: a float32 number takes 4 bytes, a bfloat16 "
                "one 2"):
            sum(r["storage_bytes"] // r["element"] for r in distinct.values()),
        Mistake("parameters_counted", "the model's parameters are counted (a matrix product saves its weight): "
                "they are in memory anyway, counted as parameters; leave out the storages of model.parameters()"):
            sum(r["storage_bytes"] for r in with_parameters.values()),
        Mistake("every_tensor_counted", "every saved tensor is counted at its own size, parameters and repeats "
                "included: count the distinct storages that are not parameters"): sum(r["bytes"] for r in records),
        Mistake("four_bytes_each", "every number is counted as 4 bytes: under autocast the matrix products save "
                "bfloat16 copies, 2 bytes a number; count storage.nbytes(), which knows the dtype"):
            sum(r["storage_bytes"] // r["element"] * 4 for r in distinct.values()),
        Mistake("tensor_not_storage", "each saved tensor is counted by its own address and size (data_ptr(), "
                "numel() * element_size()), not by its storage: a view that shows part of its storage (here sin's "
                "input, three quarters of the product) keeps the whole storage alive; count "
                "untyped_storage().nbytes(), once per untyped_storage().data_ptr()"):
            sum(r["bytes"] for r in {r["address"]: r for r in records if not r["parameter"]}.values()),
        Mistake("parameters_by_identity", "parameters are told apart by identity (t is p, or t in a set of "
                "parameters): a saved weight is often another tensor object, a view or a transpose, on the "
                "parameter's storage; compare storages, t.untyped_storage().data_ptr() against the parameters'"):
            sum(r["storage_bytes"] for r in {r["storage"]: r for r in records if not r["parameter_object"]}.values()),
    }


def judge(case: Case, outputs: dict) -> None:
    if bool(outputs.get("pack_returns_none", False)):   # before any count: those vary from run to run
        raise CheckFailed(f"saved_activation_bytes: Likely mistake: {PACK_RETURNS_NONE}.",
                          mistake=mistake_key(PACK_RETURNS_NONE))
    for i, (label, what, mixed) in enumerate(cases(case)):
        model, args = measured_run(case, what)
        counts = counts_mistakes(saved_records(model, args, mixed))
        got = int(outputs[f"bytes_{i}"])
        if got == counts[""]:
            continue
        shape = f"batch {case.batch} x {case.seq} {'tokens' if what == 'model' else 'positions'}"
        head = (f"saved_activation_bytes on {label} ({shape}) = {got:,}; the storages autograd keeps for the "
                f"backward pass, parameters left out, hold {counts['']:,} bytes.")
        named = next((description for description, count in counts.items() if description and count == got), None)
        if named:
            raise CheckFailed(f"{head} Likely mistake: {named}.", mistake=mistake_key(named))
        if got == 0:
            raise CheckFailed(f"{head} Likely mistake: nothing was recorded: run model(*inputs) inside "
                              "`with torch.autograd.graph.saved_tensors_hooks(pack, unpack):`, where pack "
                              "records each tensor and returns it, and unpack returns what pack returned.",
                              mistake="nothing_recorded")
        ratio = got / counts[""]
        raise CheckFailed(f"{head} (Yours is {ratio:.3g} times that.) Count each saved storage once, at "
                          "untyped_storage().nbytes(), and leave out the storages of model.parameters().")


# --- training_state_bytes ----------------------------------------------------------------------

STATE_KEYS = ("parameters", "gradients", "adam_moments")


def produce_state(training_state_bytes, case: Case, inputs: dict) -> dict:
    if not callable(training_state_bytes):
        raise CheckFailed(f"training_state_bytes: expected your function, got {training_state_bytes!r}.")
    outputs = {}
    for mixed in (False, True):
        model, _ = measured_run(case, "model")
        found = run_learner("training_state_bytes", training_state_bytes, model, mixed)
        items = items_of(found)
        named = {key: value for key, value in items or () if isinstance(key, str)}
        if items is None or len(items) != len(STATE_KEYS) or set(named) != set(STATE_KEYS):
            keys = f" with the keys {described_keys(key for key, _ in items)}" if items else ""
            raise CheckFailed(f"training_state_bytes returned {type(found).__name__}{keys}; return a dict with "
                              f"the keys {list(STATE_KEYS)}, each a number of bytes (an int).")
        for key in STATE_KEYS:
            if whole_number(named[key]) is None:
                raise CheckFailed(f"training_state_bytes(...)[{key!r}] is {shown(named[key])}; a number of bytes "
                                  "is an int.")
            outputs[f"{key}_{int(mixed)}"] = torch.tensor(whole_number(named[key]), dtype=torch.int64)
    return outputs


@functools.lru_cache(maxsize=8)
def measured_state(case: Case, mixed: bool) -> dict[str, int]:
    """The bytes a real training step holds: one step of torch's AdamW on the course's GPT-2 (the
    same for every learner, so kept)."""
    import torch.nn.functional as F

    model, (tokens,) = measured_run(case, "model")
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        logits = model(tokens)
    F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    return {"parameters": sum(p.nbytes for p in model.parameters()),
            "gradients": sum(p.grad.nbytes for p in model.parameters() if p.grad is not None),
            "adam_moments": sum(state[key].nbytes for state in optimizer.state.values()
                                for key in ("exp_avg", "exp_avg_sq"))}


def state_mistakes(case: Case, right: dict[str, int]) -> dict[str, tuple[str, int]]:
    """(key, what it answers) of each listed mistake."""
    model, _ = measured_run(case, "model")
    frozen = sum(p.nbytes for p in model.parameters() if not p.requires_grad)
    return {
        Mistake("frozen_gradients", "the frozen parameters get gradients here: a parameter with "
                "requires_grad=False (the course's unembedding bias b_U) has no gradient; count p.grad only for "
                "parameters that require grad"):
            ("gradients", right["gradients"] + frozen),
        Mistake("frozen_moments", "the frozen parameters get moments here: AdamW keeps moments only for the "
                "parameters it updates (those that require grad)"):
            ("adam_moments", right["adam_moments"] + 2 * frozen),
        Mistake("one_moment", "one moment is counted: AdamW keeps two per parameter, exp_avg and exp_avg_sq"):
            ("adam_moments", right["adam_moments"] // 2),
        Mistake("bfloat16_parameters", "the master weights are counted in bfloat16 under mixed precision: "
                "autocast casts copies for the matrix products; the parameters themselves stay float32"):
            ("parameters", right["parameters"] // 2),
        Mistake("bfloat16_gradients", "the gradients are counted in bfloat16 under mixed precision: a float32 "
                "parameter's gradient is float32"): ("gradients", right["gradients"] // 2),
        Mistake("bfloat16_moments", "the moments are counted in bfloat16 under mixed precision: AdamW keeps them "
                "in the parameters' dtype, float32"): ("adam_moments", right["adam_moments"] // 2),
    }


def judge_state(case: Case, outputs: dict) -> None:
    for mixed in (False, True):
        right = measured_state(case, mixed)
        for key in STATE_KEYS:
            got = int(outputs[f"{key}_{int(mixed)}"])
            if got == right[key]:
                continue
            head = (f"training_state_bytes(model, mixed_precision={mixed})[{key!r}] = {got:,}; after backward() "
                    f"and step() of torch's AdamW the {key.replace('_', ' ')} hold {right[key]:,} bytes.")
            named = next((description for description, (where, count) in state_mistakes(case, right).items()
                          if where == key and count == got), None)
            raise CheckFailed(f"{head} Likely mistake: {named}." if named else
                              f"{head} Count p.nbytes (numel times the bytes of its dtype) of the tensors that "
                              "exist: every parameter; a gradient and two moments for each parameter that "
                              "requires grad.", mistake=mistake_key(named))


state_exercise = Exercise(NOTEBOOK, "training_state_bytes", produce_state, judge_state,
                          defaults={"text": None, "batch": 2, "seq": 8})
check_training_state_bytes = state_exercise.checker(
    "Grade `training_state_bytes(model, mixed_precision)` against the tensors of a real training step.")


# --- saved_activation_bytes ---------------------------------------------------------------------

def _measured_modules() -> tuple:
    """The course's modules the learner's measure runs (they are what is measured)."""
    from graders.reference import components as c

    return (c.TransformerBlock, c.DemoTransformer, c.LayerNorm, c.Attention, c.MLP, c.Embed, c.PosEmbed,
            c.Unembed, c.gelu_new)


exercise = Exercise(NOTEBOOK, "saved_activation_bytes", produce, judge, forbidden=(FORBIDDEN,),
                    defaults={"text": None, "batch": 2, "seq": 8},
                    guard=Guard(supplies=(*_measured_modules(), _pack_hooks),
                                may_run=SOFTMAX_RUNS))   # the course's model it measures
check_saved_activation_bytes = exercise.checker(
    "Grade `saved_activation_bytes(model, *inputs)` against a measurement with saved_tensors_hooks.")
