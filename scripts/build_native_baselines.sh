#!/usr/bin/env bash
# Build llama.cpp's own llama-batched-bench, llama-bench, llama-server, llama-embedding and llama-speculative-simple from the llama-cpp-python source
# distribution ollapy runs on (so the same llama.cpp version), as the native baselines of
# scripts/bench_engine.py, scripts/bench_server.py and scripts/bench_embed.py. Build outputs stay outside
# the repository.
#
#   bash scripts/build_native_baselines.sh [DEST] [TARGET...]   # default DEST: ~/.cache/ollapy/native
#                                                                # default TARGETs: all five tools
#   export PATH="$DEST/build/bin:$PATH"                # the benchmarks then find them
#
# A long build (llama-server is most of it). Set PYTHON to the interpreter ollapy uses, and
# LLAMA_CPP_PYTHON_VERSION to name the version without it installed, and
# NATIVE_CMAKE_ARGS to extra CMake flags (e.g. "-DGGML_CUDA=on" for a GPU build; use another DEST for it).
set -euo pipefail
dest="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/ollapy/native}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-server llama-batched-bench llama-bench llama-embedding llama-speculative-simple)
py="${PYTHON:-python3}"
ver="${LLAMA_CPP_PYTHON_VERSION:-$("$py" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")}"
mkdir -p "$dest"
if [ ! -f "$dest/src/vendor/llama.cpp/CMakeLists.txt" ]; then
  "$py" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$dest/sdist"
  rm -rf "$dest/src" && mkdir -p "$dest/src"
  tar -xzf "$dest/sdist/llama_cpp_python-$ver.tar.gz" -C "$dest/src" --strip-components=1
fi
cmake -S "$dest/src/vendor/llama.cpp" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON ${NATIVE_CMAKE_ARGS:-}
cmake --build "$dest/build" -j"$(nproc)" --target "${targets[@]}"
echo "built llama.cpp $ver tools in $dest/build/bin; use: export PATH=\"$dest/build/bin:\$PATH\""
