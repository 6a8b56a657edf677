"""Lookup cheats: no check can be answered by reading a file (issue: integrity, round 2).

A cheat keeps a wrong implementation and adds a cell that patches its `forward`: when the input
equals a tensor stored in any readable safetensors file, it returns the stored tensor of the
matching output hook (TransformerLens names, public knowledge). Graded by the instructor's
harness as root, every such submission scores 0 on that exercise, exactly as without the cheat,
because a grading kernel receives inputs only, and each exercise is also judged on inputs that
no file holds (its expected outputs are computed by the judge with the course's components).
The in-process tests give the lookup the reference activations themselves (more than any file
in a grading kernel holds) and show that the unseen-input checks alone catch it.
"""
import pytest
import torch

from graders.course import example_class
from graders.judging.cases import Case, activations
from graders.judging.compare import CheckFailed
from test_integrity import CONFINED, crafted, grade, printed

pytestmark = pytest.mark.xdist_group("lookup")

# notebook: (answer cell, wrong edit (old, new), test cell, class patched, (input hook, output hook) pairs)
CHEATS = {
    "01_layernorm": ("layernorm_answer",
                     ("centred.pow(2).mean(dim=-1, keepdim=True)", "centred.var(dim=-1, keepdim=True)"),
                     "layernorm_test", "LayerNorm",
                     [("hook_resid_pre", "ln1.hook_out"), ("hook_resid_mid", "ln2.hook_out"),
                      ("blocks.11.hook_resid_post", "ln_final.hook_out")]),
    "02_embeddings": ("pos_embed_answer", ("self.W_pos[:seq_len]", "self.W_pos[1:seq_len + 1]"),
                      "pos_embed_test", "PosEmbed", []),
    "03_attention": ("attention_answer", ("math.sqrt(self.cfg.d_head)", "math.sqrt(self.cfg.d_model)"),
                     "attention_test", "Attention", [("ln1.hook_out", "hook_attn_out")]),
    "04_mlp": ("mlp_answer", ('d_mlp") + self.b_in', 'd_mlp")'),        # b_in left out
               "mlp_test", "MLP", [("ln2.hook_out", "hook_mlp_out")]),
    "05_transformer_block": ("block_answer", ("resid_mid = resid_pre + self.attn(self.ln1(resid_pre))",
                                              "resid_mid = self.attn(self.ln1(resid_pre))"),
                             "block_test", "TransformerBlock", [("hook_resid_pre", "hook_resid_post")]),
    "06_gpt2": ("unembed_answer", ("normalized_resid_final @ self.W_U + self.b_U", "normalized_resid_final @ self.W_U"),
                "unembed_test", "Unembed", [("ln_final.hook_out", "logits")]),
}

CHEAT_CELL = '''# lookup cheat
import os, torch
from safetensors import safe_open
_PAIRS = {pairs!r}
_FILES, _HITS = [], []
for _root, _dirs, _names in os.walk("/"):
    _dirs[:] = [d for d in _dirs if os.path.join(_root, d) not in ("/proc", "/sys", "/dev")]
    _FILES += [os.path.join(_root, n) for n in _names if n.endswith(".safetensors")]

def _stored_answer(x):
    for path in _FILES:
        try:
            with safe_open(path, framework="pt") as f:
                keys = set(f.keys())
                for key in keys:
                    if tuple(f.get_slice(key).get_shape()) == tuple(x.shape) and torch.equal(f.get_tensor(key), x):
                        for given, answer in _PAIRS:
                            if key.endswith(given) and key[:-len(given)] + answer in keys:
                                _HITS.append(key)
                                return f.get_tensor(key[:-len(given)] + answer)
        except Exception:
            continue
    return None

_own_forward = {cls}.forward
def _forward(self, x, *args, **kwargs):
    found = _stored_answer(x) if isinstance(x, torch.Tensor) else None
    return found if found is not None else _own_forward(self, x, *args, **kwargs)
{cls}.forward = _forward
print("readable safetensors files:", len(_FILES))
'''
REPORT_CELL = '# cheat report\nprint("answers found in files:", len(_HITS))\n'


def submission(name, cheat: bool):
    answer, (old, new), test, cls, pairs = CHEATS[name]
    extra = {answer: [CHEAT_CELL.format(pairs=pairs, cls=cls)], test: [REPORT_CELL]} if cheat else {}
    return crafted(name, edits=[(name, answer, old, new)], extra=extra)


