#!/usr/bin/env bash
# Set up a virtual environment from nothing and run the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
# Env: VENV (default .venv), PYTHON (default python3), OLLAPY_TEST_MODELS (model cache dir).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# llama-cpp-python with llama.cpp's RPC backend (compiled once per machine, minutes; see the script)
bash scripts/install_llama.sh "$VENV/bin/python"
"$VENV/bin/python" -m pip install -q -e '.[dev,server]'
"$VENV/bin/python" scripts/fetch_test_models.py
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
