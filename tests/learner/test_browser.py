"""What a learner sees in `make lab`, in a real browser: Playwright driving Debian's Chromium.

- 01 with a buggy LayerNorm: the visible output holds the diagnosis and no `graders/` path;
  nbgrader's Validate dialog shows the diagnosis without scrolling.
- 06 untouched, Run All: every cell runs, down to the progress line of the last one.
- the lab has no instructor tools (Nbgrader menu, Create Assignment sidebar) and logs no error.

Screenshots go to $TMPDIR/gpt2-browser-test/. Needs Chromium (`apt-get install -y chromium`,
see the README); without it the tests fail saying so. Playwright's own browsers are not used.
"""
from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import free_port, served
from graders.course.example_class import BUGS, submission
from graders.course.notebooks import EXERCISES, ROOT
from graders.harness import cells

pytestmark = [pytest.mark.xdist_group("browser"), pytest.mark.slow]

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
INSTALL = ("install Debian's Chromium as the README says (`sudo apt-get install -y chromium`), "
           "then run the tests again")
SHOTS = Path(tempfile.gettempdir()) / "gpt2-browser-test"
VIEWPORT = {"width": 1400, "height": 900}
DIAGNOSIS = "Likely mistake: sample variance"
SERVER_START, CELL_RUN, VALIDATE = 120, 90, 120   # seconds: every wait is bounded


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(f"Chromium is not installed: {INSTALL}.", pytrace=False)
    return path


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """`make lab` serving a folder holding 01 with a buggy LayerNorm and 06 untouched (copies:
    exercises/ is never written), with JupyterLab's workspace and settings kept apart."""
    work = tmp_path_factory.mktemp("lab")
    nbformat.write(submission("01_layernorm", solved=True, edits=BUGS), work / "01_layernorm.ipynb")
    shutil.copy(EXERCISES / "06_gpt2.ipynb", work / "06_gpt2.ipynb")
    port, token, log = free_port(), "browser-test-token", work.parent / f"{work.name}-lab.log"
    args = (f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} "
            f"--LabApp.workspaces_dir={work.parent / 'workspaces'} "
            f"--LabApp.user_settings_dir={work.parent / 'settings'}")
    base = f"http://127.0.0.1:{port}"
    with served(["make", "--no-print-directory", "lab", f"LAB_DIR={work}", f"LAB_ARGS={args}"], log,
                lambda: urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5),
                SERVER_START, cwd=ROOT):
        yield {"base": base, "token": token, "log": log}


