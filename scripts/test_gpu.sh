#!/usr/bin/env bash
# Build the Vulkan variant of llama-cpp-python in a second virtual environment and run the tests marked `gpu`
# on the Vulkan device there is: on a machine without a GPU, Mesa's software device (lavapipe), which ollapy
# makes visible itself (ggml skips CPU-type Vulkan devices; see ollapy/engine/backend/vulkan.py).
# Usage: bash scripts/test_gpu.sh [pytest args...]        (as root on Debian 12: installs packages with apt)
# Env: VENV (default .venv-vulkan), PYTHON (default python3), OLLAPY_TEST_MODELS (model cache dir).
#
# Measured on this project's 2-core machine (README, "GPU"): the Vulkan wheel builds once per machine (about
# 20 minutes; cached under ~/.cache/ollapy/wheels, keyed by the flags); the device tests then take minutes,
# since lavapipe decodes about 0.5 tokens/s.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv-vulkan}"
start=$(date +%s)
# apt packages + Debian 13's Vulkan/SPIR-V headers (cached); prints OLLAPY_CMAKE_ARGS="..."
flags=$(bash scripts/install_vulkan_deps.sh)
eval "export $flags"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
nice -n 19 bash scripts/install_llama.sh "$VENV/bin/python"
"$VENV/bin/python" -m pip install -q -e '.[dev,server]'
"$VENV/bin/python" scripts/fetch_test_models.py
"$VENV/bin/python" -m ollapy.cli.main info | grep -E '^(gpu offload|vulkan):|^  Vulkan' || true
"$VENV/bin/python" -m ollapy.cli.main info --json | "$VENV/bin/python" -c \
  'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["gpu_offload"] else "error: no Vulkan device (is mesa-vulkan-drivers installed?)")'
echo "setup: $(( $(date +%s) - start )) s" >&2
t0=$(date +%s)
rc=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m gpu "$@" || rc=$?
echo "gpu tests: $(( $(date +%s) - t0 )) s" >&2
exit $rc
