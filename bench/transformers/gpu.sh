#!/usr/bin/env bash
# nvfp4kv.transformers on the lent H200, in two calls on one warm machine (the model is 92 MB,
# one call carries at most 64 MiB; see docs/transformers.md, "On the GPU"):
#
#   here, once:  python3 bench/transformers/text.py --out build/kv-text
#                python3 bench/transformers/stage_gpu.py --text build/kv-text --out .carry/transformers19
#                python3 -m pip download --no-deps optimum-quanto==0.2.7 termcolor==3.3.0 -d .whl
#                DISABLE_CUDA=1 python3 -m pip wheel --no-deps hqq==0.2.8.post1 -w .whl  # PyPI: source only
#   call 1:      bash bench/transformers/gpu.sh      carry: .carry/include .carry/transformers19-a .whl
#                installs nvfp4kv (CUDA), runs tests/python/test_transformers.py and test_torch_ops.py (GPU tests
#                too), keeps part a in /tmp, checks the perplexity of the model's first 10 layers
#                (fused decode against the CPU path; NVFP4KV_CHECK10=0 skips it)
#   call 2:      bash bench/transformers/gpu.sh      carry: .carry/transformers19-b .whl
#                (as soon as call 1 returns: the machine stays warm about 30 s) the perplexity
#                check on all 30 layers, from part a kept in /tmp and part b, then the decode
#                step timed for BF16 SDPA, quanto int4 and nvfp4kv
# Each call stays well inside the 10 minutes a command may take. Calls 3 and on, the accuracy
# table from the same parts: bench/transformers/gpu_accuracy.sh.
# Everything lands in $OUT (transformers-gpu-*.json, the logs).
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
STAGE=/tmp/nvfp4kv-transformers19   # outlives a call while the machine is warm
mkdir -p "$OUT" "$STAGE"
cd "$(dirname "$0")/../.."
for part in a b; do
  [ -d ".carry/transformers19-$part" ] && cp -r ".carry/transformers19-$part" "$STAGE/"
done
if ls .whl/*.whl >/dev/null 2>&1; then  # optimum-quanto, hqq, termcolor for the peer rows; torch, ninja are there
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1

if [ -d .carry/transformers19-b ]; then
  # Call 2: part a must still be here from call 1.
  [ -d "$STAGE/transformers19-a" ] || { echo "part a is gone: the machine was given back between the calls; run call 1 again"; exit 2; }
  (cd /tmp && python3 -c 'import nvfp4kv.transformers') || { echo "nvfp4kv is not installed: run call 1 first"; exit 2; }
  echo "=== perplexity, 30 layers, and decode speed ($(date +%T))"
  timeout 540 python3 bench/transformers/gpu_check.py --staged "$STAGE/transformers19-a" "$STAGE/transformers19-b" \
    --windows 2 --out "$OUT/transformers-gpu-30-layers.json" 2>&1 | tee "$OUT/gpu-check-30.log" | tail -60
  exit "${PIPESTATUS[0]}"
fi

[ -d "$STAGE/transformers19-a" ] || { echo "carry .carry/transformers19-a (bench/transformers/stage_gpu.py makes it)"; exit 2; }
echo "=== pip install ($(date +%T))"
# As bench/python_session.sh: the system compiler shares torch's libstdc++.
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps \
  -C cmake.define.NVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  -C build-dir=build/python . > "$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
(cd /tmp && python3 -c 'import nvfp4kv, transformers; print(nvfp4kv.build_info, nvfp4kv.cuda_available(), "transformers", transformers.__version__)')
echo "=== tests/python/test_transformers.py, test_torch_ops.py ($(date +%T))"
timeout 200 python3 -m pytest tests/python/test_transformers.py tests/python/test_torch_ops.py -rs -q -p no:cacheprovider > "$OUT/pytest-transformers.log" 2>&1
echo "pytest rc $?"; tail -15 "$OUT/pytest-transformers.log"
if [ "${NVFP4KV_CHECK10:-1}" = 0 ]; then echo "=== perplexity, first 10 layers: skipped (NVFP4KV_CHECK10=0)"; exit 0; fi
echo "=== perplexity, first 10 layers ($(date +%T))"
timeout 240 python3 bench/transformers/gpu_check.py --staged "$STAGE/transformers19-a" --windows 2 --skip speed \
  --out "$OUT/transformers-gpu-10-layers.json" 2>&1 | tee "$OUT/gpu-check-10.log" | tail -40
