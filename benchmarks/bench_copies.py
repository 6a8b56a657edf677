"""Copy detection's two errors, printed (not a test): `python benchmarks/bench_copies.py`.

False flags: every honest answer of the corpus (tests/copies_corpus: answers written from the
released notebooks alone, and the catalogs' correct variants) is put in its answer cell and checked
as a submission is; a cell with a copy note is a false flag. The share of its own code each honest
answer reaches, per exercise, is what graders.harness.copy_thresholds's bars must stay above.

Catches: every answer cell of every solution, and the library functions a notebook refuses
(LIBRARY_PASTES), disguised by `disguise` (every name a learner may choose changed, docstrings and
comments gone, independent neighbouring statements swapped, indented by two spaces with blank lines
between statements), put in their cell and checked; each function compared (enough code of its own,
in an exercise that can flag) counts, and is caught when it is flagged.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import os
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

# (package, file, function or Class.method, notebook, answer cell it is pasted into)
LIBRARY_PASTES = (
    ("torch", "optim/adam.py", "_single_tensor_adam", "12_training_step", "adamw_answer"),
    ("torch", "nn/utils/clip_grad.py", "_get_total_norm", "12_training_step", "clip_answer"),
    ("torch", "nn/utils/clip_grad.py", "_clip_grads_with_norm_", "12_training_step", "clip_answer"),
    ("tiktoken", "_educational.py", "bpe_encode", "11_tokenizer", "encode_answer"),
    ("tiktoken", "_educational.py", "bpe_train", "11_tokenizer", "train_answer"),
    ("transformers", "models/clvp/tokenization_clvp.py", "bytes_to_unicode", "11_tokenizer", "table_answer"),
    ("transformers", "models/clvp/tokenization_clvp.py", "ClvpTokenizer.bpe", "11_tokenizer", "encode_answer"),
    ("gpt3_tokenizer", "_functions.py", "_bpe", "11_tokenizer", "encode_answer"),
    ("peft", "tuners/lora/layer.py", "Linear.merge", "13_post_training", "lora_answer"),
    ("peft", "tuners/lora/layer.py", "Linear.forward", "13_post_training", "lora_answer"),
    ("trl", "trainer/dpo_trainer.py", "DPOTrainer._compute_loss", "13_post_training", "dpo_loss_answer"),
)


class _Renamer(ast.NodeTransformer):
    """Every argument, local and helper name to a new one; names from outside (torch, the
    notebook's classes) and the names the grader calls (`keep`) stay."""

    def __init__(self, chosen: set[str]):
        self.table = {name: f"n{index}" for index, name in enumerate(sorted(chosen))}

    def _new(self, name: str) -> str:
        return self.table.get(name, name)

    def visit_Name(self, node):
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._new(node.arg)
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):
        node.name = self._new(node.name)
        node.returns = None
        return self.generic_visit(node)


def _chosen(tree, keep: set[str]) -> set[str]:
    """The names the code chooses itself: its arguments, the names it assigns, nested functions."""
    names = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names |= {f.name for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names - keep - {"self", "cls"} - set(dir(builtins))


def _reads_writes(statement) -> tuple[set[str], set[str]]:
    reads = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    writes = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    writes |= {ast.unparse(t) for t in ast.walk(statement)
               if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)}
    return reads, writes


def _independent(first, second) -> bool:
    """Two assignments neither of which reads or writes what the other writes, and that call
    nothing that could depend on their order (no calls on what either assigns)."""
    if not all(isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)) for s in (first, second)):
        return False
    (reads1, writes1), (reads2, writes2) = _reads_writes(first), _reads_writes(second)
    base = {w.split(".")[0] for w in writes1 | writes2}
    return not (writes1 & (reads2 | writes2) or writes2 & reads1 or base & (reads1 | reads2) - {"self"})


def _swap_independent(body: list) -> list:
    """`body` with each independent neighbouring pair swapped (left to right, each statement once)."""
    out, index = [], 0
    while index < len(body):
        if index + 1 < len(body) and _independent(body[index], body[index + 1]):
            out += [body[index + 1], body[index]]
            index += 2
        else:
            out.append(body[index])
            index += 1
    return out


