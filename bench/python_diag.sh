#!/usr/bin/env bash
# Diagnose the Python extension on the GPU machine: which build tools it has, whether a C++
# exception crosses into Python (native backtrace under cuda-gdb if it crashes), and the same
# with nanobind carried in .whl/ (the version the package was developed with); the build that
# survives then runs pytest and the integration. Output under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}; mkdir -p "$OUT"; cd "$(dirname "$0")/.."
python3 -m pip show nanobind scikit-build-core numpy 2>/dev/null | grep -E "^(Name|Version)"
probe='import numpy as np, nvfp4kv
try:
    nvfp4kv.load("no-such-layout")
except Exception as e:
    print("caught", type(e).__name__)'
build() {  # build dir
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps --force-reinstall \
    -C cmake.define.NVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
    -C build-dir="$1" . > "$OUT/pip-$(basename "$1").log" 2>&1 || tail -20 "$OUT/pip-$(basename "$1").log"
}
ok=""
echo "=== device nanobind"; build build/py-device
(cd /tmp && timeout 60 python3 -c "$probe") && ok=device
if [ -z "$ok" ]; then
  (cd /tmp && timeout 90 cuda-gdb -batch -ex run -ex bt --args python3 -c "$probe" 2>&1 | grep -E "^#|signal" | head -25)
  echo "=== carried nanobind"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/nanobind-*.whl && export PYTHONPATH=/tmp/site
  build build/py-carried
  (cd /tmp && timeout 60 python3 -c "$probe") && ok=carried
fi
[ -z "$ok" ] && exit 1
echo "=== pytest with the $ok build ($(date +%T))"
PYTHONUNBUFFERED=1 timeout 200 python3 -m pytest tests/python -rs -q -p no:cacheprovider --ignore=tests/python/test_integration.py > "$OUT/pytest.log" 2>&1
echo "pytest rc $?"; tail -15 "$OUT/pytest.log"
echo "=== integration ($(date +%T))"
PYTHONUNBUFFERED=1 timeout 200 python3 tests/python/integration.py --out "$OUT/2026-12-02-h200-python-integration.md" 2>&1 | tail -30
