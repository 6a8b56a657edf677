"""Code is fingerprinted in one canonical form: what a disguise changes without changing the
program (the order of independent statements, annotations, layout) does not change it, and what
does change the program (the order of dependent statements) does."""
from graders.harness.canonical import canonical

SWAPPED = ("def f(a, b):\n    x = a + 1\n    y = b * 2\n    z = [x, y]\n    return z\n",
           "def f(a, b):\n    y = b * 2\n    x = a + 1\n    z = [x, y]\n    return z\n")


def test_independent_statements_in_any_order_are_one_canonical_text():
    assert canonical(SWAPPED[0]) == canonical(SWAPPED[1])


def test_renaming_does_not_change_the_canonical_order():
    """The order is chosen with every name one letter, as copydetect compares."""
    renamed = SWAPPED[1].replace("x", "first").replace("y", "second")
    assert canonical(renamed).replace("first", "x").replace("second", "y") == canonical(SWAPPED[0])


def test_dependent_statements_keep_their_order():
    one, other = "x = a + 1\ny = x * 2\n", "y = x * 2\nx = a + 1\n"
    assert canonical(one) != canonical(other)
    assert canonical("items.append(1)\nitems.append(22)\n") != canonical("items.append(22)\nitems.append(1)\n")


def test_nothing_moves_across_a_loop_or_a_return():
    text = "def f(a):\n    y = 2\n    for i in a:\n        y += i\n    x = 1\n    return x + y\n"
    assert canonical(text).index("y = 2") < canonical(text).index("for ") < canonical(text).index("x = 1")


def test_the_attributes_of_one_object_move_past_each_other_but_not_past_what_reads_them():
    one = "self.a = nn.Linear(d, d)\nself.b = nn.Linear(d, 1)\nself.c = self.a.weight\n"
    other = "self.b = nn.Linear(d, 1)\nself.a = nn.Linear(d, d)\nself.c = self.a.weight\n"
    assert canonical(one) == canonical(other) and canonical(one).endswith("this.c = this.a.weight")


def test_self_renamed_is_the_same_code():
    """copydetect keeps `self` as written and makes every other name one letter."""
    method = "def merge(self, safe=False):\n    self.w += self.delta()\n"
    assert canonical(method) == canonical(method.replace("self", "layer")).replace("layer", "this")


def test_annotations_and_layout_are_gone_and_code_that_does_not_parse_is_kept():
    annotated = "def f(x: Float[Tensor, 'b d'], n: int = 2) -> Tensor:\n    return (x,  n)  # both\n"
    assert canonical(annotated) == canonical("def f(x, n=2):\n  return x, n\n") == "def f(x, n=2):\n    return (x, n)"
    assert canonical("def broken(:\n") == "def broken(:\n"
