"""Answer cells that are near-copies of the course's code, of a library's source of that exercise or
of another student's answer are flagged for the instructor, never zeroed; independent correct
answers in other styles are not flagged."""
import ast
import importlib.util
import inspect
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from graders.course.example_class import submission
from graders.harness import grading
from graders.harness.cells import nbgrader_meta, released_notebook, source_notebook
from graders.harness.classroom import review_class
from graders.harness.copies import answers, cell_notes, class_notes, copy_flags, is_copy_note
from graders.harness.results import ClassResults
from graders.reference import components

TS = "12_training_step"


def _renamed(text: str) -> str:
    """`text`'s first function as a learner might paste it: every local name and the function's
    own changed, comments and docstring dropped, reformatted (ast.unparse)."""
    tree = ast.parse(textwrap.dedent(text))
    function = tree.body[0]
    local = {a.arg for a in ast.walk(function) if isinstance(a, ast.arg)} | \
            {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    table = {name: f"my_{index}" for index, name in enumerate(sorted(local))}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg in table:
            node.arg = table[node.arg]
        elif isinstance(node, ast.Name) and node.id in table:
            node.id = table[node.id]
    if ast.get_docstring(function):
        function.body = function.body[1:]
    function.name = "helper"
    return ast.unparse(tree)


def _library_function(package: str, file: str, name: str) -> str:
    text = (Path(importlib.util.find_spec(package).origin).parent / file).read_text()
    return next(ast.get_source_segment(text, node) for node in ast.parse(text).body
                if isinstance(node, ast.FunctionDef) and node.name == name)


def _pasted_attention() -> str:
    """The course's Attention as a learner might paste it: names changed, comments and
    formatting different."""
    source = inspect.getsource(components.Attention)
    source = re.sub(r"^@course_answer\(.*\)\n", "", source)   # the mark is not in their notebook
    for old, new in (("shape_in", "in_shape"), ("shape_out", "out_shape"), ("scores", "att"),
                     ("pattern", "probs"), ("future", "upper"), ("q_len", "nq"), ("k_len", "nk")):
        source = source.replace(old, new)
    source = re.sub(r"\bx\b", "resid", source)
    source = re.sub(r"\bz\b", "mixed", source)
    source = re.sub(r" +#.*", "", source)                      # the course's comments go
    return "# my attention\n" + source.replace("(self, cfg: Config)", "(self, cfg)")


# An AdamW written independently, in another style than the solution: one formula per line, the
# step count an int, the update through .data (tests/catalog/test_catalog_12_adamw.py grades it correct).
EXPLICIT_ADAMW = '''
class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def step(self, closure=None):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            for p in (p for p in group["params"] if p.grad is not None):
                s = self.state[p]
                s.setdefault("exp_avg", torch.zeros_like(p.data))
                s.setdefault("exp_avg_sq", torch.zeros_like(p.data))
                s["step"] = s.get("step", 0) + 1
                s["exp_avg"] = b1 * s["exp_avg"] + (1 - b1) * p.grad.data
                s["exp_avg_sq"] = b2 * s["exp_avg_sq"] + (1 - b2) * p.grad.data ** 2
                m_hat = s["exp_avg"] / (1 - b1 ** s["step"])
                v_hat = s["exp_avg_sq"] / (1 - b2 ** s["step"])
                p.data = p.data - lr * group["weight_decay"] * p.data - lr * m_hat / (v_hat.sqrt() + group["eps"])
'''

# GPT-2's encoding done another way than encoder.py, tiktoken and the solution: the lowest-ranked
# pair found by position and merged in place (tests/catalog/test_catalog_11_encoding.py grades it correct).
BPE_BY_INDEX = '''
def bpe(word, ranks):
    symbols = list(word)
    while len(symbols) > 1:
        ranked = [(ranks.get((symbols[i], symbols[i + 1]), 10 ** 9), i) for i in range(len(symbols) - 1)]
        rank, i = min(ranked)
        if rank == 10 ** 9:
            break
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols
'''


def _with_answer(notebook, grade_id: str, source: str):
    for cell in notebook.cells:
        if nbgrader_meta(cell).get("grade_id") == grade_id:
            cell.source = source
    return notebook


def _pasted_adamw(helper: str) -> str:
    """12's AdamW whose step hands its tensors to a pasted library function."""
    return (f"{helper}\n\n\nclass AdamW(torch.optim.Optimizer):\n"
            "    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):\n"
            "        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))\n")


def test_a_pasted_torch_adamw_with_renamed_variables_is_flagged_naming_torchs_file():
    """torch 2.13's AdamW (optim/adamw.py) is Adam with decoupled weight decay: its update is
    optim/adam.py's _single_tensor_adam (adamw.py's own `adamw` only calls it)."""
    pasted = _renamed(_library_function("torch", "optim/adam.py", "_single_tensor_adam"))
    notebook = _with_answer(released_notebook(TS), "adamw_answer", _pasted_adamw(pasted))
    flags = copy_flags(notebook, released_notebook(TS))
    assert any(f.startswith("answer cell adamw_answer: helper matches torch's Adam, whose update "
                            "torch.optim.AdamW runs (torch/optim/adam.py: _single_tensor_adam)") for f in flags), flags
    assert list(cell_notes(flags)) == ["adamw_answer"] and all(is_copy_note(f) for f in flags)


def test_pasted_torch_clipping_is_flagged():
    pasted = _renamed(_library_function("torch", "nn/utils/clip_grad.py", "_get_total_norm"))
    notebook = _with_answer(released_notebook(TS), "clip_answer", pasted)
    flags = copy_flags(notebook, released_notebook(TS))
    assert any("(torch/nn/utils/clip_grad.py: _get_total_norm)" in f for f in flags), flags


@pytest.mark.parametrize("package, file, function", [
    ("tiktoken", "_educational.py", "bpe_encode"),
    ("transformers", "models/clvp/tokenization_clvp.py", "bytes_to_unicode"),   # GPT-2's encoder.py's
    ("gpt3_tokenizer", "_functions.py", "_bpe"),                                # a port of encoder.py's bpe
])
def test_a_copied_tokenizer_is_flagged(package, file, function):
    pasted = _renamed(_library_function(package, file, function))
    grade_id = "table_answer" if function == "bytes_to_unicode" else "encode_answer"
    notebook = _with_answer(released_notebook("11_tokenizer"), grade_id, pasted)
    flags = copy_flags(notebook, released_notebook("11_tokenizer"))
    assert any(f.startswith(f"answer cell {grade_id}: helper matches") and f"({package}/{file}: {function})" in f
               for f in flags), flags


def test_a_pasted_peft_lora_merge_is_flagged():
    text = (Path(importlib.util.find_spec("peft").origin).parent / "tuners/lora/layer.py").read_text()
    linear = next(node for node in ast.parse(text).body if isinstance(node, ast.ClassDef) and node.name == "Linear")
    merge = next(node for node in linear.body if isinstance(node, ast.FunctionDef) and node.name == "merge")
    pasted = _renamed(ast.get_source_segment(text, merge, padded=True))
    notebook = _with_answer(released_notebook("13_post_training"), "lora_answer", pasted)
    flags = copy_flags(notebook, released_notebook("13_post_training"))
    assert any(f.startswith("answer cell lora_answer: helper matches peft's LoRA layers") for f in flags), flags


# 13's solution of chat_tokens as a learner hiding the paste might hand it in: its independent
# statements in another order, every name changed, the stub's annotations gone, re-laid out.
REORDERED_CHAT_TOKENS = '''
def chat_tokens(msgs, enc):
    ids, mask = [], []
    close = enc.encode_single_token(IM_END)
    open_ = enc.encode_single_token(IM_START)
    for m in msgs:
        is_bot = m["role"] == "assistant"
        text = enc.encode_ordinary(m["content"])
        head = [open_] + enc.encode_ordinary(m["role"] + "\\n")
        mask += [False] * len(head) + [is_bot] * (len(text) + 1) + [False]
        ids += head + text + [close] + enc.encode_ordinary("\\n")
    ids = torch.tensor(ids)
    return ids, torch.where(torch.tensor(mask), ids, -100)
'''


def test_a_paste_whose_independent_statements_are_reordered_is_flagged():
    """Each of chat_tokens's statements is shorter than a fingerprint's stretch, so it is matched
    only with its neighbours: the order is made canonical on both sides before comparing."""
    post = "13_post_training"
    notebook = _with_answer(released_notebook(post), "chat_tokens_answer", REORDERED_CHAT_TOKENS)
    flags = copy_flags(notebook, released_notebook(post))
    assert any(f.startswith("answer cell chat_tokens_answer: chat_tokens matches the course's solution "
                            f"(solutions/{post}.ipynb: chat_tokens)") for f in flags), flags


def test_code_pasted_as_a_string_to_exec_is_flagged():
    pasted = _library_function("tiktoken", "_educational.py", "bpe_encode")
    notebook = _with_answer(released_notebook("11_tokenizer"), "encode_answer",
                            f"SOURCE = {pasted!r}\nexec(SOURCE)\n")
    flags = copy_flags(notebook, released_notebook("11_tokenizer"))
    assert any("code in a string: bpe_encode matches tiktoken's educational BPE" in f for f in flags), flags


@pytest.mark.parametrize("name, grade_id, answer", [(TS, "adamw_answer", EXPLICIT_ADAMW),
                                                    ("11_tokenizer", "encode_answer", BPE_BY_INDEX)],
                         ids=["adamw", "bpe"])
def test_an_independent_correct_answer_is_not_flagged(name, grade_id, answer):
    notebook = _with_answer(released_notebook(name), grade_id, answer)
    flags = copy_flags(notebook, released_notebook(name))
    assert cell_notes(flags).get(grade_id) is None, flags


def test_the_solution_is_flagged_as_the_solution_and_an_untouched_notebook_is_not():
    """The solutions are public: a learner who hands one in is named; the released stubs are nobody's."""
    flags = copy_flags(source_notebook(TS), released_notebook(TS))
    assert any(f.startswith("answer cell adamw_answer: AdamW.step matches the course's solution "
                            f"(solutions/{TS}.ipynb: AdamW.step) (100% of its code") for f in flags), flags
    assert copy_flags(released_notebook(TS), released_notebook(TS)) == []


def test_a_pasted_attention_with_renamed_variables_is_flagged():
    notebook = _with_answer(released_notebook("03_attention"), "attention_answer", _pasted_attention())
    flags = copy_flags(notebook, released_notebook("03_attention"))
    assert any(f.startswith("answer cell attention_answer: Attention.forward matches the course's own "
                            "implementation (graders/reference/components.py: Attention.forward)")
               for f in flags), flags


def _class(tmp_path, answers_by_student: dict[str, str]) -> ClassResults:
    """A graded class of 12 whose adamw answers are given; every other cell as released."""
    results = ClassResults(tmp_path)
    cells = [{"grade_id": "adamw_test", "points": 5.0, "max_points": 5.0, "status": "passed", "message": ""}]
    for student, answer in answers_by_student.items():
        given = answers(released_notebook(TS))
        results.put({"student": student, "notebook": TS, "notes": [], "flags": [], "cells": cells,
                     "seconds": 1.0, "submission": {"file": f"{student}/{TS}.ipynb"}, "feedback": None,
                     "answers": dict(given, adamw_answer=answer)})
    return results


def test_two_students_with_the_same_answer_are_flagged_as_each_others_and_keep_their_grades(tmp_path):
    ours = answers(source_notebook(TS))["adamw_answer"]
    renamed = ours.replace("state", "memory").replace("grad", "g").replace("# decoupled weight decay", "")
    results = _class(tmp_path, {"ann": ours, "bob": renamed, "cy": EXPLICIT_ADAMW})
    before = {key: entry["cells"] for key, entry in results.entries.items()}
    review_class(results, tmp_path)
    copies = {student: entry.get("copies", []) for (student, _), entry in results.entries.items()}
    for student, other in (("ann", "bob"), ("bob", "ann")):
        assert [n.split(" (")[0] for n in copies[student]] == [
            "answer cell adamw_answer: the answer matches other students' answers to the same exercise"], copies
        assert f"exercise ({other}: " in copies[student][0] and "cy:" not in copies[student][0], copies
    assert copies["cy"] == [], copies          # the independent answer
    assert {key: entry["cells"] for key, entry in ClassResults(tmp_path).entries.items()} == before
    assert "to the same exercise (bob: " in (tmp_path / "reports" / "ann.txt").read_text()
    assert "matches" not in (tmp_path / "reports" / "cy.txt").read_text()


def test_the_class_pass_is_the_answer_cells_comment_in_nbgrader_and_runs_again_unchanged(tmp_path):
    ours = answers(source_notebook(TS))["adamw_answer"]
    results = _class(tmp_path, {"ann": ours, "bob": ours})
    comments, grades = {}, {}

    def notebook(name, assignment, student):
        return SimpleNamespace(comments=comments.setdefault(student, [
            SimpleNamespace(name=n, auto_comment=None) for n in ("adamw_answer", "clip_answer")]))
    gradebook = SimpleNamespace(assignments={TS: TS}, gradebook=SimpleNamespace(
        find_grade=lambda cell, nb, a, student: grades.setdefault((student, cell), SimpleNamespace(manual_score=None)),
        find_submission_notebook=notebook, db=SimpleNamespace(commit=lambda: None)))
    review_class(results, tmp_path, gradebook)
    assert "exercise (bob: " in comments["ann"][0].auto_comment and comments["ann"][1].auto_comment is None
    assert grades["ann", "adamw_test"].auto_score == 5.0
    comments.clear()
    review_class(ClassResults(tmp_path), tmp_path, gradebook)   # nothing changed: nothing rewritten
    assert comments == {}
    del results.entries["bob", TS]                              # bob withdrawn: ann's note goes
    review_class(results, tmp_path, gradebook)
    assert comments["ann"][0].auto_comment is None and "copies" in results.entries["ann", TS]


def test_class_notes_do_not_depend_on_the_order_notebooks_were_graded_in():
    ours = answers(source_notebook(TS))
    graded = [((student, TS), {"answers": dict(ours, adamw_answer=text)}) for student, text in
              (("ann", ours["adamw_answer"]), ("bob", ours["adamw_answer"].replace("state", "s")),
               ("cy", EXPLICIT_ADAMW))]
    notes = class_notes(dict(graded))
    assert notes == class_notes(dict(graded[::-1])), notes
    assert [n.split(":")[0] for n in notes[("ann", TS)]].count("answer cell adamw_answer") == 1
    assert not [n for n in notes[("cy", TS)] if n.startswith("answer cell adamw_answer")], notes


def test_class_notes_compare_only_the_same_exercise():
    entries = {("ann", TS): {"answers": {"adamw_answer": EXPLICIT_ADAMW}},
               ("bob", TS): {"answers": {"clip_answer": EXPLICIT_ADAMW}}}
    assert class_notes(entries) == {}


def test_the_copy_note_is_the_answer_cells_comment_in_nbgrader():
    """What formgrader shows the instructor: nbgrader's auto comment on the copied answer cell
    (kept apart from the student's feedback page)."""
    from graders.harness.gradebook import save_verdicts

    comments = [SimpleNamespace(name=n, auto_comment=None) for n in ("attention_answer", "other_answer")]
    grades = {}
    fake = SimpleNamespace(
        find_grade=lambda cell, *_: grades.setdefault(cell, SimpleNamespace(manual_score=None)),
        find_submission_notebook=lambda *_: SimpleNamespace(comments=comments),
        db=SimpleNamespace(commit=lambda: None))
    cells = [{"grade_id": "attention_test", "points": 9, "max_points": 9, "status": "passed", "message": ""}]
    notebook = _with_answer(released_notebook("03_attention"), "attention_answer", _pasted_attention())
    save_verdicts(fake, "03_attention", "03_attention", "pat", cells,
                  copy_flags(notebook, released_notebook("03_attention")))
    assert "Attention.forward matches the course's own implementation" in comments[0].auto_comment
    assert comments[1].auto_comment is None and grades["attention_test"].auto_score == 9


@pytest.mark.slow
def test_a_pasted_attention_keeps_its_points_and_is_reported(tmp_path, monkeypatch):
    """Its grade is the one it gets with the copy check switched off: full points."""
    notebook = _with_answer(submission("03_attention", solved=True), "attention_answer", _pasted_attention())
    path = tmp_path / "03_attention.ipynb"
    nbformat.write(notebook, path)
    result, _ = grading.grade_notebook("pat", "03_attention", path, tmp_path / "work")
    assert result.score == sum(c.max_points for c in result.cells)
    assert any("Attention.forward matches the course's own implementation" in f for f in result.flags)
    monkeypatch.setattr(grading, "copy_flags", lambda *_: [])
    unchecked, _ = grading.grade_notebook("pat", "03_attention", path, tmp_path / "again")
    assert unchecked.cells == result.cells and not any(map(is_copy_note, unchecked.flags))


@pytest.mark.slow
def test_make_grade_names_two_students_with_the_same_answer_and_keeps_their_grades(tmp_path):
    """The class pass in `make grade` (graders.harness.classroom): ann's and bob's attention are
    one answer (bob changed its comments); each is named in the other's report, and both keep
    the points the answer earns. Running again keeps the notes."""
    from graders.harness import classroom
    from graders.harness.limits import TimeLimits

    ann = submission("03_attention", solved=True)
    bob = _with_answer(submission("03_attention", solved=True), "attention_answer",
                       re.sub(r"#.*", "# mine", answers(ann)["attention_answer"]))
    for student, notebook in (("ann", ann), ("bob", bob)):
        (tmp_path / "class" / student).mkdir(parents=True)
        nbformat.write(notebook, tmp_path / "class" / student / "03_attention.ipynb")
    out = tmp_path / "out"
    for _ in range(2):
        entries = classroom.grade_class(tmp_path / "class", out, ["03_attention"], workers=1, limits=TimeLimits())
        for entry in entries:
            assert sum(c["points"] for c in entry["cells"]) == sum(c["max_points"] for c in entry["cells"])
        for student, other in (("ann", "bob"), ("bob", "ann")):
            assert f"answer cell attention_answer: the answer matches other students' answers to the same " \
                   f"exercise ({other}: " in (out / "reports" / f"{student}.txt").read_text()


def _bench_copies():
    """benchmarks/bench_copies.py, whose code makes the disguised copies."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_copies.py"
    spec = importlib.util.spec_from_file_location("bench_copies", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_honest_answer_of_the_corpus_is_flagged():
    """Answers written without the solution (tests/copies_corpus, the catalogs' correct variants)
    raise no copy note, at the bars copy_thresholds declares."""
    flagged = [(honest.origin, notes) for honest, _, notes in _bench_copies().honest_results() if notes]
    assert flagged == []


def test_every_bar_stands_its_margin_above_what_honest_answers_reach():
    """An exercise's bar (copy_thresholds) is at least MARGIN above the most an honest answer to
    it shares with a source, or the exercise cannot flag; unnamed exercises share the default."""
    from graders.harness.copy_thresholds import MARGIN, threshold

    for honest, matches, _ in _bench_copies().honest_results():
        bar = threshold(honest.notebook, honest.grade_id)
        for match in matches:
            assert bar is None or match.share + MARGIN <= bar + 1e-9, (honest.origin, match, bar)


def test_disguised_solutions_and_library_sources_are_flagged():
    """Every solution cell and refused library function, disguised by the benchmark's code (names
    changed, comments gone, statements reordered, re-laid out), is flagged where its exercise can
    flag."""
    results = _bench_copies().catch_results()
    missed = sorted((what, function, f"{share:.0%}") for what, function, share, caught in results if not caught)
    assert len(results) > 40 and missed == [], missed


def test_an_exercise_that_cannot_flag_raises_no_note_even_for_the_solution_itself():
    """12's checkpoints: one state_dict or state per object given, so honest answers are the
    solution (100%); the other cells of the solution are still flagged."""
    flags = cell_notes(copy_flags(source_notebook(TS), released_notebook(TS)))
    assert "checkpoint_answer" not in flags and "adamw_answer" in flags, flags
