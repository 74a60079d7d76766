# Two user-facing targets: `make demo` (the main job) and `make test`. Each installs what it needs
# first, idempotently: a second run installs nothing (stamps in .venv/ record what is done).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.asr-rl-installed
SYS_STAMP := $(VENV)/.asr-rl-system-tools
PYTEST_ARGS ?=
# Two workers, one per core (each test process uses one torch thread); a module's tests stay on one
# worker, so its fixtures are built once (docs/testing.md: why not the longest modules first)
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile

.PHONY: demo test test-quick coverage install system-deps clean-install

demo: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash recipes/quickstart.sh

test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop between commits: everything but the end-to-end tests marked slow
test-quick: install
	OMP_NUM_THREADS=1 $(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# `make test` with line coverage of asr_rl/ (the processes pytest runs; not Ray actors or subprocesses)
coverage: install
	OMP_NUM_THREADS=1 $(PY) -m pytest $(XDIST) --cov=asr_rl --cov-report=term:skip-covered $(PYTEST_ARGS)

install: $(STAMP) $(SYS_STAMP)

# System tools for the demo corpus: espeak-ng (speech), sox (resampling, reverb), flite (voices).
$(SYS_STAMP):
	@bash scripts/install_system_deps.sh
	@mkdir -p $(VENV) && touch $@

$(STAMP): pyproject.toml scripts/install_python_deps.sh
	@bash scripts/install_python_deps.sh $(PYTHON) $(VENV)
	@touch $@

clean-install:
	rm -f $(STAMP) $(SYS_STAMP)
