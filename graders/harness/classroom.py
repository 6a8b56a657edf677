"""Grade a whole class: `python -m graders.harness.classroom --help` (what `make grade` runs).

Submissions are found by graders.harness.intake (nbgrader's `submitted/` folders, plain
`<student>/` folders, `<student>.zip` archives, LMS downloads `<student>_<nb>.ipynb`; every
other file is listed as ignored). Each (student, notebook) is graded by graders.harness.grading
on a Dask cluster: a local one with one worker per core by default, or the scheduler named by
`--scheduler` (the same code path). One submission's failure never stops the class.

Each notebook's result is saved the moment it is graded, so an interrupted run keeps what it
did, and running again grades only what is new or changed (same file and same grader: kept);
a second batch of submissions is merged into the same output folder. When every notebook of a
run is graded, one pass over the saved answers (`review_class`, comparing them with
graders.harness.copies) names the answer cells that are near-copies of another student's,
whatever order they were graded in.
Outputs:

    OUT/grades.csv                     one row per student: points per test cell, total, maximum
    OUT/reports/<student>.txt          why each point was lost
    OUT/feedback/<student>/<nb>.html   the notebook with its verdicts, as nbgrader's feedback
    OUT/results.json                   all of it, machine-readable, with seconds per notebook
    OUT/ignored.txt                    the files of the last run that were not graded, and why
    OUT/insights.html                  what the class got wrong, for the instructor (graders.harness.insights),
                                       with its tables in OUT/insights.json and OUT/insights/*.csv

and, in the nbgrader course given by --course (graders.harness.gradebook): the scores and
comments in its gradebook, autograded/<student>/<assignment>/ and feedback/<student>/<assignment>/.
"""
from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path

from graders.harness.class_progress import Progress
from graders.harness.copies import class_notes
from graders.harness.insights import write_insights
from graders.harness.intake import IntakeError, Submission, discover, graded_notebooks
from graders.harness.reports import safe, write_grades_csv, write_report
from graders.harness.results import ClassResults, ResultsError, submission_key

EVENTS = "gpt2-grading"   # Dask event topic: a worker names the notebook it starts or finishes


# --- One task: runs on a Dask worker --------------------------------------------------------

def grade_task(submission: Submission, limits, kernels_at_once: int = 1, alike: tuple = ()) -> dict:
    """Grade one handed-in notebook (its kernels up to `kernels_at_once` at a time): {"entry":
    its results.json entry (without the submission key), "notebook": the annotated notebook
    (JSON), "feedback": its feedback page, "alike": the same for each of `alike`, other
    students' submissions of the very same file, which this grading grades too (a verdict
    depends on the file alone: graders.harness.grading)}. Never raises: an unreadable notebook,
    or the grader's own failure, is reported as such."""
    import nbformat

    from graders.harness import grading
    from graders.harness.execute import scratch_dir
    from graders.harness.copies import answers, is_copy_note
    from graders.harness.feedback import annotated, feedback_html

    _announce("started", submission)
    start = time.perf_counter()
    members = (submission, *alike)
    name, pages, answered = submission.notebook, [(None, None)] * len(members), {}
    try:
        nbformat.read(submission.path, as_version=4)
    except Exception as err:  # one fact, instead of "graded as empty" and a note per cell
        why = f"{submission.label} could not be read as a notebook ({type(err).__name__}: " \
              f"{str(err).splitlines()[0] if str(err) else ''})"
        cells, flags = _ungraded(name, "error", f"not graded: {why}"), [why]
    else:
        try:
            with scratch_dir() as workdir:
                result, executed = grading.grade_notebook(submission.student, name, submission.path,
                                                          workdir, limits, kernels_at_once=kernels_at_once)
            cells, flags, answered = result.to_json()["cells"], result.flags, answers(executed)
            # `nbgrader generate_feedback` makes the learner's page from the autograded notebook:
            # copy notes stay in the report and the gradebook's comment (as graders.harness.autograde)
            pages = []
            for member in members:
                notebook = annotated(executed, name, cells,
                                     [note for note in member.notes + flags if not is_copy_note(note)])
                pages.append((nbformat.writes(notebook), feedback_html(notebook, name, cells)))
        except Exception as err:  # the grader's own failure: reported, never silently zero
            cells, flags = _ungraded(name, "error", f"the grader failed on this notebook: "
                                                    f"{type(err).__name__}: {err}"), []
            pages = [(None, None)] * len(members)
    seconds = round(time.perf_counter() - start, 1)
    _announce("finished", submission)
    done = []
    for member, (notebook, page) in zip(members, pages):
        # "answers": for the class-wide copy check (review_class)
        entry = {"student": member.student, "notebook": name, "notes": member.notes, "flags": flags,
                 "cells": cells, "seconds": seconds, "answers": answered}
        if alike:   # who handed in the same file (results.json only: a learner's page names nobody)
            entry["same_file_as"] = sorted(m.student for m in members if m is not member)
        done.append({"entry": entry, "notebook": notebook, "feedback": page})
    return {**done[0], "alike": done[1:]}


