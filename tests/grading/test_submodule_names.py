"""A learner's submodule named otherwise than the exercise's (`attention_heads` for `attn`) fails
the check with the names, and the message also says whether the computation under the learner's
own names is right: fixing the name must not reveal a second failure."""
import pytest
from torch import nn

from graders.exercises import nb05, nb06
from graders.judging.compare import CheckFailed
from graders.judging.learner import load_learner
from graders.judging.records import load_records, write_record
from graders.judging.verdict import LearnerCode, Verdict, decide, forbidden_message
from graders.reference import components
from graders.reference.components import MLP, Attention, Embed, LayerNorm, PosEmbed, TransformerBlock, Unembed
from graders.reference.config import Config
from graders.reference.store import part
from graders.reference.weights import WeightLoadError, load_strict, renamed_submodule, submodule_renaming

from course_code import course_code_allowed

# The learners' models here are assembled from the course's parts, renamed.
components_allowed = course_code_allowed(components)

# --- Which renamings are found: names and shapes only ---------------------------------------

ATTN = {"W_Q": (12, 768, 64), "W_O": (12, 64, 768), "b_Q": (12, 64), "b_O": (768,)}
LN = {"w": (768,), "b": (768,)}


def params(**submodules) -> dict[str, tuple]:
    """Parameter names and shapes of a module with these submodules ({attribute: {name: shape}})."""
    return {f"{sub}.{name}": shape for sub, names in submodules.items() for name, shape in names.items()}


@pytest.mark.parametrize("ours, theirs, pair", [
    ("attn.W_Q", "attention_heads.W_Q", ("attn", "attention_heads")),
    ("blocks.0.attn.W_Q", "blocks.0.self_attn.W_Q", ("blocks.0.attn", "blocks.0.self_attn")),
    ("blocks.0.ln1.w", "layers.0.ln1.w", ("blocks", "layers")),
    ("blocks.0.attn.W_Q", "blocks.1.self_attn.W_Q", None),     # another block, not a renaming
    ("attn.W_Q", "attention.heads.W_Q", None),                 # moved deeper
    ("W_Q", "attn.W_Q", None),                                 # a parameter put in a submodule
    ("ln1.w", "ln1.gamma", None),                              # no common suffix
])
def test_two_parameter_names_pair_up_by_their_longest_common_suffix(ours, theirs, pair):
    assert renamed_submodule(ours, theirs) == pair


def test_a_renamed_submodule_is_found():
    block = params(ln1=LN, attn=ATTN)
    theirs = params(ln1=LN, attention_heads=ATTN)
    assert submodule_renaming(block, theirs) == {"attn": "attention_heads"}


def test_two_renamed_submodules_with_different_contents_are_told_apart():
    block = params(ln1=LN, attn=ATTN, mlp={"W_in": (768, 3072), "b_out": (768,)})
    theirs = params(ln1=LN, heads=ATTN, feed_forward={"W_in": (768, 3072), "b_out": (768,)})
    assert submodule_renaming(block, theirs) == {"attn": "heads", "mlp": "feed_forward"}


def test_a_submodule_renamed_in_every_block_is_found_block_by_block():
    model = {f"blocks.{i}.{n}": s for i in range(3) for n, s in params(ln1=LN, attn=ATTN).items()}
    theirs = {f"blocks.{i}.{n}": s for i in range(3) for n, s in params(ln1=LN, self_attn=ATTN).items()}
    assert submodule_renaming(model, theirs) == {f"blocks.{i}.attn": f"blocks.{i}.self_attn" for i in range(3)}


def test_a_renamed_list_of_blocks_is_found():
    model = {f"blocks.{i}.{n}": s for i in range(3) for n, s in params(ln1=LN, attn=ATTN).items()}
    theirs = {f"layers.{i}.{n}": s for i in range(3) for n, s in params(ln1=LN, attn=ATTN).items()}
    assert submodule_renaming(model, theirs) == {"blocks": "layers"}


def test_submodules_that_could_be_either_give_no_renaming():
    """ln1 and ln2 hold the same parameters: which of norm_a, norm_b is which cannot be told."""
    assert submodule_renaming(params(ln1=LN, ln2=LN), params(norm_a=LN, norm_b=LN)) is None


def test_one_submodule_for_two_of_the_exercises_gives_no_renaming():
    """A LayerNorm shared by both places (`self.norm` for ln1 and ln2) is no renaming."""
    assert submodule_renaming(params(ln1=LN, ln2=LN), params(norm=LN)) is None


def test_a_renamed_submodule_with_another_shape_gives_no_renaming():
    other = {**ATTN, "W_O": (768, 768)}
    assert submodule_renaming(params(attn=ATTN), params(attention_heads=other)) is None


def test_a_wrong_shape_elsewhere_gives_no_renaming():
    theirs = params(ln1={"w": (768,), "b": (1,)}, attention_heads=ATTN)
    assert submodule_renaming(params(ln1=LN, attn=ATTN), theirs) is None


