#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build llama-cpp-python with CUDA into a second virtual environment, run the
# tests marked `gpu` on the GPU, then print ollapy's single-stream decode tokens/s next to llama.cpp's own
# llama-batched-bench built with CUDA from the same llama.cpp tree (the llama-cpp-python sdist ollapy runs on).
# Usage: bash scripts/gpu_smoke.sh [pytest args...]
# Needs: nvidia-smi and the CUDA toolkit (nvcc on PATH or in /usr/local/cuda/bin), cmake, a C++ compiler.
# Env: VENV (default .venv-cuda), PYTHON (default python3), CUDA_ARCH (CMAKE_CUDA_ARCHITECTURES; default:
#      native, i.e. the GPUs of this machine), TOKENS (decode tokens per figure, default 256).
# Both builds compile llama.cpp's CUDA kernels: expect tens of minutes each, once per machine (cached).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv-cuda}"
TOKENS="${TOKENS:-256}"
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "error: no NVIDIA GPU here (nvidia-smi)" >&2; exit 1; }
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "error: nvcc not found: install the CUDA toolkit" >&2; exit 1; }
cuda_flags="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-native}"

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
OLLAPY_CMAKE_ARGS="$cuda_flags" bash scripts/install_llama.sh "$VENV/bin/python"
"$VENV/bin/python" -m pip install -q -e '.[dev,server]'
"$VENV/bin/python" scripts/fetch_test_models.py
echo "== build: $(( $(date +%s) - start )) s"
"$VENV/bin/python" -m ollapy.cli.main info | grep -E '^gpu offload:|^  CUDA'
"$VENV/bin/python" -m ollapy.cli.main info --json | "$VENV/bin/python" -c \
  'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["gpu_offload"] else "error: ollapy sees no GPU device")'

echo "== gpu tests"
t0=$(date +%s)
rc=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m gpu "$@" || rc=$?
echo "== gpu tests: $(( $(date +%s) - t0 )) s, exit $rc"

echo "== decode tokens/s, SmolLM2-135M Q4_1, every layer on the GPU, flash attention on, 1 sequence"
model=$("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "scripts"); import fetch_test_models as f; m = f.MODELS[0]; print(f.default_dir() / m.filename)')
native="${XDG_CACHE_HOME:-$HOME/.cache}/ollapy/native-cuda"
PYTHON="$VENV/bin/python" NATIVE_CMAKE_ARGS="$cuda_flags" bash scripts/build_native_baselines.sh "$native" llama-batched-bench
best_native=0
for _ in 1 2 3; do
  v=$("$native/build/bin/llama-batched-bench" -m "$model" -ngl 99 -fa on -c 2048 -b 512 -ub 512 -npp 16 \
      -ntg "$TOKENS" -npl 1 --output-format jsonl 2>/dev/null |
      "$VENV/bin/python" -c 'import json,sys; print(max(json.loads(l)["speed_tg"] for l in sys.stdin if "speed_tg" in l))')
  best_native=$("$VENV/bin/python" -c "print(max($best_native, $v))")
done
best_ollapy=0
for _ in 1 2 3; do
  v=$("$VENV/bin/python" -m ollapy.cli.main run "$model" --no-cache --verbose -o temperature=0 -o flash_attn=on \
      -o num_ctx=2048 -o "num_predict=$TOKENS" "Count from 1 to 1000: 1, 2, 3," 2>&1 >/dev/null |
      sed -n 's/^eval rate: *\([0-9.]*\) tokens\/s/\1/p')
  best_ollapy=$("$VENV/bin/python" -c "print(max($best_ollapy, ${v:-0}))")
done
echo "llama-batched-bench: $best_native tok/s   ollapy run: $best_ollapy tok/s   ratio: $("$VENV/bin/python" -c "print(round($best_ollapy / $best_native, 3))")"
exit $rc
