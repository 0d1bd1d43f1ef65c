#!/usr/bin/env bash
# Build the Vulkan variant of llama-cpp-python in a second virtual environment and run the tests marked `gpu`
# on the Vulkan device there is: on a machine without a GPU, Mesa's software device (lavapipe). ollapy keeps
# every layer off a software device unless asked (docs/gpu.md), so the suite asks for it as a user would:
# GGML_VK_VISIBLE_DEVICES set to its index (unless the variable is already set); a real GPU needs no asking.
# Usage: bash scripts/test_gpu.sh [pytest args...]        (as root on Debian 12: installs packages with apt)
#        bash scripts/test_gpu.sh --if-cached [pytest args...]
#            the same, but only when the Vulkan wheel for these flags is already in the wheel cache; otherwise
#            one line saying why it skipped, and exit 0 (.ci/run: a fresh machine does not pay the build)
# Prints a last line: `gpu suite: DEVICE: N passed, N failed, N skipped in S s`; exits non-zero on a failure.
# Env: VENV (default .venv-vulkan), PYTHON (default python3), OLLAPY_TEST_MODELS (model cache dir).
#
# Costs (figures: docs/benchmarks.md): the Vulkan wheel builds once per machine (a long build; cached under
# ~/.cache/ollapy/wheels, keyed by the flags); the device tests then take minutes, since lavapipe decodes far
# slower than the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv-vulkan}"
start=$(date +%s)
if [ "${1:-}" = "--if-cached" ]; then
  shift
  eval "export $(bash scripts/install_vulkan_deps.sh --print-flags)"
  wheels=$(bash scripts/install_llama.sh --wheel-dir)
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "gpu suite: skipped: no Vulkan wheel for these flags in $wheels (bash scripts/test_gpu.sh builds it, once)"
    exit 0
  fi
fi
# apt packages + Debian 13's Vulkan/SPIR-V headers (cached); prints OLLAPY_CMAKE_ARGS="..."
flags=$(bash scripts/install_vulkan_deps.sh)
eval "export $flags"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
nice -n 19 bash scripts/install_llama.sh "$VENV/bin/python"
"$VENV/bin/python" -m pip install -q -e '.[dev,server]'
"$VENV/bin/python" scripts/fetch_test_models.py
if [ -z "${GGML_VK_VISIBLE_DEVICES+set}" ]; then
  soft=$("$VENV/bin/python" -c 'from ollapy.engine.backend.vulkan import software_device as f; d = f(); print("" if d is None else d[0])')
  if [ -n "$soft" ]; then
    export GGML_VK_VISIBLE_DEVICES="$soft"
    echo "the only Vulkan device is a software one: the suite opts in with GGML_VK_VISIBLE_DEVICES=$soft" >&2
  fi
fi
"$VENV/bin/python" -m ollapy.cli.main info | grep -E '^(gpu offload|vulkan):|^  Vulkan' || true
device=$("$VENV/bin/python" -m ollapy.cli.main info --json | "$VENV/bin/python" -c '
import json, sys
d = json.load(sys.stdin)
gpus = [x["name"] + " (" + x["description"] + ")" for x in d["devices"] if x["type"] in ("gpu", "igpu")]
print(gpus[0] if d["gpu_offload"] and gpus else "")')
if [ -z "$device" ]; then
  echo "error: no GPU device to offload to (is mesa-vulkan-drivers installed? see ollapy info)" >&2
  exit 1
fi
echo "setup: $(( $(date +%s) - start )) s" >&2
t0=$(date +%s)
xml=$(mktemp --suffix=.xml)
trap 'rm -f "$xml"' EXIT
rc=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m gpu --junitxml="$xml" "$@" || rc=$?
secs=$(( $(date +%s) - t0 ))
counts=$("$VENV/bin/python" -c '
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
s = root if root.tag == "testsuite" else root.find("testsuite")
n = {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
failed = n["failures"] + n["errors"]
print("%d passed, %d failed, %d skipped" % (n["tests"] - failed - n["skipped"], failed, n["skipped"]))' "$xml" 2>/dev/null ||
  echo "no test report (pytest exit $rc)")
echo "gpu suite: $device: $counts in $secs s"
exit $rc