@pytest.mark.parametrize("theirs", [
    {"gamma": (768,), "beta": (768,)},                                   # parameters renamed
    params(ln1={"gamma": (768,), "beta": (768,)}),                       # ... inside a submodule
    params(norm={"gamma": (768,), "beta": (768,)}),                      # ... and the submodule too
], ids=["top level", "in a submodule", "both"])
def test_renamed_parameters_give_no_renaming(theirs):
    ours = LN if "gamma" in theirs else params(ln1=LN)
    assert submodule_renaming(ours, theirs) is None


def test_a_parameter_missing_beside_the_renamed_submodule_gives_no_renaming():
    theirs = params(ln1={"w": (768,)}, attention_heads=ATTN)
    assert submodule_renaming(params(ln1=LN, attn=ATTN), theirs) is None


def test_a_parameter_of_their_own_beside_the_renamed_submodule_gives_no_renaming():
    theirs = {**params(ln1=LN, attention_heads=ATTN), "scale": (1,)}
    assert submodule_renaming(params(ln1=LN, attn=ATTN), theirs) is None


def test_a_submodule_kept_beside_its_renamed_copy_gives_no_renaming():
    """`attn` holds some of its parameters, `attention_heads` all of them: not a renaming."""
    theirs = {**params(attention_heads=ATTN), "attn.W_Q": ATTN["W_Q"]}
    assert submodule_renaming(params(attn=ATTN), theirs) is None


def test_a_renamed_submodule_missing_a_parameter_gives_no_renaming():
    partial = {k: v for k, v in ATTN.items() if k != "b_O"}
    assert submodule_renaming(params(attn=ATTN), params(attention_heads=partial)) is None


def test_a_submodule_moved_deeper_gives_no_renaming():
    theirs = {f"attention.heads.{n}": s for n, s in ATTN.items()}
    assert submodule_renaming(params(attn=ATTN), theirs) is None


def test_a_learner_with_the_exercises_names_needs_no_renaming():
    assert submodule_renaming(params(attn=ATTN), params(attn=ATTN)) is None


# --- End to end: 05's TransformerBlock with `attention_heads` for `attn` -----------------------

