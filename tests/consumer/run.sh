#!/usr/bin/env bash
# Build tests/consumer the ways an engine would and run its programs (docs/api.md's
# examples): against nvfp4kv installed from BUILD_DIR, and as a subproject of
# the checkout (where nvcc is found: compiled for "80;90a", an engine's arch list
# with a target the kernels do not support, which must build).
# usage: run.sh SOURCE_DIR BUILD_DIR WORK_DIR. The GPU program (api_example) is run
# by its own test (tests/CMakeLists.txt), which skips without a GPU.
set -euo pipefail
src=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" --component devel >/dev/null
echo "--- installed package: $(cd "$work/prefix" && find . -name 'nvfp4kvConfig.cmake' -o -name '*.a' | sort | tr '\n' ' ')"
cmake -S "$src/tests/consumer" -B "$work/installed" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >"$work/installed.log"
cmake --build "$work/installed" -j 2 >>"$work/installed.log" || { tail -30 "$work/installed.log"; exit 1; }
"$work/installed/layout_example"
if command -v nvcc >/dev/null; then
  archs="80;90a"
else
  archs=""
fi
cmake -S "$src/tests/consumer" -B "$work/subproject" -DNVFP4KV_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=Release \
  ${archs:+-DCMAKE_CUDA_ARCHITECTURES="$archs"} ${NVFP4KV_EXTRA_INCLUDE:+-DNVFP4KV_EXTRA_INCLUDE="$NVFP4KV_EXTRA_INCLUDE"} \
  >"$work/subproject.log"
cmake --build "$work/subproject" -j 2 >>"$work/subproject.log" 2>&1 || { grep -B2 -A8 -E "error|Error" "$work/subproject.log" | head -60; exit 1; }
echo "--- subproject build${archs:+ for CUDA architectures $archs}: ok"
"$work/subproject/layout_example" >/dev/null
