#!/usr/bin/env bash
# The Python package on the lent GPU: install from this tree (the device has
# scikit-build-core, nanobind and torch but no network), run the whole pytest
# suite (the GPU tests included) and the integration figures into $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
echo "=== pip install ($(date +%T))"
# The image's CXX (/opt/gcc) links libstdc++ statically: beside torch the extension then
# crashed in iostreams (run 8). The system compiler shares torch's libstdc++.
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps \
  -C cmake.define.NVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  -C build-dir=build/python . > "$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
(cd /tmp && python3 -c 'import nvfp4kv; print(nvfp4kv.build_info, nvfp4kv.cuda_available())')
echo "=== pytest ($(date +%T))"
PYTHONUNBUFFERED=1 timeout 300 python3 -m pytest tests/python -rs -q -p no:cacheprovider \
  --ignore=tests/python/test_integration.py > "$OUT/pytest.log" 2>&1
echo "pytest rc $?"; tail -25 "$OUT/pytest.log"
echo "=== integration figures ($(date +%T))"
PYTHONUNBUFFERED=1 timeout 240 python3 tests/python/integration.py --out "$OUT/2026-12-02-h200-python-integration.md" 2>&1 | tail -40
echo "=== integration assertions ($(date +%T))"
PYTHONUNBUFFERED=1 timeout 240 python3 -m pytest tests/python/test_integration.py -rs -q -p no:cacheprovider 2>&1 | tail -15
