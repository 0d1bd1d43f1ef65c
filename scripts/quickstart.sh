#!/usr/bin/env bash
# Set up ollapy from nothing and run the main job on a real model:
# pull SmolLM2-135M (from the curated catalogue) and answer a prompt, then the same through a pipe.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# llama-cpp-python with llama.cpp's RPC backend (compiled once per machine, minutes; see the script)
bash scripts/install_llama.sh "$VENV/bin/python"
"$VENV/bin/python" -m pip install -q -e '.[server]'
OLLAPY="$VENV/bin/ollapy"
"$OLLAPY" info
"$OLLAPY" pull smollm2:135m
"$OLLAPY" run smollm2:135m --verbose -o temperature=0 "What is the capital of France? Answer in one word."
echo "Name three primary colors." | "$OLLAPY" run smollm2:135m -o temperature=0 -o num_predict=60
