"""`make lab` is the learner's lab: JupyterLab on exercises/ with nbgrader's Validate button and
none of its instructor tools, which cannot work on a learner's machine (the browser test,
tests/learner/test_browser.py, looks at the page itself)."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTOR_PLUGINS = {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:assignment-list",
                      "@jupyter/nbgrader:course-list", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:menu"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=10).status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.slow
def test_make_lab_serves_the_exercises_with_validate_and_no_instructor_tools(tmp_path):
    port = _free_port()
    args = (f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token=testtoken "
            f"--LabApp.workspaces_dir={tmp_path / 'workspaces'} --LabApp.user_settings_dir={tmp_path / 'settings'}")
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        lab = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT,
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base, deadline, listing = f"http://127.0.0.1:{port}", time.time() + 120, None
        while time.time() < deadline and listing is None:
            try:
                listing = json.load(urllib.request.urlopen(f"{base}/api/contents?token=testtoken", timeout=5))
            except OSError:
                assert lab.poll() is None, log.read_text()[-2000:]
                time.sleep(1)
        assert listing is not None, "JupyterLab did not answer within 120 s"
        names = {item["name"] for item in listing["content"]}
        assert "01_layernorm.ipynb" in names, names
        # nbgrader's Validate button works (its server extension answers) ...
        assert _status(f"{base}/nbgrader_version?version=0.9.6&token=testtoken") == 200
        # ... and its instructor tools are off: no formgrader page, no assignment or course list,
        # no Create Assignment sidebar or Nbgrader menu in the page.
        assert _status(f"{base}/formgrader?token=testtoken") == 404
        assert _status(f"{base}/assignments?course_id=x&token=testtoken") == 404
        assert _status(f"{base}/courses?token=testtoken") == 404
        assert _status(f"{base}/formgraders?token=testtoken") == 404
        page = urllib.request.urlopen(f"{base}/lab?token=testtoken", timeout=30).read().decode()
        config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                      page, re.S).group(1))
        assert INSTRUCTOR_PLUGINS <= set(config["disabledExtensions"]), config["disabledExtensions"]
        assert "@jupyter/nbgrader:validate-assignment" not in config["disabledExtensions"]
        # Nothing went wrong while starting (nbgrader's formgrader logged an [E] line every start).
        assert not [line for line in log.read_text().splitlines() if line.startswith("[E ")], log.read_text()
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)