def _announce(what: str, submission: Submission) -> None:
    """Tell the class's progress display that this worker started or finished a notebook."""
    try:
        from distributed import get_worker

        get_worker().log_event(EVENTS, [what, f"{submission.student}/{submission.notebook}"])
    except ValueError:  # not on a Dask worker
        pass


def _ungraded(name: str, status: str, message: str) -> list[dict]:
    """Every test cell of a notebook at 0 points, for one reason."""
    from graders.harness.cells import nbgrader_meta, points_of, source_notebook, test_cells

    return [{"grade_id": nbgrader_meta(c)["grade_id"], "points": 0.0, "max_points": points_of(c),
             "status": status, "message": message} for c in test_cells(source_notebook(name))]


# --- The class ---------------------------------------------------------------------------

def grade_class(submissions: Path, out: Path, names: list[str] | None = None, workers: int = 1,
                scheduler: str | None = None, limits=None, course: Path | None = None) -> list[dict]:
    """Grade what is new or changed in `submissions` into `out` (and the nbgrader course
    `course`, when given); return every entry of `out`'s results.

    `names`: the notebooks to grade (default: those anybody handed in). `limits`: a
    graders.harness.execute.TimeLimits (default: the course's)."""
    from graders.harness.limits import TimeLimits
    from graders.harness.gradebook import CourseGradebook

    limits = limits or TimeLimits()
    with tempfile.TemporaryDirectory(prefix="gpt2-submissions-") as unpacked:
        intake = discover(submissions, names, Path(unpacked))
        results = ClassResults(out)
        gradebook = CourseGradebook(course, intake.names) if course else None
        try:
            _write_ignored(out, submissions, intake.ignored)
            if gradebook:
                gradebook.enrol(intake.submissions)
            todo = _plan(intake, results, out, gradebook)
            for student in results.students():
                write_report(out, student, results)
            write_grades_csv(out, results)
            if todo:
                _grade_on_cluster(todo, limits, workers, scheduler,
                                  lambda submission, done: _save(submission, done, results, out, gradebook))
            review_class(results, out, gradebook, {(s.student, s.notebook) for s in todo})
            write_insights(out, [results.entries[key] for key in sorted(results.entries)])
        finally:
            if gradebook:
                gradebook.close()
    return [results.entries[key] for key in sorted(results.entries)]


def _plan(intake, results: ClassResults, out: Path, gradebook) -> list[Submission]:
    """The notebooks to grade; missing ones are recorded now (unless an earlier batch graded
    them), unchanged ones are kept. Prints what was found."""
    todo, kept, missing = [], 0, 0
    for student, notebooks in intake.submissions.items():
        for name, submission in notebooks.items():
            if submission.path is None:
                missing += 1
                if not results.graded_before(student, name):
                    results.entries[(student, name)] = {
                        "student": student, "notebook": name, "notes": submission.notes, "flags": [],
                        "cells": _ungraded(name, "missing-notebook", f"{name}.ipynb was not submitted"),
                        "seconds": None, "submission": None, "feedback": None}
                continue
            stored = results.unchanged(submission)
            executed = bool(stored and stored.get("feedback"))
            if stored and (not executed or (out / stored["feedback"]).is_file()) \
                    and (gradebook is None or gradebook.holds(student, name, executed)):
                kept += 1
                stored["notes"] = submission.notes
            else:
                todo.append(submission)
    results.save()
    ignored = f"; {len(intake.ignored)} files not graded (see {out / 'ignored.txt'})" if intake.ignored else ""
    print(f"{len(intake.submissions)} students, notebooks {', '.join(intake.names) or 'none'}: "
          f"{len(todo)} to grade, {kept} unchanged since the last run (kept), {missing} not handed in{ignored}")
    for line in intake.ignored:
        print(f"  not graded: {line}")
    return todo


