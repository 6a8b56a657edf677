"""Grades in an LMS's import format, as nbgrader export plugins (nbgrader.plugins.ExportPlugin).

    nbgrader export --exporter=graders.harness.lms_export.CanvasExporter --to=canvas.csv
    nbgrader export --exporter=graders.harness.lms_export.MoodleExporter --to=moodle.csv

Both read nbgrader's gradebook, so a score an instructor set in formgrader (an override) counts
as nbgrader's own export counts it: each assignment's score is its cells' scores (the manual
score where there is one) less the late penalty, and 0 for an assignment not handed in.
`--assignment` and `--student` select, as for nbgrader's CSV. The columns of each format are in
docs/instructors.md (Grades in the LMS).
"""
from __future__ import annotations

import csv

from nbgrader.api import MissingEntry
from nbgrader.plugins import ExportPlugin

CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_POINTS = "    Points Possible"   # Canvas's second row, as its own export writes it
MOODLE_COLUMNS = ("First name", "Last name", "ID number", "Email address")


def _number(value: float) -> str:
    return f"{value:g}"


class _GradebookExport(ExportPlugin):
    """The students and assignments selected, each student's score on each assignment, and the
    file written from the `rows` a subclass gives."""

    default_to = "grades.csv"

    def selected(self, gradebook) -> tuple[list, list]:
        wanted_students = {str(s) for s in self.student}
        wanted_assignments = {str(a) for a in self.assignment}
        students = [s for s in gradebook.students if not wanted_students or s.id in wanted_students]
        assignments = [a for a in gradebook.assignments if not wanted_assignments or a.name in wanted_assignments]
        return students, assignments

    @staticmethod
    def score(gradebook, assignment, student) -> float:
        try:
            submission = gradebook.find_submission(assignment.name, student.id)
        except MissingEntry:
            return 0.0
        return max(0.0, submission.score - (submission.late_submission_penalty or 0.0))

    def export(self, gradebook) -> None:
        destination = self.to or self.default_to
        self.log.info("Exporting grades to %s (%s)", destination, type(self).__name__)
        with open(destination, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(self.rows(gradebook))


class CanvasExporter(_GradebookExport):
    """Canvas's gradebook CSV: Student ("Last, First"), ID (Canvas's user id: nbgrader's
    lms_user_id), SIS User ID, SIS Login ID (nbgrader's student id), Section, then one column per
    assignment, named as in nbgrader (Canvas makes a new assignment of a column it does not know);
    the second row gives each assignment's points possible."""

    default_to = "canvas_grades.csv"

    def rows(self, gradebook) -> list[list[str]]:
        students, assignments = self.selected(gradebook)
        rows = [[*CANVAS_COLUMNS, *(a.name for a in assignments)],
                [CANVAS_POINTS, "", "", "", "", *(_number(a.max_score) for a in assignments)]]
        for student in students:
            name = ", ".join(filter(None, (student.last_name, student.first_name))) or student.id
            rows.append([name, student.lms_user_id or "", "", student.id, "",
                         *(_number(self.score(gradebook, a, student)) for a in assignments)])
        return rows


class MoodleExporter(_GradebookExport):
    """Moodle's grade import CSV: First name, Last name, ID number (nbgrader's student id),
    Email address, then one column per assignment with its points; in Moodle's import, identify
    users by ID number (or Email address) and map each assignment column to its grade item."""

    default_to = "moodle_grades.csv"

    def rows(self, gradebook) -> list[list[str]]:
        students, assignments = self.selected(gradebook)
        rows = [[*MOODLE_COLUMNS, *(a.name for a in assignments)]]
        for student in students:
            rows.append([student.first_name or "", student.last_name or "", student.id, student.email or "",
                         *(_number(self.score(gradebook, a, student)) for a in assignments)])
        return rows
