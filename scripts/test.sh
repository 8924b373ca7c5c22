#!/usr/bin/env bash
# Build everything (CUDA targets too when nvcc is present) and run the tests:
# the CPU suite, the ml_dtypes cross-check, the CLI contract (also against the
# ASan/UBSan build), the fuzz targets' regression inputs and 60 s of fuzzing
# each, the GPU tests (which skip with a message when there is no GPU), an
# engine's CMake build against the installed package, then pip install . and
# the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
fuzz_dir=""
if command -v clang++ >/dev/null; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j "$jobs"
  fuzz_dir="$PWD/build/fuzz"
fi
cmake --preset cpu -DNVFP4KV_FUZZ_DIR="$fuzz_dir" >/dev/null
cmake --build --preset cpu -j "$jobs"
ctest --preset cpu -j "$jobs"

# The Python package as a user installs it (docs/python.md), then its tests; the
# GPU ones say why they are skipped where there is no GPU.
echo "=== pip install . (CUDA kernels where nvcc is found)"
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 |
  { grep -v "Running pip as the 'root' user" || true; }
(cd /tmp && python3 -c "import nvfp4kv; print(nvfp4kv.build_info)")
python3 -m pytest tests/python -rs -q -p no:cacheprovider
