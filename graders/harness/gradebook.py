"""The secure verdicts in nbgrader's own course folder, as `nbgrader autograde` would leave them.

For each graded notebook, through nbgrader's API (`nbgrader.api.Gradebook`): the student and
the submission (with its timestamp), each test cell's score as its `auto_score`, the diagnosis
of each failed test as the comment of the answer cell it checks (nbgrader keeps comments on
answer cells only: that is where formgrader and the feedback show them), and nbgrader's late
penalty. Beside it, the annotated notebook in `autograded/<student>/<assignment>/` (what
formgrader shows) and the feedback page in `feedback/<student>/<assignment>/`, each with the
files `nbgrader submit` put beside the notebook (`timestamp.txt`, `submission_secret.txt`:
`nbgrader release_feedback` needs them). A score an instructor set in formgrader is kept and
flagged for review, as nbgrader's own autograder does.
"""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import nbformat

from graders.harness.copies import cell_notes
from graders.harness.feedback import answer_comments


def nbgrader_course(root: Path | None = None):
    """(CourseDirectory, config) as nbgrader's own commands configure them: nbgrader_config.py in
    the current folder and in Jupyter's config folders, with the course at `root` when given."""
    from nbgrader.apps.baseapp import NbGrader
    from nbgrader.coursedir import CourseDirectory

    app = NbGrader()
    app.load_config_file()
    config = app.config
    if root:
        config.CourseDirectory.root = str(Path(root).resolve())
    return CourseDirectory(config=config), config


class CourseError(ValueError):
    """No usable nbgrader course where the grades should go (the message says what to do)."""


def save_verdicts(gradebook, assignment: str, notebook: str, student: str, cells: list[dict],
                  flags=()) -> None:
    """Each test cell's score and each answer cell's comment (the diagnoses of its failed tests,
    and a note when it copies the course's code), for one submitted notebook."""
    for cell in cells:
        grade = gradebook.find_grade(cell["grade_id"], notebook, assignment, student)
        grade.auto_score = cell["points"]
        grade.needs_manual_grade = grade.manual_score is not None  # an override is re-examined
    comments = answer_comments(notebook, with_mistake_keys(cells))
    for grade_id, notes in cell_notes(flags).items():
        comments[grade_id] = "\n\n".join(filter(None, [comments.get(grade_id), *notes]))
    for comment in gradebook.find_submission_notebook(notebook, assignment, student).comments:
        comment.auto_comment = comments.get(comment.name)
    gradebook.db.commit()


def with_mistake_keys(cells: list[dict]) -> list[dict]:
    """The cells, each failed one whose message names a keyed mistake ending with that key: the
    gradebook's comment carries it, for whoever counts mistakes from nbgrader's database."""
    return [dict(cell, message=f"{cell['message']}\n  Mistake key: {cell['mistake']}") if cell.get("mistake")
            else cell for cell in cells]


