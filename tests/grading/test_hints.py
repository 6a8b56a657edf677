"""A hint points the way; it never holds a line of the answer.

A hint is a folded `<details>` block of a markdown cell. Its code (backticked spans and fenced
blocks) may name a function, an argument or a shape, or show an idiom on a toy example; it may not
contain a line of the solution (the code between `### BEGIN SOLUTION` and `### END SOLUTION` of an
answer cell), nor the expression a line assigns, returns, tests or loops over. Renaming the
answer's own variables does not hide a line (they match any name), nor does leaving out `self.`.
Lines under 12 characters of code, and lines made only of the learner's names, keywords and
operators (`return x`, `logits / temperature`), say nothing and are left out; so is the code given
to the learner outside the solution markers.
"""
import ast
import keyword
import re

import nbformat
import pytest

from graders.layout import SOLUTIONS, notebook_names

HINT = re.compile(r"<details[^>]*>\s*(?:<summary>(?P<title>.*?)</summary>)?(?P<body>.*?)</details>", re.S)
FENCED = re.compile(r"```[^\n]*\n(.*?)```", re.S)
SPAN = re.compile(r"`([^`]+)`")
TOKEN = re.compile(r"""(?P<comment>\#[^\n]*)
    |(?P<string>[rRbBfFuU]{0,2}(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*'))
    |(?P<name>[^\W\d]\w*)|(?P<number>\d[\w.]*)|(?P<op>\S)""", re.X)
ANY_NAME = "\x00"        # an answer's own variable: it matches any name of the hint
SEPARATOR = "\x1f"
SHORTEST = 12            # characters of code, without spaces


def tokens(code: str, learner_names: frozenset = frozenset()) -> list[str]:
    """Python-like tokens of `code`: comments dropped, strings with one kind of quote and single
    spaces, `self.` dropped, the names in `learner_names` (not attributes) replaced by ANY_NAME."""
    found = []
    for match in TOKEN.finditer(code):
        kind, text = match.lastgroup, match.group()
        if kind == "string":
            body = text.lstrip("rRbBfFuU")
            quotes = 3 if body[:3] in ('"""', "'''") else 1
            text = '"' + " ".join(body[quotes:-quotes].split()) + '"'
        if kind != "comment":
            found.append((kind, text))
    kept = [(kind, text) for i, (kind, text) in enumerate(found)
            if not (text == "self" and found[i + 1:i + 2] == [("op", ".")])
            and not (text == "." and found[i - 1:i] == [("name", "self")])]
    return [ANY_NAME if kind == "name" and text in learner_names and kept[i - 1:i] != [("op", ".")] else text
            for i, (kind, text) in enumerate(kept)]


def says_something(code: str, pattern: list[str]) -> bool:
    """A line worth keeping out of the hints: 12 characters of code or more, and at least one token
    of its own (a name that is neither the learner's nor a keyword, a number, a string)."""
    meaningful = [t for t in pattern if t != ANY_NAME and (t[0].isalnum() or t[0] in "_\"")]
    return len("".join(code.split())) >= SHORTEST and any(not keyword.iskeyword(t) for t in meaningful)


