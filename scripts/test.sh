#!/usr/bin/env bash
# Build everything (CUDA targets too when nvcc is present) and run the tests:
# the CPU suite, the ml_dtypes cross-check, a 60 s libFuzzer run, and the GPU
# tests, which skip with a message when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
fuzzer=""
if command -v clang++ >/dev/null; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j "$jobs"
  fuzzer="$PWD/build/fuzz/tests/fuzz/fuzz_layout"
fi
cmake --preset cpu -DNVFP4KV_FUZZER="$fuzzer" >/dev/null
cmake --build --preset cpu -j "$jobs"
ctest --preset cpu -j "$jobs"