def _save(submission: Submission, done: dict, results: ClassResults, out: Path, gradebook) -> None:
    """One graded notebook into every output, the moment it is done."""
    entry = dict(done["entry"], submission=submission_key(submission), feedback=None)
    if done["feedback"]:
        entry["feedback"] = f"feedback/{safe(submission.student)}/{submission.notebook}.html"
        (out / entry["feedback"]).parent.mkdir(parents=True, exist_ok=True)
        (out / entry["feedback"]).write_text(done["feedback"])
    if gradebook:
        gradebook.record(submission, entry["cells"], done["notebook"], done["feedback"], entry["flags"])
    results.put(entry)
    write_report(out, submission.student, results)
    write_grades_csv(out, results)


def review_class(results, out: Path, gradebook=None, fresh=()) -> None:
    """The class-wide pass, after the notebooks of a run are graded (in any order, on any worker):
    each entry's "copies" are its notes naming other students; the reports are rewritten, and the
    gradebook's comments of the cells whose notes changed or that were graded just now (`fresh`:
    (student, notebook) pairs). Grades are untouched. It runs after every run, also one that
    graded nothing new: the run before may have been interrupted before its pass."""
    from graders.harness.gradebook import save_verdicts

    notes = class_notes(results.entries)
    changed = {key for key, entry in results.entries.items() if entry.get("copies", []) != notes.get(key, [])}
    for key in changed:   # an entry without notes is left as graded
        results.entries[key]["copies"] = notes.get(key, [])
    results.save()
    for student in results.students():
        write_report(out, student, results)
    if gradebook is None:
        return
    from nbgrader.api import MissingEntry

    for student, name in sorted(changed | set(fresh)):
        entry = results.entries.get((student, name))
        if entry is None or not entry.get("submission") or name not in gradebook.assignments:
            continue
        try:
            save_verdicts(gradebook.gradebook, gradebook.assignments[name], name, student, entry["cells"],
                          entry["flags"] + entry.get("copies", []))
        except MissingEntry:   # graded into another course by an earlier run
            continue


def _write_ignored(out: Path, submissions: Path, ignored: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "ignored.txt").write_text(f"Files in {submissions} that the last run did not grade, and why:\n"
                                     + "".join(f"{line}\n" for line in ignored or ["(none)"]))


def _grade_on_cluster(todo: list[Submission], limits, workers: int, scheduler: str | None, save) -> None:
    """Grade `todo` on the Dask cluster; `save(submission, done)` each as it finishes."""
    from distributed import Client, LocalCluster, as_completed

    cluster = None if scheduler else LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, memory_limit=0, dashboard_address=":0")
    client = Client(scheduler or cluster)
    # The workers keep the cores busy; a lone local worker may run a notebook's kernels two at a time.
    kernels_at_once = 2 if cluster and workers == 1 else 1
    progress = Progress(len(todo))
    same_file: dict[tuple[str, str], list[Submission]] = {}
    for submission in todo:   # graded once per distinct file
        same_file.setdefault((submission.notebook, submission.sha256 or submission.student), []).append(submission)
    try:
        client.subscribe_topic(EVENTS, progress.announced)
        futures = {client.submit(grade_task, first, limits, kernels_at_once, tuple(alike), pure=False,
                                 key=f"grade-{first.student}-{first.notebook}"): [first, *alike]
                   for first, *alike in same_file.values()}
        for future in as_completed(futures):
            members = futures[future]
            try:
                done = future.result()
            except Exception as err:  # the worker died under it: reported like a grader failure
                done = {**_died(members[0], err), "alike": [_died(member, err) for member in members[1:]]}
            for member, each in zip(members, [done, *done["alike"]]):
                progress.finished(each["entry"])
                save(member, each)
    finally:
        progress.close()
        _shut_down(client, cluster)


