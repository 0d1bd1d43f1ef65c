#!/usr/bin/env bash
# Install llama-cpp-python into a virtual environment, built with llama.cpp's RPC backend on.
# Usage: bash scripts/install_llama.sh VENV_PYTHON
# Env:
#   OLLAPY_LLAMA_VERSION  llama-cpp-python version to build (default 0.3.36)
#   OLLAPY_CMAKE_ARGS     extra CMake flags, e.g. "-DGGML_CUDA=ON", "-DGGML_METAL=ON", "-DGGML_VULKAN=ON"
#
# pip's wheel cache is keyed on the source archive, not on CMAKE_ARGS: a wheel built earlier without RPC
# would be reused silently. So the wheel is built with --no-cache-dir into a folder of ollapy's own cache
# whose name carries a hash of the flags, and the installed library is checked for libggml-rpc afterwards.
set -euo pipefail
PY="${1:?usage: install_llama.sh VENV_PYTHON}"
VERSION="${OLLAPY_LLAMA_VERSION:-0.3.36}"
ARGS="-DGGML_RPC=ON -DGGML_LLAMAFILE=OFF ${OLLAPY_CMAKE_ARGS:-}"
has_rpc() {
  "$PY" - "$VERSION" <<'PYEOF'
import importlib.metadata as md, pathlib, sys
try:
    dist = md.distribution("llama-cpp-python")
except md.PackageNotFoundError:
    sys.exit(1)
if dist.version != sys.argv[1]:
    sys.exit(1)
libs = [f for f in dist.files or [] if "libggml-rpc" in f.name]
sys.exit(0 if libs and pathlib.Path(dist.locate_file(libs[0])).exists() else 1)
PYEOF
}
KEY=$(printf '%s %s' "$VERSION" "$ARGS" | sha1sum | cut -c1-12)
MARK="$(dirname "$PY")/../.ollapy-llama-build"  # which build this venv has: version + flags hash
if [ "$(cat "$MARK" 2>/dev/null || true)" = "$KEY" ] && has_rpc; then
  exit 0
fi
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/ollapy/wheels/llama-cpp-python-$VERSION-$KEY"
WHEEL=$(ls "$CACHE"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$WHEEL" ]; then
  echo "building llama-cpp-python $VERSION with CMAKE_ARGS='$ARGS' (on 2 cores about 6 min for a CPU build, 20+ for Vulkan; once per machine)" >&2
  TMP="$CACHE.partial.$$"
  rm -rf "$TMP" && mkdir -p "$TMP"
  CMAKE_ARGS="$ARGS" "$PY" -m pip wheel -q --no-cache-dir --no-deps -w "$TMP" "llama-cpp-python==$VERSION"
  mkdir -p "$CACHE"
  mv "$TMP"/llama_cpp_python-*.whl "$CACHE"/
  rm -rf "$TMP"
  WHEEL=$(ls "$CACHE"/llama_cpp_python-*.whl | head -n1)
fi
"$PY" -m pip install -q --force-reinstall --no-deps "$WHEEL"
"$PY" -m pip install -q "llama-cpp-python==$VERSION"
if ! has_rpc; then
  echo "error: $WHEEL has no libggml-rpc; delete $CACHE and run again" >&2
  exit 1
fi
echo "$KEY" > "$MARK"
