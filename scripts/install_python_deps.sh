#!/usr/bin/env bash
# Creates the virtual environment and installs asr-rl with its dev extra. Re-run only when
# pyproject.toml changes (the Makefile stamps it).
set -euo pipefail
PYTHON=${1:-python3.11}
VENV=${2:-.venv}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "[install] pip: asr-rl[dev] into $VENV"
"$VENV/bin/pip" install -q --upgrade pip
# torch is pinned to the CPU build that lies on this machine kind's disk; see pyproject.toml.
"$VENV/bin/pip" install -q -e ".[dev]"
