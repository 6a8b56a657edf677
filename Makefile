# GPT-2 from scratch, autograded. A fresh clone needs only `make lab` (learners) or `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_ARGS ?=

.PHONY: setup lab test exercises bench grade release solutions check
.DEFAULT_GOAL := lab

setup: $(STAMP)

# Re-installs only when the pinned requirements or the project description change.
$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required (set PYTHON=/path/to/python3.11)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

lab: setup
	$(BIN)/jupyter lab --notebook-dir=exercises $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

test: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

exercises: setup
	$(BIN)/python -m graders.course.notebooks exercises

bench: setup
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Instructors: grade the bundled example class, or a real one with SUBMISSIONS=<dir>.
grade: setup
ifeq ($(SUBMISSIONS),)
	$(BIN)/python -m graders.course.example_class build/example_class
	$(BIN)/python -m graders.harness.classroom --submissions build/example_class --out grading/example_class
else
	$(BIN)/python -m graders.harness.classroom --submissions $(SUBMISSIONS) --out grading
endif

release: setup
	$(BIN)/python -m graders.course.notebooks release build/course

solutions: setup
	$(BIN)/python -m graders.course.notebooks run-solutions build/solutions

# Learners: a per-test summary before submitting, e.g. make check NB=exercises/03_attention.ipynb
check: setup
	$(BIN)/python -m graders.harness.check $(NB)
