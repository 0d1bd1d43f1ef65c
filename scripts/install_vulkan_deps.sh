#!/usr/bin/env bash
# Install what a Vulkan build of llama.cpp and Mesa's software Vulkan device (lavapipe) need, on Debian 12.
# Usage: bash scripts/install_vulkan_deps.sh        (as root; prints the OLLAPY_CMAKE_ARGS to build with)
#        bash scripts/install_vulkan_deps.sh --print-flags    (only prints them: installs and fetches nothing)
#
# Debian 12's libvulkan-dev (1.3.239) is too old for the llama.cpp that llama-cpp-python 0.3.36 vendors
# (ggml-vulkan.cpp fails on vk::LayerSettingEXT). Debian 13's libvulkan-dev (1.4.309) and spirv-headers work
# with Debian 12's glslc and Mesa. So: apt installs the Debian 12 packages (glslc, the Mesa driver, the loader
# and its .so link), and the newer headers are fetched with `apt-get download` against a trixie source list of
# our own (-o Dir::Etc::sourcelist / Dir::State::Lists: the system's sources and lists are left alone) and
# unpacked with `dpkg -x` into a cache folder. A second run finds both in place and only prints the flags.
# Env: OLLAPY_VULKAN_SDK  where the headers go (default ${XDG_CACHE_HOME:-~/.cache}/ollapy/vulkan-sdk)
set -euo pipefail
SDK="${OLLAPY_VULKAN_SDK:-${XDG_CACHE_HOME:-$HOME/.cache}/ollapy/vulkan-sdk}"
APT_PKGS=(glslc mesa-vulkan-drivers libvulkan1 libvulkan-dev)
TRIXIE_PKGS=(libvulkan-dev spirv-headers)
print_flags() {
  echo "OLLAPY_CMAKE_ARGS=\"-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$SDK/usr/include -DCMAKE_CXX_FLAGS=-I$SDK/usr/include -DSPIRV-Headers_DIR=$SDK/usr/share/cmake/SPIRV-Headers\""
}
if [ "${1:-}" = "--print-flags" ]; then print_flags; exit 0; fi

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "apt: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f "$SDK/.done" ]; then
  echo "fetching Debian 13 (trixie) ${TRIXIE_PKGS[*]} into $SDK" >&2
  work="$SDK.partial.$$"
  rm -rf "$work" && mkdir -p "$work/lists/partial" "$work/debs"
  echo "deb http://deb.debian.org/debian trixie main" > "$work/trixie.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$work/trixie.list" -o "Dir::Etc::sourceparts=-"
            -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
            -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download "${TRIXIE_PKGS[@]}" >/dev/null)
  mkdir -p "$work/root"
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done
  test -f "$work/root/usr/include/vulkan/vulkan.hpp"
  rm -rf "$SDK"
  mv "$work/root" "$SDK"
  rm -rf "$work"
  (cd "$SDK" && ls usr/include) > "$SDK/.done"
fi

print_flags
