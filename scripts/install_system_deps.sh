#!/usr/bin/env bash
# Installs the Debian tools the demo corpus needs, only when one is missing.
set -euo pipefail
need=()
for tool in espeak-ng sox flite; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
echo "[install] apt: espeak-ng sox libsox-fmt-all flite (missing: ${need[*]})"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq espeak-ng sox libsox-fmt-all flite >/dev/null
