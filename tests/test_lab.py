"""`make lab` starts JupyterLab on exercises/ with nbgrader's extensions enabled."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_exercises_with_nbgrader():
    port = _free_port()
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token=testtoken"
    lab = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, listing = time.time() + 120, None
        while time.time() < deadline and listing is None:
            try:
                url = f"http://127.0.0.1:{port}/api/contents?token=testtoken"
                listing = json.load(urllib.request.urlopen(url, timeout=5))
            except OSError:
                assert lab.poll() is None, lab.stdout.read().decode()[-2000:]
                time.sleep(1)
        assert listing is not None, "JupyterLab did not answer within 120 s"
        names = {item["name"] for item in listing["content"]}
        assert "01_layernorm.ipynb" in names, names
        # The nbgrader server extension answers (the Validate button uses it).
        url = f"http://127.0.0.1:{port}/formgrader/api/status?token=testtoken"
        status = urllib.request.urlopen(url, timeout=10).status
        assert status == 200
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)