@CONFINED
@pytest.mark.parametrize("cheat", [True, False], ids=["with lookup cell", "without"])
@pytest.mark.parametrize("name", sorted(CHEATS))
@pytest.mark.slow
def test_a_wrong_implementation_scores_zero_with_or_without_a_lookup_cell(tmp_path, name, cheat):
    cells, _, executed = grade(tmp_path, name, submission(name, cheat))
    test_cell = CHEATS[name][2]
    assert cells[test_cell].points == 0, cells[test_cell].message
    if cheat:
        scanned = printed(executed, "# lookup cheat")
        assert scanned.startswith("readable safetensors files:") and int(scanned.split(":")[1]) >= 1
        assert printed(executed, "# cheat report").strip() == "answers found in files: 0"


# --- In process: a lookup that has every reference activation, and the checks that catch it ----

def _lookup_class(wrong_cls, pairs, cases):
    """`wrong_cls` answering every graded input from the reference activations of `cases`."""
    table = []
    for case in cases:
        acts = activations(case)
        table += [(acts[k], acts[k[:-len(a)] + b]) for k in acts for a, b in pairs
                  if k.endswith(a) and k[:-len(a)] + b in acts]

    class Lookup(wrong_cls):
        def forward(self, x, *args, **kwargs):
            for given, answer in table:
                if given.shape == x.shape and torch.equal(given, x):
                    return answer.clone()
            return super().forward(x, *args, **kwargs)

    return Lookup


def _learner(name, wrong: bool, defined: str | None = None):
    """What the notebook's setup and answer cells define as `defined` (default: the class of
    `name`'s cheat), from the solution, or with the cheat's wrong edit."""
    answer, (old, new), _, cls, _ = CHEATS[name]
    notebook = example_class.submission(name, True, [(name, answer, old, new)] if wrong else [])
    namespace = {}
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if cell.cell_type == "code" and (grade_id == "setup" or grade_id.endswith("answer")):
            exec(compile(cell.source, f"<{name}>", "exec"), namespace)
    return namespace[defined or cls]


LOOKUP_TARGETS = ["01_layernorm", "03_attention", "04_mlp", "05_transformer_block", "06_gpt2"]


@pytest.mark.parametrize("name", LOOKUP_TARGETS)
def test_a_perfect_lookup_of_reference_activations_fails(name):
    """Every graded input of the visible and hidden checks answered from the reference."""
    from graders.harness.manifest import notebook_checks
    from graders.exercises import find

    test_cell = CHEATS[name][2]
    checks = notebook_checks(name)[test_cell]
    lookup = _lookup_class(_learner(name, wrong=True), CHEATS[name][4], [Case(**c) for _, c in checks])
    for key, fields in checks:
        with pytest.raises(CheckFailed):
            find(key).check(lookup, Case(**fields))


# notebook: (exercise, the output keys computed on inputs no file holds)
UNSEEN = {"01_layernorm": ("LayerNorm", ["random_out", "unseen_out"]),
          "03_attention": ("Attention", ["random_out", "unseen_out"]),
          "04_mlp": ("MLP", ["random_out", "unseen_out"]),
          "05_transformer_block": ("TransformerBlock", ["random_out", "unseen_out"])}


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_the_unseen_input_checks_alone_fail_a_wrong_implementation(name):
    """Right wherever a file could hold the answer, wrong on inputs made in the kernel: fails."""
    from graders.exercises import find

    exercise, keys = find((name, UNSEEN[name][0])), UNSEEN[name][1]
    case = Case()
    right = exercise.produce(_learner(name, wrong=False), case, exercise.inputs(case))
    wrong = exercise.produce(_learner(name, wrong=True), case, exercise.inputs(case))
    exercise.judge(case, right)
    for key in keys:
        with pytest.raises(CheckFailed, match="random|no file holds"):
            exercise.judge(case, {**right, key: wrong[key]})


def test_the_model_and_loss_checks_on_unseen_inputs_fail_a_wrong_implementation():
    from graders.exercises import find

    case = Case()
    model = find(("06_gpt2", "DemoTransformer"))
    right = model.produce(_learner("06_gpt2", False, "DemoTransformer"), case, {})
    model.judge(case, right)
    with pytest.raises(CheckFailed, match="random tokens"):
        model.judge(case, {**right, "random_out": right["random_out"] * 1.01})
    loss = find(("06_gpt2", "next_token_loss"))
    right = loss.produce(_learner("06_gpt2", False, "next_token_loss"), case, loss.inputs(case))
    loss.judge(case, right)
    with pytest.raises(CheckFailed, match="no file holds"):
        loss.judge(case, {**right, "unseen_loss": right["unseen_loss"] * 1.01})

