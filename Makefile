# GPT-2 from scratch, autograded. A fresh clone needs only `make lab` (learners) or `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_ARGS ?=

.PHONY: setup lab lint test test-fast exercises bench grade insights release formgrader solutions check
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

# The learners' lab: JupyterLab on exercises/ (LAB_DIR=... for another folder) with nbgrader's
# Validate button, without its instructor tools (graders/course/learner_lab/ switches them off;
# `make formgrader` has them).
LAB_DIR ?= exercises
LEARNER_LAB := $(CURDIR)/graders/course/learner_lab
lab: setup
	JUPYTER_CONFIG_PATH=$(LEARNER_LAB)$(if $(JUPYTER_CONFIG_PATH),:$(JUPYTER_CONFIG_PATH)) \
	  $(BIN)/jupyter lab --notebook-dir=$(LAB_DIR) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Two tiers, both after the lint. `make test` is the whole suite (what CI runs); `make test-fast`
# leaves out the tests marked slow (kernels, servers, graded training runs) for use between commits.
# --dist loadgroup keeps each xdist_group's tests on the worker that built their shared fixture;
# --no-loadscope-reorder hands out work in the order tests/conftest.py gives (slow tests first).
PYTEST := $(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -q
lint: setup
	$(BIN)/ruff check .

test: setup lint
	$(PYTEST) --durations=30

test-fast: setup lint
	$(PYTEST) -m "not slow" --durations=10

exercises: setup
	$(BIN)/python -m graders.course.notebooks exercises

bench: setup
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Instructors. `make release` makes build/course an nbgrader course (COURSE=... for another).
# `make grade` grades the bundled example class into its own course, build/example_course;
# `make grade SUBMISSIONS=<dir>` grades a class into grading/ (OUT=...) and the course's gradebook,
# optionally only some notebooks: NOTEBOOKS="01_layernorm 03_attention".
# `make formgrader` opens nbgrader's formgrader on the course (COURSE=build/example_course: the example).
COURSE ?= build/course
EXAMPLE_COURSE := build/example_course
GRADE_ARGS = $(if $(NOTEBOOKS),--notebooks $(NOTEBOOKS))

grade: setup
ifeq ($(SUBMISSIONS),)
	$(BIN)/python -m graders.course.notebooks release $(EXAMPLE_COURSE)
	$(BIN)/python -m graders.course.example_class $(EXAMPLE_COURSE)
	$(BIN)/python -m graders.harness.classroom --submissions $(EXAMPLE_COURSE) --course $(EXAMPLE_COURSE) --out $(or $(OUT),grading/example_class) $(GRADE_ARGS)
else
	$(BIN)/python -m graders.harness.classroom --submissions $(SUBMISSIONS) --course $(COURSE) --out $(or $(OUT),grading) $(GRADE_ARGS)
endif

# `make grade` writes OUT/insights.html (what the class got wrong); `make insights OUT=dir` writes it
# again from dir/results.json alone.
insights: setup
	$(BIN)/python -m graders.harness.insights $(or $(OUT),grading)

release: setup
	$(BIN)/python -m graders.course.notebooks release $(COURSE)

formgrader: setup
	GPT2_COURSE_NBGRADER_ROOT=$(COURSE) $(BIN)/jupyter lab --ServerApp.default_url=/formgrader $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

solutions: setup
	$(BIN)/python -m graders.course.notebooks run-solutions build/solutions

# Learners: a per-test summary before submitting, e.g. make check NB=exercises/03_attention.ipynb
check: setup
	$(BIN)/python -m graders.harness.check $(NB)