class GivenNames(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn = LayerNorm(cfg), Attention(cfg)
        self.ln2, self.mlp = LayerNorm(cfg), MLP(cfg)


class OwnNames(nn.Module):
    """The given submodules, attention under another name."""
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attention_heads = LayerNorm(cfg), Attention(cfg)
        self.ln2, self.mlp = LayerNorm(cfg), MLP(cfg)


def textbook(block, attention, resid_pre):
    resid_mid = resid_pre + attention(block.ln1(resid_pre))
    return resid_mid + block.mlp(block.ln2(resid_mid))


def without_attention_residual(block, attention, resid_pre):
    resid_mid = attention(block.ln1(resid_pre))
    return resid_mid + block.mlp(block.ln2(resid_mid))


def attention_given_tokens_shape(block, attention, resid_pre):
    resid_mid = resid_pre + attention(block.ln1(resid_pre)[0])     # drops the batch dimension
    return resid_mid + block.mlp(block.ln2(resid_mid))


def renamed(forward):
    """A TransformerBlock class computing `forward` with `attention_heads` for `attn`."""
    return type(forward.__name__, (OwnNames,), {"forward": lambda self, x: forward(self, self.attention_heads, x)})


def as_given(forward):
    """The same, its attention named `attn` as the exercise does: what the learner renames it into."""
    return type(forward.__name__, (GivenNames,), {"forward": lambda self, x: forward(self, self.attn, x)})


def names_message(cls) -> str:
    """What the check says of `cls`'s names today: the loader's own words."""
    with pytest.raises(WeightLoadError) as failure:
        load_strict(cls(Config()), part("blocks.0"), "TransformerBlock")
    return str(failure.value)


def failure_of(check, cls) -> CheckFailed:
    with pytest.raises(CheckFailed) as failure:
        check(cls)
    return failure.value


def test_renamed_but_right_fails_and_says_the_computation_is_right():
    nb05.check_transformer_block(as_given(textbook))           # once renamed, it passes
    message = str(failure_of(nb05.check_transformer_block, renamed(textbook)))
    names, added = message.rsplit("\n", 1)
    assert names == names_message(renamed(textbook))
    assert "attention_heads.W_Q" in names and "attn.W_Q" in names
    assert added.startswith("Loaded under your own names instead, your TransformerBlock computes the right thing")


@pytest.mark.parametrize("forward", [without_attention_residual, attention_given_tokens_shape],
                         ids=lambda f: f.__name__)
def test_renamed_and_wrong_fails_with_the_diagnosis_the_fix_would_get(forward):
    """What is wrong under the learner's names is word for word what the renamed code is told."""
    diagnosis = str(failure_of(nb05.check_transformer_block, as_given(forward)))
    cls = renamed(forward)
    message = str(failure_of(nb05.check_transformer_block, cls))
    assert message == (f"{names_message(cls)}\nLoaded under your own names instead, your TransformerBlock "
                       f"is also wrong, so renaming alone will not pass this check:\n{diagnosis}")


def test_a_crash_under_the_learners_names_keeps_the_learners_line():
    failure = failure_of(nb05.check_transformer_block, renamed(attention_given_tokens_shape))
    assert isinstance(failure.__cause__, RuntimeError), failure.__cause__


def test_submodules_that_could_be_either_keep_todays_message():
    class EitherNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.norm_a, self.attn = LayerNorm(cfg), Attention(cfg)
            self.norm_b, self.mlp = LayerNorm(cfg), MLP(cfg)

        def forward(self, x):
            mid = x + self.attn(self.norm_a(x))
            return mid + self.mlp(self.norm_b(mid))

    assert str(failure_of(nb05.check_transformer_block, EitherNorm)) == names_message(EitherNorm)


def test_a_library_shortcut_outranks_the_names():
    exercise, case = nb05.block, nb05.block.case()
    outputs, failure = exercise.run(renamed(textbook), case, exercise.inputs(case))
    shortcut = LearnerCode(before="layer = nn.TransformerEncoderLayer(768, 12)")
    assert decide(exercise, case, outputs, str(failure), shortcut) == Verdict(
        False, forbidden_message("TransformerBlock", "nn.TransformerEncoderLayer", shortcut))


def test_outside_a_check_the_names_fail_as_before():
    """Renamed submodules are loaded only while a check lets them: nothing outlives that check."""
    cls = renamed(textbook)
    failure_of(nb05.check_transformer_block, cls)
    with pytest.raises(CheckFailed) as failure:
        load_learner("TransformerBlock", cls(Config()), part("blocks.0"))
    assert str(failure.value) == names_message(cls)


@pytest.mark.parametrize("forward", [textbook, without_attention_residual, attention_given_tokens_shape],
                         ids=lambda f: f.__name__)
def test_the_recorded_verdict_is_the_kernels(forward, tmp_path):
    """Graded from a record (outputs and message), the verdict is the check cell's, word for word."""
    cls = renamed(forward)
    exercise, case = nb05.block, nb05.block.case()
    outputs, failure = exercise.run(cls, case, exercise.inputs(case))
    write_record(tmp_path, {"check": "block_test/0", "exercise": list(exercise.key),
                            "message": str(failure or "")}, outputs)
    record = load_records(tmp_path)["block_test/0"]
    verdict = decide(exercise, case, record["outputs"], record["message"], LearnerCode())
    assert not verdict.passed
    assert verdict.message == str(failure_of(nb05.check_transformer_block, cls))


# --- End to end: 06's DemoTransformer, blocks renamed as a list and inside each block ---------

class SelfAttnBlock(TransformerBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.self_attn = self.attn
        del self.attn

    def forward(self, resid_pre):
        resid_mid = resid_pre + self.self_attn(self.ln1(resid_pre))
        return resid_mid + self.mlp(self.ln2(resid_mid))


def demo_transformer(block=TransformerBlock, blocks="blocks", skip_last_block=False):
    """A DemoTransformer class holding `block`s under the attribute `blocks`."""
    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.embed, self.pos_embed = Embed(cfg), PosEmbed(cfg)
        setattr(self, blocks, nn.ModuleList([block(cfg) for _ in range(cfg.n_layers)]))
        self.ln_final, self.unembed = LayerNorm(cfg), Unembed(cfg)

    def forward(self, tokens):
        resid = self.embed(tokens) + self.pos_embed(tokens)
        for layer in getattr(self, blocks)[:-1] if skip_last_block else getattr(self, blocks):
            resid = layer(resid)
        return self.unembed(self.ln_final(resid))

    return type(f"{blocks}_{block.__name__}", (nn.Module,), {"__init__": __init__, "forward": forward})


def test_a_submodule_renamed_in_every_block_fails_on_the_names_only():
    message = str(failure_of(nb06.check_demo_transformer, demo_transformer(SelfAttnBlock)))
    assert "  missing: blocks.11.attn.W_Q" in message and "  unexpected: blocks.11.self_attn.W_Q" in message
    assert message.splitlines()[-1].startswith(
        "Loaded under your own names instead, your DemoTransformer computes the right thing"), message


def test_a_renamed_list_of_blocks_is_watched_under_the_exercises_name():
    """The diagnosis reads hooks on `model.blocks`: under the learner's names, on their `layers`."""
    diagnosis = str(failure_of(nb06.check_demo_transformer, demo_transformer(skip_last_block=True)))
    message = str(failure_of(nb06.check_demo_transformer, demo_transformer(blocks="layers", skip_last_block=True)))
    assert "  unexpected: layers.0.attn.W_Q" in message
    assert message.endswith("\nLoaded under your own names instead, your DemoTransformer is also wrong, so "
                            "renaming alone will not pass this check:\n" + diagnosis), message
