#!/usr/bin/env bash
# Install llama-cpp-python into a virtual environment, built with llama.cpp's RPC backend on.
# Usage: bash scripts/install_llama.sh VENV_PYTHON
#        bash scripts/install_llama.sh --wheel-dir     (prints the folder the wheel for these flags is cached in)
# Env:
#   OLLAPY_LLAMA_VERSION  llama-cpp-python version to build (default 0.3.36)
#   OLLAPY_CMAKE_ARGS     extra CMake flags, e.g. "-DGGML_CUDA=ON", "-DGGML_METAL=ON", "-DGGML_VULKAN=ON"
#
# pip's wheel cache is keyed on the source archive, not on CMAKE_ARGS: a wheel built earlier without RPC
# would be reused silently. So the wheel is built with --no-cache-dir into a folder of ollapy's own cache
# whose name carries a hash of the flags, and the installed library is checked for libggml-rpc afterwards.
#
# One patch to the vendored llama.cpp (the source distribution is unpacked and built from its folder):
# ggml-cpu's llamafile_sgemm (tinyBLAS) declines one-row products ("only enable sgemm for prompt processing",
# n < 2), which then go to vec_dot. Whether that changes a row's bits depends on the type (read in
# ggml-cpu/llamafile/sgemm.cpp and ggml-cpu/arch/x86/quants.c, and measured by
# tests/test_speculation.py::test_a_verified_row_gives_the_logits_of_a_one_row_step):
# - Q8_0, Q4_0, Q5_0 on x86 with AVX2+FMA: tinyBLAS_Q0_AVX and ggml_vec_dot_qX_0_q8_0 do the same operations
#   per output element (one fp32 accumulator per block lane, fma of the scale product with the int8 dot, the same
#   horizontal sum), so the split is harmless, and vec_dot is the faster one-row kernel (figures:
#   docs/benchmarks.md). These keep the guard.
# - every other type tinyBLAS takes (F32, F16, BF16, IQ4_NL; all types off x86) rounds differently in vec_dot, so
#   one row goes to tinyBLAS too (guard n < 1).
# So a row computes alike alone and beside others (the cache, concurrency and speculative decoding rest on it:
# ollapy/engine/spec/speculator.py), and multi-row batches keep tinyBLAS's speed. The patch is recorded in
# VENV/.ollapy-llama-patches, which ollapy reads (engine/backend/bindings.py, one_row_products_differ), keyed to
# the llama-cpp-python version and the sha256 of the libggml-cpu.so installed here: after a `pip install -U
# llama-cpp-python` the key no longer matches and ollapy treats the build as a stock one.
#
# A second patch (scripts/patch_state_segments.py) adds llama_state_seq_set_data_segments: the prompt cache restores
# a state kept as KV blocks straight from the blocks, without joining them into one buffer first. ollapy looks
# the symbol up and joins the blocks itself where a build lacks it.
set -euo pipefail
PY="${1:?usage: install_llama.sh VENV_PYTHON}"
VERSION="${OLLAPY_LLAMA_VERSION:-0.3.36}"
ARGS="-DGGML_RPC=ON ${OLLAPY_CMAKE_ARGS:-}"
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
PATCHES="sgemm-one-row sgemm-one-row-q0-vec-dot state-seq-segments-2"
write_marker() {  # write_marker VENV_PYTHON FILE: $PATCHES with the installed version and libggml-cpu.so's sha256
  "$1" - "$2" "$PATCHES" <<'PYEOF'
import hashlib, importlib.metadata as md, json, pathlib, sys
dist = md.distribution("llama-cpp-python")
lib = next(f for f in dist.files or [] if f.name == "libggml-cpu.so")
data = pathlib.Path(dist.locate_file(lib)).read_bytes()
pathlib.Path(sys.argv[1]).write_text(json.dumps({"patches": sys.argv[2].split(), "llama_cpp_python": dist.version,
                                                 "library": lib.name, "sha256": hashlib.sha256(data).hexdigest()}) + "\n")
PYEOF
}
KEY=$(printf '%s %s %s' "$VERSION" "$ARGS" "$PATCHES" | sha1sum | cut -c1-12)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/ollapy/wheels/llama-cpp-python-$VERSION-$KEY"
if [ "$PY" = "--wheel-dir" ]; then echo "$CACHE"; exit 0; fi
MARK="$(dirname "$PY")/../.ollapy-llama-build"  # which build this venv has: version + flags hash
if [ "$(cat "$MARK" 2>/dev/null || true)" = "$KEY" ] && has_rpc; then
  write_marker "$PY" "$(dirname "$PY")/../.ollapy-llama-patches"  # this build: (re)key the marker to it
  exit 0
fi
WHEEL=$(ls "$CACHE"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$WHEEL" ]; then
  echo "building llama-cpp-python $VERSION with CMAKE_ARGS='$ARGS' (on 2 cores about 6 min for a CPU build, 20+ for Vulkan; once per machine)" >&2
  TMP="$CACHE.partial.$$"
  rm -rf "$TMP" && mkdir -p "$TMP"
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$TMP/sdist"
  tar -xzf "$TMP"/sdist/llama_cpp_python-*.tar.gz -C "$TMP"
  SRC=$(ls -d "$TMP"/llama_cpp_python-*/ | head -n1)
  "$PY" - "$SRC/vendor/llama.cpp/ggml/src/ggml-cpu/llamafile/sgemm.cpp" <<'PYEOF'
import pathlib, sys
p = pathlib.Path(sys.argv[1])
text = p.read_text()
guard = "    if (n < 2)\n        return false;\n"
if text.count(guard) != 1:
    sys.exit(f"install_llama.sh: the one-row guard of llamafile_sgemm was not found in {p}; update the patch")
p.write_text(text.replace(guard, """\
    // ollapy: a row must compute alike alone and inside a batch. For Q8_0/Q4_0/Q5_0 on AVX2+FMA, vec_dot
    // rounds exactly like tinyBLAS_Q0_AVX and is the faster one-row kernel; every other type goes to tinyBLAS
    // for one row too (vec_dot would round it differently).
#if defined(__AVX2__) && defined(__FMA__)
    if (n < 2 && (Atype == GGML_TYPE_Q8_0 || Atype == GGML_TYPE_Q4_0 || Atype == GGML_TYPE_Q5_0))
        return false;
#endif
    if (n < 1)
        return false;
"""))
PYEOF
  "$PY" "$(dirname "$0")/patch_state_segments.py" "$SRC/vendor/llama.cpp"
  CMAKE_ARGS="$ARGS" "$PY" -m pip wheel -q --no-cache-dir --no-deps -w "$TMP" "$SRC"
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
write_marker "$PY" "$(dirname "$PY")/../.ollapy-llama-patches"
