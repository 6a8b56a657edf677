"""The kernel a submission runs in during grading: an IPython kernel under a memory cap.

Launched by the grading harness as `python -m graders.sandbox_kernel -f CONNECTION_FILE`, with
a scrubbed environment and its own working folder. A memory bomb then fails inside the kernel
(MemoryError, or the kernel dies) and costs only the cell that ran it.
"""
import os
import resource
import sys

MEMORY_ENV = "GPT2_COURSE_SANDBOX_MEMORY_MB"


def main() -> None:
    limit = int(os.environ.get(MEMORY_ENV, "8192")) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from ipykernel import kernelapp

    kernelapp.launch_new_instance(argv=sys.argv[1:])


if __name__ == "__main__":
    main()
