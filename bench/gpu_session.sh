#!/usr/bin/env bash
# One GPU session on the lent H200: build for sm_90a, run the GPU tests, run
# them under compute-sanitizer (memcheck, racecheck), run the round trip and
# the benchmark, and print a short table last. Logs go to $OUT.
# The device machine has no package manager: GoogleTest sources and the
# nlohmann headers travel in .carry/ (see bench/README.md).
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
# Logs go to $OUT/logs and leave as one archive (the device tool returns few files);
# the benchmark tables stay beside it.
TABLES=$OUT
OUT=$OUT/logs
mkdir -p "$OUT"
trap 'tar czf "$TABLES/logs.tgz" -C "$TABLES" logs && rm -rf "$TABLES/logs"' EXIT
cd "$(dirname "$0")/.."
step() { echo; echo "=== $* ($(date +%T))"; }
status=()
record() { status+=("$1: $2"); }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
step "build"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DNVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" \
  -DNVFP4KV_GTEST_SOURCE="$PWD/.carry/googletest" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
cuobjdump --dump-resource-usage build/gpu/libnvfp4kv_cuda.a 2>/dev/null | grep -E "Function|REG" | sed 's/^\s*//' | paste - - | awk '{print $2, $3, $4, $5, $6, $7}' | head -12

if [ "${NVFP4KV_SASS:-0}" = 1 ]; then
  step "SASS opcode counts (bf16 store, standard rule; bf16 gather)"
  cuobjdump -sass build/gpu/libnvfp4kv_cuda.a > "$OUT/sass.txt" 2>&1
  python3 - "$OUT/sass.txt" <<'PY'
import collections, re, sys
text = open(sys.argv[1]).read()
for name in ("store_kernelILNS_11ElementTypeE1ELNS_9ScaleRuleE0", "gather_kernelILNS_11ElementTypeE1"):
    m = re.search(r"Function : (\S*%s\S*)" % name, text)
    if not m:
        print("not found:", name); continue
    body = text[m.end():text.find("Function :", m.end())]
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", body))
    print(name, "instructions:", sum(ops.values()))
    print("  " + ", ".join("%s %d" % kv for kv in ops.most_common(24)))
PY
fi

step "CPU tests (same build)"
(cd build/gpu && ctest -E "Gpu|fuzz" -j 16 2>&1 | tail -3)
step "GPU tests"
build/gpu/tests/nvfp4kv_gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|error" | head -40
grep -q "^\[  PASSED  \]" "$OUT/gpu_tests.log" && ! grep -q "FAILED" "$OUT/gpu_tests.log" && record "gpu tests" pass || record "gpu tests" FAIL
step "compute-sanitizer memcheck"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests \
  --gtest_filter='-Gpu.LargeRandom*:GpuCodecs.E4M3Encode*' > "$OUT/memcheck.log" 2>&1; rc=$?
tail -4 "$OUT/memcheck.log"; record "memcheck" "$([ $rc = 0 ] && echo clean || echo "rc $rc")"
step "compute-sanitizer racecheck"
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests \
  --gtest_filter='Gpu.SlotEdgeCases:Gpu.GatherMarks*:Gpu.LargeRandom*' > "$OUT/racecheck.log" 2>&1; rc=$?
tail -3 "$OUT/racecheck.log"; record "racecheck" "$([ $rc = 0 ] && echo clean || echo "rc $rc")"
step "round trip and demo"
build/gpu/nvfp4kv roundtrip --layout nvfp4kv-native --pages 512 --tokens 6000 | tee "$OUT/roundtrip.log" | tail -12
build/gpu/nvfp4kv roundtrip --layout trtllm | tail -2
build/gpu/nvfp4kv demo > "$OUT/demo.log" 2>&1; record "demo" "rc $?"
step "benchmark"
build/gpu/nvfp4kv_bench --markdown "$TABLES/bench.md" 2>&1 | tee "$OUT/bench.log" | grep -v "^|"
if [ "${NVFP4KV_REPEAT:-1}" = 1 ]; then
  echo "--- the same binary again (spread between runs)"
  build/gpu/nvfp4kv_bench --markdown "$TABLES/bench2.md" 2>&1 | grep -E "store 65536 tok x 8 heads x D128, nvfp4kv|gather 65536 tok x 8 heads x D128 -> bf16, nvfp4kv|copy" | grep -v "^|"
fi
if [ "${NVFP4KV_NCU:-0}" = 1 ]; then
  for k in store_kernel gather_kernel; do
    step "ncu: $k (one launch of the 65536-token case)"
    timeout 150 ncu --clock-control none -k regex:$k -s 8 -c 1 --section SpeedOfLight --section Occupancy \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
      build/gpu/nvfp4kv_bench --profile > "$OUT/ncu_$k.log" 2>&1
    grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc A|Stall|Mem Busy|Max Bandwidth" "$OUT/ncu_$k.log" | head -24
  done
fi
if [ -n "${NVFP4KV_VARIANTS:-}" ]; then
  step "variants (cumulative patches): $NVFP4KV_VARIANTS"
  NVFP4KV_NCU=${NVFP4KV_VARIANT_NCU:-0} bench/variants.sh $NVFP4KV_VARIANTS 2>&1 | tee "$OUT/variants.log"
fi
step "summary"
printf '%s\n' "${status[@]}"
cat "$TABLES/bench.md"
