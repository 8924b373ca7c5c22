#!/usr/bin/env bash
# The short-query route (issue 21) on the lent H200 in one call of under 10 minutes:
# build for sm_90a, the prefill/mixed and decode GPU tests, memcheck and racecheck on
# the short-query and mixed-batch tests, then the short-query cells of
# bench/gpu_session.sh (NVFP4KV_SHORT=1). Carry .carry/include and .carry/googletest.
# $OUT gets short.jsonl and logs.tgz (every log, tarred by gpu_session.sh at its end).
set -uo pipefail
TABLES=${OUT:-/tmp/nvfp4kv-out}
OUT=$TABLES/logs
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
step() { echo; echo "=== $* ($(date +%T))"; }
step "build"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_CUDA_FLAGS=-lineinfo -DNVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" -DNVFP4KV_GTEST_SOURCE="$PWD/.carry/googletest" \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu -j 16 --target nvfp4kv nvfp4kv_gpu_tests > "$OUT/build.log" 2>&1 ||
  { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
grep -E "spill" "$OUT/build.log" | sed -E 's/.*function .(_Z[^ ]*). ([0-9]+ bytes spill stores).*/\1 \2/' | sort | uniq | head -20
step "GPU tests: prefill, mixed batches, the short-query route"
timeout 200 build/gpu/tests/nvfp4kv_gpu_tests --gtest_filter='GpuPrefill.*' > "$OUT/gpu_prefill.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|short|replay" "$OUT/gpu_prefill.log" | head -80
step "GPU tests: decode"
timeout 150 build/gpu/tests/nvfp4kv_gpu_tests --gtest_filter='GpuDecode.*' > "$OUT/gpu_decode.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/gpu_decode.log" | head -20
filter='GpuPrefill.ShortQueryBad*:GpuPrefill.ShortQueryGraph*:GpuPrefill.Mixed*:GpuPrefill.ShortQueriesPlan*'
for tool in memcheck racecheck; do
  step "compute-sanitizer $tool"
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests --gtest_filter="$filter" \
    > "$OUT/$tool.log" 2>&1
  echo "rc $?"; tail -3 "$OUT/$tool.log"
done
OUT=$TABLES NVFP4KV_TESTS=0 NVFP4KV_BENCH=0 NVFP4KV_DECODE=0 NVFP4KV_SHORT=1 NVFP4KV_SKIP_BUILD=1 bash bench/gpu_session.sh