class CourseGradebook:
    """An nbgrader course folder and its gradebook, open for one grading run."""

    def __init__(self, root: Path, names: list[str]):
        from nbgrader.api import Gradebook, Notebook

        self.coursedir, self.config = nbgrader_course(root)
        database = self.coursedir.db_url
        sqlite_file = database[len("sqlite:///"):] if database.startswith("sqlite:///") else None
        if sqlite_file and not Path(sqlite_file).is_file():
            raise CourseError(f"{root} is not a released nbgrader course (no {sqlite_file}): release "
                              f"the notebooks first: `make release` (or `python -m "
                              f"graders.course.notebooks release {root}`)")
        self.gradebook = Gradebook(database, self.coursedir.course_id)
        held: dict[str, list[str]] = {}
        for notebook in self.gradebook.db.query(Notebook):
            held.setdefault(notebook.name, []).append(notebook.assignment.name)
        self.assignments = {}
        for name in names:
            options = held.get(name, [])
            if name in options or len(options) == 1:
                self.assignments[name] = name if name in options else options[0]
            elif not options:
                self.close()
                raise CourseError(f"no assignment of the nbgrader course in {root} holds {name}.ipynb: "
                                  "release it first (`make release`)")
            else:
                self.close()
                raise CourseError(f"{name}.ipynb is in several assignments of {root} "
                                  f"({', '.join(sorted(options))}): grade each with its own course")
            self._check_released(root, name)

    def _check_released(self, root: Path, name: str) -> None:
        """The gradebook's test cells and points must be the source notebook's: grades written
        against another release would land on the wrong cells."""
        from graders.harness.cells import nbgrader_meta, points_of, source_notebook, test_cells

        released = {c.name: c.max_score for c in
                    self.gradebook.find_notebook(name, self.assignments[name]).grade_cells}
        source = {nbgrader_meta(c)["grade_id"]: points_of(c) for c in test_cells(source_notebook(name))}
        if released != source:
            self.close()
            raise CourseError(f"the nbgrader course in {root} was released from another version of "
                              f"{name}.ipynb (test cells {released} there, {source} in solutions/): "
                              "release it again (`make release`)")

    def close(self) -> None:
        self.gradebook.close()

    def folder(self, step: str, student: str, notebook: str) -> Path:
        """autograded/<student>/<assignment>/ or feedback/<student>/<assignment>/ (nbgrader's layout)."""
        return Path(self.coursedir.format_path(step, student, self.assignments[notebook]))

    def holds(self, student: str, notebook: str, executed: bool) -> bool:
        """Whether the gradebook has this student's scores for the notebook, and (when it was
        `executed`) autograded/ the notebook formgrader shows: a run grades again what it lacks."""
        from nbgrader.api import MissingEntry

        try:
            grades = self.gradebook.find_submission_notebook(
                notebook, self.assignments[notebook], student).grades
        except MissingEntry:
            return False
        autograded = self.folder(self.coursedir.autograded_directory, student, notebook) / f"{notebook}.ipynb"
        return (autograded.is_file() or not executed) and all(g.auto_score is not None for g in grades)

    def enrol(self, students) -> None:
        """Every student of the class, also one who handed in nothing readable (nbgrader export
        then lists them, with 0 points)."""
        for student in students:
            self.gradebook.update_or_create_student(student)

    def record(self, submission, cells: list[dict], notebook_json: str | None, page: str | None,
               flags=()) -> None:
        """One graded notebook into the gradebook and the course folders."""
        from nbgrader.preprocessors import AssignLatePenalties

        from sqlalchemy.exc import SAWarning

        student, name = submission.student, submission.notebook
        assignment = self.assignments[name]
        self.gradebook.update_or_create_student(student)
        stamp = {"timestamp": submission.timestamp} if submission.timestamp else {}
        with warnings.catch_warnings():  # nbgrader's add_submission trips SQLAlchemy 2's autoflush notices
            warnings.simplefilter("ignore", SAWarning)
            self.gradebook.update_or_create_submission(assignment, student, **stamp)
        save_verdicts(self.gradebook, assignment, name, student, cells, flags)
        ids = {"student": student, "assignment": assignment, "notebook": name,
               "db_url": self.coursedir.db_url}
        AssignLatePenalties(config=self.config).preprocess(nbformat.v4.new_notebook(), {"nbgrader": ids})
        for step, text, suffix in ((self.coursedir.autograded_directory, notebook_json, "ipynb"),
                                   (self.coursedir.feedback_directory, page, "html")):
            if text is None:
                continue
            folder = self.folder(step, student, name)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.{suffix}").write_text(text)
            if submission.folder:
                self._copy_companions(submission.folder, folder)

    def _copy_companions(self, source: Path, target: Path) -> None:
        """The submission's other files (timestamp, secret, data), as nbgrader copies them."""
        from nbgrader.utils import find_all_files

        for found in find_all_files(str(source), self.coursedir.ignore + ["*.ipynb"]):
            destination = target / Path(found).relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(found, destination)
