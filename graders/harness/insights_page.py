"""The insights page: graders.harness.insights' figures as one HTML file that opens offline.

Everything is inside the file (styles, the heat map as an embedded PNG, the histograms as bars
drawn with CSS), so it can be mailed or opened from a download. Each table carries a `data-table`
attribute, and each row a `data-` attribute per column, so that a test reads the very numbers
the page shows.
"""
from __future__ import annotations

import base64
import io
from html import escape

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { padding: .2em .6em; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.bars { display: flex; align-items: flex-end; height: 24px; gap: 1px; }
.bars span { width: 7px; background: #4a7ab5; }
pre { margin: 0; white-space: pre-wrap; font-size: 12px; max-width: 50em; }
.note { color: #555; max-width: 60em; }
img.heat { max-width: 100%; border: 1px solid #ccc; }
"""


def _cell(value) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f'<td class="n">{escape(str(value))}</td>' if numeric else f"<td>{escape(str(value))}</td>"


def _attributes(row: dict) -> str:
    return " ".join(f'data-{key.replace("_", "-")}="{escape(str(value))}"' for key, value in row.items()
                    if not isinstance(value, (list, dict)))


def _histogram(counts: list[int]) -> str:
    top = max(counts) or 1
    bars = "".join(f'<span title="{n}" style="height:{2 + 22 * n // top}px"></span>' for n in counts)
    return f'<td><div class="bars" data-histogram="{" ".join(map(str, counts))}">{bars}</div></td>'


def _table(name: str, rows: list[dict], columns: list[tuple[str, str]], extra=None, extra_heading: str = "") -> str:
    """A table of `rows` showing `columns` ((key, heading) pairs); `extra(row)` adds a cell under
    `extra_heading`."""
    if not rows:
        return f'<p class="none" data-table="{name}">None.</p>'
    head = "".join(f"<th>{escape(h)}</th>" for _, h in columns)
    body = "".join(f"<tr {_attributes(row)}>" + "".join(_cell(row[k]) for k, _ in columns)
                   + (extra(row) if extra else "") + "</tr>" for row in rows)
    return f'<table data-table="{name}"><tr>{head}{f"<th>{extra_heading}</th>" if extra else ""}</tr>{body}</table>'


def heat_map_png(heat: dict) -> bytes:
    """Students (rows, best total first) by test cells: the share of each cell's points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, columns = len(heat["students"]), len(heat["columns"])
    figure, axes = plt.subplots(figsize=(min(16, 2 + 0.18 * columns), min(30, 1 + 0.16 * rows)), dpi=80)
    image = axes.imshow(heat["shares"] or [[0.0]], aspect="auto", cmap="RdYlGn", vmin=0, vmax=1,
                        interpolation="nearest")
    axes.set_xticks(range(columns), heat["columns"], rotation=90, fontsize=6)
    axes.set_yticks(range(rows), heat["students"], fontsize=6 if rows > 40 else 8)
    figure.colorbar(image, ax=axes, fraction=0.03, label="share of the cell's points")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def _mistakes(rows: list[dict]) -> str:
    """The mistakes, one table per test cell, most frequent first."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        cells.setdefault((row["notebook"], row["cell"]), []).append(row)
    if not cells:
        return '<p class="none" data-table="mistakes">None.</p>'
    parts = []
    for (notebook, cell), found in cells.items():
        body = "".join(f'<tr {_attributes(r)}><td class="n">{r["students"]}</td><td>{escape(r["kind"])}</td>'
                       f'<td><code>{escape(r["mistake"])}</code></td><td><pre>{escape(r["example"])}</pre></td></tr>'
                       for r in found)
        parts.append(f"<h3>{escape(notebook)}: {escape(cell)}</h3><table data-table=\"mistakes\">"
                     f"<tr><th>students</th><th>counted by</th><th>mistake</th><th>example (anonymised)</th>"
                     f"</tr>{body}</table>")
    return "".join(parts)


def _top(rows: list[dict], shown: int = 8) -> str:
    """The mistakes made by the most students, across the class: where to start reading."""
    top = sorted(rows, key=lambda r: (-r["students"], r["notebook"], r["cell"]))[:shown]
    return _table("top", top, [("students", "students"), ("notebook", "notebook"), ("cell", "test cell"),
                               ("mistake", "mistake")])


def _copy_links(row: dict) -> str:
    links = " ".join(f'<a href="{escape(path)}">{escape(name)}</a>'
                     for name, path in zip(row["who"].split(), row["reports"].split()))
    return f"<td>{links}</td>"


def page(found: dict) -> str:
    heat = base64.b64encode(heat_map_png(found["heat_map"])).decode()
    cells = _table("cells", found["cells"], [
        ("notebook", "notebook"), ("cell", "test cell"), ("max_points", "max"), ("students", "handed in"),
        ("mean", "mean"), ("median", "median"), ("full_marks", "share full marks"),
        ("not_written", "share not written yet"), ("crashed", "crashes"), ("timeout", "time-outs"),
        ("not_handed_in", "not handed in")], extra=lambda row: _histogram(row["histogram"]), extra_heading="points")
    hidden = _table("hidden_only", found["hidden_only"], [
        ("notebook", "notebook"), ("cell", "test cell"), ("students", "students"), ("who", "who")])
    copies = _table("copies", found["copies"], [
        ("notebook", "notebook"), ("answer_cell", "answer cell"), ("students", "students")],
        extra=_copy_links, extra_heading="reports")
    timing = _table("timing", found["timing"], [
        ("notebook", "notebook"), ("graded", "graded"), ("mean_seconds", "mean s"),
        ("median_seconds", "median s"), ("max_seconds", "max s"), ("total_seconds", "total s")])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>What the class got wrong</title>
<style>{STYLE}</style></head><body>
<h1>What the class got wrong</h1>
<p class="note" id="summary" data-students="{found['students']}" data-notebooks="{found['notebooks']}">
{found['students']} students, {found['notebooks']} notebooks, from results.json. The same tables are in
insights.json and insights/*.csv. This page names students: it is for instructors only.</p>
<h2 id="top">The most frequent mistakes</h2>{_top(found['mistakes'])}
<h2 id="cells">Test cells</h2>
<p class="note">Points of the students who handed the notebook in; the histogram counts them in five
bins from 0 (left) to full marks (right).</p>{cells}
<h2 id="mistakes">Mistakes, per test cell</h2>
<p class="note">A recognised mistake is counted by its key (notebook/exercise/mistake), which stays
when its wording changes; a mistake named without a key by its words; any other failure by where
the check localised it (its first line). Cells not written yet are left out.</p>{_mistakes(found['mistakes'])}
<h2 id="hidden">Failed only a hidden check</h2>
<p class="note">Answers that passed every visible check of a cell and failed a hidden one: code
tuned to the visible example, or a case the notebook's text should announce.</p>{hidden}
<h2 id="heat">Students by test cells</h2>
<p class="note">Each row a student (best total at the top), each column a test cell; green is full
marks, red none.</p><img class="heat" alt="heat map of students by test cells"
src="data:image/png;base64,{heat}">
<h2 id="copies">Copy flags</h2>
<p class="note">Answers flagged as near-copies (of the course's code, a library's, or another
student's), per answer cell; the reports say of what.</p>{copies}
<h2 id="timing">Grading time</h2>{timing}
</body></html>
"""
