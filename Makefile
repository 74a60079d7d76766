# Two user-facing targets: `make demo` (the main job) and `make test`. Each installs what it needs
# first, idempotently: a second run installs nothing (stamps in .venv/ record what is done).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.asr-rl-installed
SYS_STAMP := $(VENV)/.asr-rl-system-tools
PYTEST_ARGS ?=

.PHONY: demo test install system-deps clean-install

demo: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash recipes/quickstart.sh

test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest $(PYTEST_ARGS)

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