def bound_names(tree: ast.AST) -> frozenset:
    """The names an answer cell binds itself (arguments, assignments, loop and comprehension
    variables): a hint may spell them differently."""
    return frozenset({node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
                     | {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
                        and isinstance(node.ctx, ast.Store)})


def statement_pieces(node: ast.stmt, source: str) -> list[str]:
    """The parts of one statement a hint must not hold, besides its physical lines: a simple
    statement whole (it may span several lines), the expression it assigns or returns, and a
    compound statement's test, iterable or context; with each element of a tuple, each value of a
    dict and what a comprehension makes of each item."""
    if isinstance(node, (ast.If, ast.While)):
        parts = [node.test]
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        parts = [node.iter]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        parts = [item.context_expr for item in node.items]
    elif hasattr(node, "body"):        # def, class, try: their statements are read one by one
        parts = []
    else:
        parts = [node] + [value for value in [getattr(node, "value", None)] if isinstance(value, ast.expr)]
    for value in list(parts):
        parts += value.elts if isinstance(value, ast.Tuple) else value.values if isinstance(value, ast.Dict) else \
            [value.elt] if isinstance(value, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) else []
    return [ast.get_source_segment(source, part) for part in parts]


def solved_lines(source: str) -> list[int]:
    """The numbers (from 1) of the lines between `### BEGIN SOLUTION` and `### END SOLUTION`."""
    inside, solved = False, []
    for number, line in enumerate(source.splitlines(), 1):
        if line.strip() in ("### BEGIN SOLUTION", "### END SOLUTION"):
            inside = line.strip() == "### BEGIN SOLUTION"
        elif inside:
            solved.append(number)
    return solved


def one_line(code: str) -> str:
    """The code on one line, without its comments."""
    comments = [match.span() for match in TOKEN.finditer(code) if match.lastgroup == "comment"]
    for start, end in reversed(comments):
        code = code[:start] + code[end:]
    return " ".join(code.split())


def answer_lines(notebook) -> dict[str, list[str]]:
    """{a line of the answer as written: its pattern} over every solution of the notebook: its
    physical lines, statements, and the expressions they assign, return, test or loop over."""
    found = {}
    for cell in notebook.cells:
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        solved, lines, tree = solved_lines(cell.source), cell.source.splitlines(), ast.parse(cell.source)
        names = bound_names(tree)
        pieces = [lines[number - 1] for number in solved] + [
            piece for node in ast.walk(tree) if isinstance(node, ast.stmt) and node.lineno in solved
            for piece in statement_pieces(node, cell.source)]
        for code in map(one_line, pieces):
            if says_something(code, pattern := tokens(code, names)):
                found[code] = pattern
    return found


def hints(notebook) -> list[tuple[str, list[list[str]]]]:
    """(where: its title and cell, the tokens of each code span and fenced block) of every hint of
    the notebook."""
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            for hint in HINT.finditer(cell.source):
                body, title = hint["body"], (hint["title"] or "untitled hint").strip()
                code = FENCED.findall(body) + SPAN.findall(FENCED.sub("", body))
                found.append((f"{title!r} (cell {index})", [tokens(span) for span in code]))
    return found


def holds(span: list[str], pattern: list[str]) -> bool:
    """Whether the span's tokens contain the pattern's, ANY_NAME matching any one name."""
    regex = SEPARATOR.join(r"[^\W\d]\w*" if t == ANY_NAME else re.escape(t) for t in pattern)
    return re.search(f"(?:^|{SEPARATOR}){regex}(?:{SEPARATOR}|$)", SEPARATOR.join(span)) is not None


def giveaways(notebook) -> list[str]:
    """What each hint of the notebook gives away: one sentence per (hint, answer line)."""
    lines = answer_lines(notebook).items()
    return sorted({f"{where} holds the answer line `{code}`" for where, spans in hints(notebook)
                   for code, pattern in lines if any(holds(span, pattern) for span in spans)})


@pytest.mark.parametrize("name", notebook_names())
def test_no_hint_holds_a_line_of_the_answer(name):
    """A hint points the way; it never holds a line of the answer (what counts as one: above)."""
    found = giveaways(nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4))
    assert not found, f"{name}: " + "; ".join(found)


def test_a_hint_is_caught_however_it_names_the_answers_variables():
    """Other names or spacing do not hide an answer line; naming the argument to look up gives none away."""
    answer = nbformat.v4.new_code_cell(
        "def scaled(values, factor):\n    ### BEGIN SOLUTION\n    total = values.sum(dim=-1, keepdim=True)\n"
        "    return values / total * factor\n    ### END SOLUTION\n")
    answer.metadata["nbgrader"] = {"grade_id": "scaled_answer", "solution": True}

    def notebook(hint: str):
        text = f"<details><summary>Hint: the sum</summary>\n\n{hint}\n</details>"
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text), answer])

    assert giveaways(notebook("`x.sum(dim=-1, keepdim=True)` keeps the last dimension.")) == [
        "'Hint: the sum' (cell 0) holds the answer line `values.sum(dim=-1, keepdim=True)`"]
    assert giveaways(notebook("```python\nt = v.sum(dim = -1, keepdim = True)\n```"))
    assert not giveaways(notebook("Sum over the last dimension and keep it (`keepdim`)."))