def _shut_down(client, cluster) -> None:
    """Close the client and the local cluster, each within CLOSE_SECONDS. A close that fails or
    times out (a Ctrl-C reaches the workers too, and they die under it) must not replace the
    interrupt or the finished run: every graded notebook is saved by then."""
    with contextlib.suppress(Exception):   # TimeoutError, CommClosedError, OSError, ...
        client.close(timeout=CLOSE_SECONDS)
    if cluster:
        with contextlib.suppress(Exception):
            cluster.close(timeout=CLOSE_SECONDS)


CLOSE_SECONDS = 10


def _died(submission: Submission, err: Exception) -> dict:
    return {"entry": {"student": submission.student, "notebook": submission.notebook, "notes": submission.notes,
                      "flags": [], "seconds": None,
                      "cells": _ungraded(submission.notebook, "error", f"the grader failed on this notebook: "
                                                                       f"{type(err).__name__}: {err}")},
            "notebook": None, "feedback": None}


def main(argv=None) -> int:
    import argparse
    import os

    from graders.harness.limits import TimeLimits
    from graders.harness.gradebook import CourseError
    from graders.integrity.host import confinement_unavailable, unconfined_notice
    from graders.reference.model import ReferenceUnavailable
    from graders.reference.store import reference_id

    parser = argparse.ArgumentParser(prog="python -m graders.harness.classroom", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=Path, required=True,
                        help="folder of submissions (an nbgrader course folder works: its submitted/)")
    parser.add_argument("--out", type=Path, default=Path("grading"),
                        help="output folder (default: grading/); results already there are kept and merged")
    parser.add_argument("--course", type=Path, default=None,
                        help="nbgrader course whose gradebook receives the grades (default: "
                             "nbgrader_config.py's, build/course); release it first with `make release`")
    parser.add_argument("--plain", action="store_true",
                        help="write the plain files only, no nbgrader gradebook")
    parser.add_argument("--notebooks", nargs="*", default=None,
                        help="notebook names to grade (default: every course notebook anybody handed in)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="local worker processes (default: number of CPU cores)")
    parser.add_argument("--scheduler", default=None,
                        help="address of a Dask scheduler (tcp://host:8786) to grade on a cluster")
    parser.add_argument("--cell-timeout", type=int, default=TimeLimits.ordinary,
                        help=f"seconds an ordinary cell may run (default {TimeLimits.ordinary})")
    parser.add_argument("--training-cell-timeout", type=int, default=TimeLimits.training,
                        help="seconds a cell tagged `training` may run (notebook 07's budgeted "
                             f"training runs; default {TimeLimits.training})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.notebooks or []) - set(graded_notebooks()))
    if unknown:
        parser.error(f"not graded notebooks of this course: {', '.join(unknown)} "
                     f"(choose from {', '.join(graded_notebooks())})")
    course = None if args.plain else args.course or _configured_course()
    limits = TimeLimits(args.cell_timeout, args.training_cell_timeout)
    try:
        reference_id()   # which weights grade the class, before any submission is read
    except ReferenceUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    unavailable = confinement_unavailable()
    if unavailable:
        print(unconfined_notice(unavailable), file=sys.stderr, flush=True)
    try:
        entries = grade_class(args.submissions, args.out, args.notebooks or None, args.workers,
                              args.scheduler, limits, course)
    except (IntakeError, ResultsError, CourseError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted: every notebook graded so far is saved in {args.out}"
              + (f" and {course}" if course else "") + "; run the same command again to resume.")
        return 130
    print(f"{len({e['student'] for e in entries})} students in {args.out / 'grades.csv'}, reports in "
          f"{args.out / 'reports'}" + (f"; nbgrader gradebook: {course}" if course else ""))
    return 0


def _configured_course() -> Path:
    from graders.harness.gradebook import nbgrader_course

    return Path(nbgrader_course()[0].root)


if __name__ == "__main__":
    raise SystemExit(main())
