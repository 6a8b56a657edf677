"""A learner's submodule named otherwise than the exercise's (`attention_heads` for `attn`) fails
the check with the names, and the message also says whether the computation under the learner's
own names is right (issue 28, section 3): fixing the name must not reveal a second failure."""
import pytest

from graders.reference.weights import renamed_submodule, submodule_renaming

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