@pytest.fixture(scope="session")
def browser():
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright's Python package is missing: run `make setup` (requirements.lock "
                    "pins it).", pytrace=False)
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _open(browser, lab, notebook: str):
    """A fresh browser tab on `notebook`, its kernel started and idle."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(CELL_RUN * 1000)
    page.goto(f"{lab['base']}/lab/tree/{notebook}?reset&token={lab['token']}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=SERVER_START * 1000)
    page.wait_for_selector("#jp-main-statusbar:has-text('Idle')", timeout=SERVER_START * 1000)
    return page


def _run_all(page) -> None:
    page.click(".lm-MenuBar-item:has-text('Run')")
    page.click(".lm-Menu-item[data-command='runmenu:run-all']")


def _wait_for_output(page, text: str, seconds: float):
    """The output holding `text`, scrolled into view (JupyterLab renders only the cells near
    the viewport, so the notebook is scrolled down while waiting)."""
    output = page.locator(f".jp-OutputArea-output:has-text({text!r})")
    deadline = time.time() + seconds
    while not output.count():
        assert time.time() < deadline, f"no output with {text!r} after {seconds} s"
        # Down by half a screen; from the bottom, back to the top.
        page.evaluate("""document.querySelectorAll('.jp-NotebookPanel .jp-WindowedPanel-outer').forEach(e => {
            if (e.scrollTop + e.clientHeight >= e.scrollHeight - 2) e.scrollTop = 0;
            else e.scrollBy(0, e.clientHeight / 2); })""")
        time.sleep(0.5)
    output.first.scroll_into_view_if_needed()
    return output.first


def test_a_failed_check_shows_the_diagnosis_in_the_notebook_and_in_validate(lab, browser):
    page = _open(browser, lab, "01_layernorm.ipynb")
    try:
        _run_all(page)
        _wait_for_output(page, "Progress in 01_layernorm", CELL_RUN)
        error = _wait_for_output(page, DIAGNOSIS, CELL_RUN)
        page.screenshot(path=str(SHOTS / "01_failed_check.png"))
        shown = error.inner_text()
        lines = shown.strip().splitlines()
        assert lines[0].startswith("\N{BALLOT X} LayerNorm") and DIAGNOSIS in " ".join(lines[:2]), shown
        assert "Hint:" not in shown and "Traceback" not in shown, shown    # named: no general hint under it
        outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        assert "Show the fix" in outputs, outputs                           # the corrected line, folded
        assert "graders/" not in outputs and "site-packages" not in outputs, outputs
        assert "0 of 5 points" in outputs and "LayerNorm (5 points, its check fails)" in outputs

        page.click(".validate-button")
        dialog = page.locator(".jp-Dialog:has-text('Validation Results')")
        dialog.wait_for(timeout=VALIDATE * 1000)
        page.screenshot(path=str(SHOTS / "01_validate_dialog.png"))
        text = dialog.inner_text()
        assert DIAGNOSIS in text and "Show the fix:" in text and "graders/" not in text, text   # one text, whole
        # Without scrolling: the diagnosis lies inside the viewport and the dialog, and no box
        # in the dialog needs a scrollbar (nbgrader's error box does not wrap long lines).
        clipped = page.evaluate("""(needle) => {
            const dialog = document.querySelector('.jp-Dialog-content');
            const walker = document.createTreeWalker(dialog, NodeFilter.SHOW_TEXT);
            let node, found = null;
            while ((node = walker.nextNode())) if (node.textContent.includes(needle)) { found = node; break; }
            if (!found) return 'diagnosis not found';
            const range = document.createRange(); range.selectNodeContents(found);
            const r = range.getBoundingClientRect(), d = dialog.getBoundingClientRect();
            if (r.top < d.top || r.bottom > d.bottom || r.left < d.left || r.right > d.right
                || r.bottom > window.innerHeight || r.right > window.innerWidth) return 'outside the dialog';
            for (const el of dialog.querySelectorAll('*'))
                if (el.scrollHeight > el.clientHeight + 2 || el.scrollWidth > el.clientWidth + 2) {
                    const style = getComputedStyle(el);
                    const overflows = [style.overflow, style.overflowX, style.overflowY];
                    if (['auto', 'scroll', 'hidden'].some(v => overflows.includes(v)))
                        return 'a box needs scrolling: ' + el.tagName + '.' + el.className;
                }
            return '';
        }""", "sample variance")
        assert clipped == "", clipped
        page.keyboard.press("Escape")
    finally:
        page.close()


def test_run_all_runs_an_untouched_notebook_to_the_end(lab, browser):
    page = _open(browser, lab, "06_gpt2.ipynb")
    try:
        _run_all(page)
        last = _wait_for_output(page, "Progress in 06_gpt2", CELL_RUN)
        page.screenshot(path=str(SHOTS / "06_run_all_end.png"))
        points = sum(cells.points_of(c) for c in cells.test_cells(cells.source_notebook("06_gpt2")))
        assert f"0 of {points:g} points" in last.inner_text()
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        assert prompts and prompts[-1].strip() not in ("[ ]:", "[*]:"), prompts   # the last cell ran
        outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        assert "Traceback" not in outputs and "graders/" not in outputs, outputs
        assert "Skipped: this cell needs your" in outputs
    finally:
        page.close()


def test_the_lab_offers_no_instructor_tool_and_logs_no_error(lab, browser):
    page = _open(browser, lab, "01_layernorm.ipynb")
    try:
        page.screenshot(path=str(SHOTS / "lab_menus.png"))
        menus = page.locator(".lm-MenuBar-item").all_inner_texts()
        assert "Nbgrader" not in menus and "Run" in menus, menus
        assert page.locator("#nbgrader-create_assignemnt").count() == 0   # nbgrader's spelling
        assert page.locator(".validate-button").count() == 1
    finally:
        page.close()
    assert urllib.request.urlopen(f"{lab['base']}/nbgrader_version?version=0.9.6&token="
                                  f"{lab['token']}", timeout=10).status == 200
    log = lab["log"].read_text()
    assert not [line for line in log.splitlines() if line.startswith("[E ")], log[-3000:]
