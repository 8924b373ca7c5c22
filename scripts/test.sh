#!/usr/bin/env bash
# Build everything (CUDA targets too when nvcc is present) and run the tests:
# the CPU suite, the ml_dtypes cross-check, the CLI contract (also against the
# ASan/UBSan build), the fuzz targets' regression inputs and 60 s of fuzzing
# each, the GPU tests (which skip with a message when there is no GPU), an
# engine's CMake build against the installed package, the demo script, then pip
# install . in a fresh venv and the Python tests.
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

# The demo as a newcomer runs it: its own output first, the build's in a log.
echo "=== scripts/demo.sh --cpu-only"
scripts/demo.sh --cpu-only --tokens 64 >build/demo.out 2>&1 || { cat build/demo.out; exit 1; }
if [ "$(sed -n 2p build/demo.out)" != "nvfp4kv demo" ] || grep -qE "Building|ptxas|warning" build/demo.out; then
  echo "FAIL: scripts/demo.sh printed more than one line before the demo, or build output"; head -5 build/demo.out; exit 1
fi

# The Python package as a user installs it (docs/python.md): pip install . in a fresh venv,
# its build requirements from PyPI and not the system's nlohmann-json headers, showing the
# build's progress; then its tests, with the nvfp4kv command it put on the venv's PATH. The
# GPU ones say why they are skipped where there is no GPU. Its kernels are built for sm_90a
# only: the preset build above compiled them for every architecture, and doing that twice
# took a third of the run on 2 cores.
echo "=== pip install -v . into a fresh venv (CUDA kernels where nvcc is found)"
rm -rf build/venv
python3 -m venv --system-site-packages build/venv
if ! CMAKE_ARGS="-DNVFP4KV_SYSTEM_JSON=OFF -DCMAKE_CUDA_ARCHITECTURES=90a" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" build/venv/bin/python -m pip install -v . 2>&1 |
  { grep -E "^ *\[ *[0-9]+(/[0-9]+|%)\]|nvfp4kv:|nlohmann|Successfully installed|rror" | cut -c1-160 || true; }; then
  echo "FAIL: pip install . in a fresh venv"; exit 1
fi
venv_python="$PWD/build/venv/bin/python"
(cd /tmp && "$venv_python" -c "import nvfp4kv; print(nvfp4kv.build_info)")
build/venv/bin/nvfp4kv --version
build/venv/bin/python -m pytest tests/python -rs -q -p no:cacheprovider
