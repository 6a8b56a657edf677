"""Code in one canonical form before it is fingerprinted (graders.harness.copies), so that what a
disguise changes without changing the program no longer changes the fingerprint.

copydetect already makes every name one letter and drops comments and whitespace, but three
disguises still broke its k-grams (a k-gram is about one statement, so short statements are matched
only together with their neighbours): independent statements put in another order, the type
annotations of the stub's signature dropped, and the same code laid out otherwise (a tuple's
parentheses, quotes). Here the annotations go, every block's statements are put in one order that
their dependencies allow (the same whatever order the learner chose), and the code is re-laid out
by ast.unparse. Both sides of a comparison (answers, sources, what the notebook dictates) go through
it, so it moves honest answers and copies alike; code that does not parse is left as it is.
"""
from __future__ import annotations

import ast
import heapq
import re

# Statements that may move past each other when their names allow it: anything else (a loop, a
# return, a branch) stays where it is and nothing moves across it.
MOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# Names copydetect would keep as written: each becomes an ordinary one, which it makes one letter.
PSEUDO_BUILTINS = {"self": "this", "cls": "klass"}


def canonical(text: str) -> str:
    """`text` without annotations, `self` an ordinary name, each block in its canonical statement
    order, re-laid out."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    for node in ast.walk(tree):
        _drop_annotations(node)
        _ordinary_name(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, field, in_canonical_order(block))
    return ast.unparse(tree)


def _drop_annotations(node) -> None:
    """A stub's annotations are the notebook's; dropping them is a disguise that changes nothing."""
    if isinstance(node, ast.arg):
        node.annotation = None
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.returns = None


def _ordinary_name(node) -> None:
    """`self` renamed to another name is the same code: neither is kept as written."""
    if isinstance(node, ast.Name):
        node.id = PSEUDO_BUILTINS.get(node.id, node.id)
    elif isinstance(node, ast.arg):
        node.arg = PSEUDO_BUILTINS.get(node.arg, node.arg)


def _path(node) -> str | None:
    """`a`, `a.b.c` for a name or a chain of attributes on one; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _path(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _stored(target) -> set[str]:
    """What an assignment target writes: a name, an attribute chain, or all of what is indexed."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*map(_stored, target.elts))
    if isinstance(target, ast.Starred):
        return _stored(target.value)
    if isinstance(target, ast.Subscript):
        return _stored(target.value)
    path = _path(target)
    return {path} if path else {"*"}


def reads_writes(statement) -> tuple[set[str], set[str]]:
    """(paths `statement` reads, each chain whole: `self.a.w`, not `self`; paths it writes); a
    statement that is only a call writes its receiver and the names it passes ("*", everything,
    when it is not a method of a name)."""
    inner = {id(node.value) for node in ast.walk(statement) if isinstance(node, ast.Attribute)}
    reads = {path for node in ast.walk(statement) if isinstance(node, (ast.Name, ast.Attribute))
             and isinstance(node.ctx, ast.Load) and id(node) not in inner and (path := _path(node))}
    if isinstance(statement, ast.Expr):
        call = statement.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and (receiver := _path(call.func.value))):
            return reads, {"*"}
        return reads, {receiver} | {path for arg in call.args if (path := _path(arg))}
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    return reads, set().union(*map(_stored, targets))


def _overlap(ones: set[str], others: set[str]) -> bool:
    """Whether a path of one set is a path of the other or lies inside it (`a` and `a.b`)."""
    return "*" in ones | others or any(one == other or other.startswith(f"{one}.") or one.startswith(f"{other}.")
                                       for one in ones for other in others)


def _depends(earlier, later) -> bool:
    """Whether `later` must stay after `earlier`: one writes what the other reads or writes."""
    if not (isinstance(earlier, MOVABLE) and isinstance(later, MOVABLE)):
        return True
    (reads1, writes1), (reads2, writes2) = reads_writes(earlier), reads_writes(later)
    return _overlap(writes1, reads2 | writes2) or _overlap(writes2, reads1)


def _key(statement) -> str:
    """A statement's text with every identifier one letter: renaming does not change the order."""
    return IDENTIFIER.sub("V", ast.unparse(statement))


def in_canonical_order(block: list) -> list:
    """`block` in the first order by `_key` that keeps every statement after those it depends on:
    one order for every reordering of independent statements."""
    after = {j: {i for i in range(j) if _depends(block[i], block[j])} for j in range(len(block))}
    ready = [(_key(block[j]), j) for j in after if not after[j]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, placed = heapq.heappop(ready)
        order.append(placed)
        for j in after:
            if placed in after[j]:
                after[j].discard(placed)
                if not after[j]:
                    heapq.heappush(ready, (_key(block[j]), j))
    return [block[j] for j in order]
