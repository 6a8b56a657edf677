"""The grading kernel's launcher (graders.integrity.sandbox_kernel): what it costs before it has
confined the kernel."""
import subprocess

from graders.integrity.sandbox_kernel import launcher_argv


def test_the_launcher_imports_neither_torch_nor_the_graders_before_it_confines():
    """Every kernel of every grading starts with it: up to the confinement, only the standard
    library (its --help parses the same arguments a kernel's start does, and exits there)."""
    python, launcher = launcher_argv()
    done = subprocess.run([python, "-X", "importtime", launcher, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--session" in done.stdout, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert imported and not imported & {"torch", "graders", "numpy", "ipykernel"}, sorted(imported)