def disguise(text: str, keep: set[str] = frozenset()) -> str:
    """`text` as a learner hiding a copy might hand it in: names changed (but `keep`: those the
    grader calls), docstrings and comments gone, independent statements swapped, re-laid out."""
    tree = ast.parse(textwrap.dedent(text))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str) and len(body) > 1:
                body = body[1:]
            node.body = _swap_independent(body)
    tree = _Renamer(_chosen(tree, set(keep))).visit(tree)
    lines = []
    for line in ast.unparse(ast.fix_missing_locations(tree)).splitlines():
        stripped = line.lstrip(" ")
        lines += ["  " * ((len(line) - len(stripped)) // 4) + stripped, ""]
    return "\n".join(lines)


def _graded_names(text: str) -> set[str]:
    """The names a cell defines at its top level and their methods: what the grader calls."""
    tree = ast.parse(text)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
            names |= {m.name for m in getattr(node, "body", []) if isinstance(m, ast.FunctionDef)}
    return names


def _library_function(package: str, file: str, qualname: str) -> str:
    text = (Path(importlib.util.find_spec(package).origin).parent / file).read_text()
    nodes = ast.parse(text).body
    for part in qualname.split("."):
        node = next(n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        nodes = node.body
    return textwrap.dedent(ast.get_source_segment(text, node, padded=True))


def _in_cell(notebook: str, grade_id: str, text: str):
    from graders.harness.cells import nbgrader_meta, released_notebook

    submission = released_notebook(notebook)
    for cell in submission.cells:
        if nbgrader_meta(cell).get("grade_id") == grade_id:
            cell.source = text
    return submission


def honest_results():
    """[(honest answer, its cell's matches, its cell's copy notes)] over the corpus."""
    from copies_corpus import corpus

    from graders.harness.cells import released_notebook
    from graders.harness.copies import best_matches, cell_notes, copy_flags

    results = []
    for honest in corpus():
        submission, released = _in_cell(honest.notebook, honest.grade_id, honest.text), \
            released_notebook(honest.notebook)
        matches = [m for m in best_matches(submission, released) if m.grade_id == honest.grade_id]
        results.append((honest, matches, cell_notes(copy_flags(submission, released)).get(honest.grade_id, [])))
    return results


def disguised_copies():
    """[(notebook, answer cell, what was disguised, the disguised cell)]: the solutions' answer
    cells and LIBRARY_PASTES."""
    from graders.exercises import declared_notebooks
    from graders.harness.cells import source_notebook
    from graders.harness.copies import answers
    from graders.layout import EXERCISES

    found = []
    for name in sorted(declared_notebooks()):
        if (EXERCISES / f"{name}.ipynb").is_file():
            found += [(name, grade_id, f"solutions/{name}.ipynb: {grade_id}", disguise(text, _graded_names(text)))
                      for grade_id, text in answers(source_notebook(name)).items()]
    found += [(name, grade_id, f"{package}/{file}: {qualname}", disguise(_library_function(package, file, qualname)))
              for package, file, qualname, name, grade_id in LIBRARY_PASTES]
    return found


def catch_results():
    """[(what was disguised, function, share, caught)] of every disguised function compared."""
    from graders.harness.cells import released_notebook
    from graders.harness.copies import best_matches
    from graders.harness.copy_thresholds import threshold

    results = []
    for name, grade_id, what, text in disguised_copies():
        bar = threshold(name, grade_id)
        if bar is None:
            continue
        for match in best_matches(_in_cell(name, grade_id, text), released_notebook(name)):
            if match.grade_id == grade_id:
                results.append((what, match.function, match.share, match.share >= bar))
    return results


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from graders.harness.copies import MIN_STATEMENTS
    from graders.harness.copy_thresholds import DEFAULT, THRESHOLDS, threshold

    print(f"conditions: copydetect k=25, window 1; functions of {MIN_STATEMENTS}+ statements of their own; "
          f"default bar {DEFAULT:.0%}, {len(THRESHOLDS)} exercises with their own; load average "
          f"{os.getloadavg()[0]:.1f}")
    honest = honest_results()
    reached: dict[str, float] = defaultdict(float)
    for answer, matches, _ in honest:
        for match in matches:
            key = f"{answer.notebook}/{answer.grade_id}"
            reached[key] = max(reached[key], match.share)
    print("honest answers: the most of an answer function's own code found in one source, per exercise")
    for key, share in sorted(reached.items()):
        bar = threshold(*key.split("/"))
        print(f"  {key:45} {share:5.0%}   bar {'cannot flag' if bar is None else f'{bar:.0%}'}")
    flagged = [(answer, notes) for answer, _, notes in honest if notes]
    for answer, notes in flagged:
        print(f"  FALSE FLAG {answer.origin}: {notes[0]}")
    print(f"false flags: {len(flagged)} of {len(honest)} honest answer cells "
          f"({100 * len(flagged) / len(honest):.1f} per 100; the goal is at most 1)")
    caught = catch_results()
    for what, function, share, hit in caught:
        if not hit:
            print(f"  MISSED {what} ({function}): {share:.0%}")
    hits = sum(hit for *_, hit in caught)
    print(f"disguised copies flagged: {hits} of {len(caught)} functions compared "
          f"({100 * hits / len(caught):.1f}%; the goal is at least 95%)")


if __name__ == "__main__":
    main()
