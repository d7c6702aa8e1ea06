# Front door. `make demo` and `make test` work on a clean clone with only python3
# (>= 3.11) and a package registry: the virtualenv is created on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_WORKLOAD := examples/demo-24.csv
DEMO_CLUSTER  := 4x4

.PHONY: demo test test-slow lint clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps: reinstall only when pyproject.toml changes (the install is editable).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/deepboot simulate --workload $(DEMO_WORKLOAD) --policy pollux --cluster $(DEMO_CLUSTER)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

# pytest exits 5 when no test is selected; that is not a failure here.
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slow || [ $$? -eq 5 ]

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy deepboot/core deepboot/perf deepboot/policies deepboot/scheduler

clean-venv:
	rm -rf $(VENV)
