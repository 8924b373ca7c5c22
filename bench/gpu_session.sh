#!/usr/bin/env bash
# One GPU session on the lent H200: build for sm_90a (this tree, and the tree
# named by NVFP4KV_BEFORE for a before/after comparison of store and gather),
# run the GPU tests, compute-sanitizer memcheck and racecheck, the round trip on
# every preset, the store/gather benchmark (before and after, alternating), and
# decode attention against PyTorch SDPA. A short table comes last; logs go to $OUT.
# The device machine has no package manager: GoogleTest sources and the
# nlohmann headers travel in .carry/ (bench/README.md says how to make it).
# Options (environment): NVFP4KV_BEFORE=DIR (an older source tree to benchmark
# beside this one), NVFP4KV_DECODE=full|quick|0, NVFP4KV_NCU=1 (Nsight Compute on
# one decode launch; =source: per-instruction counts too; =prefill: the prefill kernel's), NVFP4KV_DECODE_VARIANTS="a.patch b.patch" (bench/decode_variants.sh), NVFP4KV_PREFILL=quick|full (bench/prefill_vs_sdpa.py; off by default), NVFP4KV_SHORT=1 (short-query cells: mixed_attention at q length 1, 2, 4 beside prefill's route; off by default), NVFP4KV_TESTS=0 (skip tests and sanitizers), NVFP4KV_SANITIZE=0, NVFP4KV_CPU_TESTS=0, NVFP4KV_BENCH=0, NVFP4KV_SKIP_BUILD=1 (use build/gpu as it is)
# (skip the store/gather benchmark).
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
TABLES=$OUT
OUT=$OUT/logs
mkdir -p "$OUT"
trap 'tar czf "$TABLES/logs.tgz" -C "$TABLES" logs && rm -rf "$TABLES/logs"' EXIT
cd "$(dirname "$0")/.."
step() { echo; echo "=== $* ($(date +%T))"; }
status=()
record() { status+=("$1: $2"); }
configure() {  # source dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_FLAGS=-lineinfo -DNVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" \
    -DNVFP4KV_GTEST_SOURCE="$PWD/.carry/googletest"
}

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
step "build"
before=${NVFP4KV_BEFORE:-}
if [ -n "$before" ]; then
  (configure "$before" build/before > "$OUT/configure_before.log" 2>&1 &&
    cmake --build build/before -j 8 --target nvfp4kv_bench > "$OUT/build_before.log" 2>&1) &
  before_pid=$!
fi
if [ "${NVFP4KV_SKIP_BUILD:-0}" = 1 ] && [ -x build/gpu/nvfp4kv ]; then
  echo "build/gpu as it is (NVFP4KV_SKIP_BUILD=1)"
else
configure . build/gpu > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
grep -E "spill|warning" "$OUT/build.log" | sort | uniq -c | head -10
fi
[ -n "$before" ] && { wait $before_pid || { echo "before-tree build failed"; tail -20 "$OUT/build_before.log"; before=""; }; }

if [ "${NVFP4KV_TESTS:-1}" = 1 ]; then
  step "GPU tests: decode attention"
  timeout 120 build/gpu/tests/nvfp4kv_gpu_tests --gtest_filter='GpuDecode.*' > "$OUT/gpu_decode.log" 2>&1
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|rel L2" "$OUT/gpu_decode.log" | head -70
  grep -q "^\[  PASSED  \]" "$OUT/gpu_decode.log" && ! grep -q "^\[  FAILED" "$OUT/gpu_decode.log" && record "decode tests" pass || record "decode tests" FAIL
  step "GPU tests: the rest"
  timeout 150 build/gpu/tests/nvfp4kv_gpu_tests --gtest_filter='-GpuDecode.*' > "$OUT/gpu_tests.log" 2>&1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure" "$OUT/gpu_tests.log" | head -20
  grep -q "^\[  PASSED  \]" "$OUT/gpu_tests.log" && ! grep -q "^\[  FAILED" "$OUT/gpu_tests.log" && record "store/gather tests" pass || record "store/gather tests" FAIL
  step "GPU test: a barrier that never completes stops the kernel"
  timeout 30 build/gpu/tests/nvfp4kv_barrier_timeout 4096 2>&1 | tail -1  # what one failed poll costs
  timeout 90 build/gpu/tests/nvfp4kv_barrier_timeout 2>&1 | tee "$OUT/barrier_timeout.log" | tail -2
  grep -q "^PASSED: " "$OUT/barrier_timeout.log" && record "barrier timeout" pass || record "barrier timeout" FAIL
  if [ "${NVFP4KV_CPU_TESTS:-1}" = 1 ]; then
    step "CPU tests of this build"
    (cd build/gpu && ctest -E "Gpu|fuzz" -j 16 > "$OUT/ctest_cpu.log" 2>&1; cp Testing/Temporary/LastTest.log "$OUT/ctest_last.log"; grep -E "tests passed|\(Failed\)|\*\*\*Failed|Timeout" "$OUT/ctest_cpu.log" | head -20)
  fi
  if [ "${NVFP4KV_SANITIZE:-1}" = 1 ]; then
  step "compute-sanitizer memcheck"
  timeout 220 compute-sanitizer --tool memcheck --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests \
    --gtest_filter='GpuWgmma.*:GpuDecode.FormatTransforms*:Gpu.StoreAndGatherTakeEveryFormat:Gpu.FormatsAFamilyLacks*:Gpu.SlotEdgeCases:Gpu.GatherOfARaggedBatch*:Gpu.OddShapes*:GpuDecode.OptionsMatch*:GpuDecode.BadEntries*:GpuDecode.SparseAndRepeated*:GpuDecode.OtherHeadDims*:GpuDecode.HostSide*:GpuDecode.OddPageSizes*:GpuDecode.SplitSequences*:GpuDecode.GraphReplays*:GpuPrefill.PaddedHead*:GpuPrefill.BadEntries*:GpuPrefill.Mixed*:GpuPrefill.HostSide*:GpuPrefill.ShortQueryBad*:GpuPrefill.LongSequences*' \
    > "$OUT/memcheck.log" 2>&1; rc=$?
  tail -3 "$OUT/memcheck.log"; record "memcheck" "$([ $rc = 0 ] && echo clean || echo "rc $rc")"
  step "compute-sanitizer racecheck"
  timeout 180 compute-sanitizer --tool racecheck --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests \
    --gtest_filter='GpuWgmma.*:GpuDecode.FormatTransforms*:Gpu.StoreAndGatherTakeEveryFormat:Gpu.SlotEdgeCases:GpuDecode.OptionsMatch*:GpuDecode.SparseAndRepeated*:GpuDecode.OtherHeadDims*:GpuDecode.OddPageSizes*:GpuDecode.SplitSequences*:GpuPrefill.PaddedHead*:GpuPrefill.Mixed*:GpuPrefill.ShortQueryBad*:GpuPrefill.LongSequences*' \
    > "$OUT/racecheck.log" 2>&1; rc=$?
  tail -3 "$OUT/racecheck.log"; grep -oE "[a-z_]+\.cu[h]?:[0-9]+" "$OUT/racecheck.log" | sort | uniq -c | sort -rn | head -12
  record "racecheck" "$([ $rc = 0 ] && echo clean || echo "rc $rc")"
  fi
  step "round trip on every preset, and the demo"
  for p in $(build/gpu/nvfp4kv layout presets | awk '/^  [a-z]/ && $2 == "sound" {print $1}'); do
    printf '%-36s %s\n' "$p" "$(build/gpu/nvfp4kv roundtrip --layout "$p" 2>&1 | tail -1)"
  done | tee "$OUT/roundtrip.log" | grep -c "PASS" | sed 's/^/presets passing: /'
  grep -v PASS "$OUT/roundtrip.log" | head
  build/gpu/nvfp4kv demo > "$OUT/demo.log" 2>&1; record "demo" "rc $?"
fi

if [ "${NVFP4KV_BENCH:-1}" = 1 ]; then
step "store and gather benchmark (before / after, alternating)"
for i in 1 2; do
  [ -n "$before" ] && build/before/nvfp4kv_bench --markdown "$TABLES/bench_before$i.md" > "$OUT/bench_before$i.log" 2>&1
  build/gpu/nvfp4kv_bench --markdown "$TABLES/bench_after$i.md" > "$OUT/bench_after$i.log" 2>&1
done
for f in "$TABLES"/bench_*.md; do echo "--- $(basename "$f")"; grep -E "copy|store 65536 tok x 8 heads x D128, nvfp4kv-native|gather 65536|16384|decode-step store, 64 tok \(1 launch\), graph" "$f"; done
fi

if [ "${NVFP4KV_DECODE:-full}" != 0 ]; then
  step "decode attention vs PyTorch SDPA (${NVFP4KV_DECODE:-full})"
  quick=""; [ "${NVFP4KV_DECODE:-full}" = quick ] && quick="--quick"
  PYTHONUNBUFFERED=1 timeout 400 python3 bench/decode_vs_sdpa.py --nvfp4kv build/gpu/nvfp4kv --out "$TABLES" $quick \
    > "$OUT/decode_bench.log" 2>&1; rc=$?
  record "decode bench" "rc $rc"
  [ $rc = 0 ] || tail -20 "$OUT/decode_bench.log"
fi
if [ "${NVFP4KV_PREFILL:-0}" != 0 ]; then
  step "prefill attention vs PyTorch SDPA (${NVFP4KV_PREFILL})"
  quick=""; [ "${NVFP4KV_PREFILL}" = quick ] && quick="--quick"
  PYTHONUNBUFFERED=1 timeout 400 python3 bench/prefill_vs_sdpa.py --nvfp4kv build/gpu/nvfp4kv --out "$TABLES" $quick \
    > "$OUT/prefill_bench.log" 2>&1; rc=$?
  record "prefill bench" "rc $rc"
  [ $rc = 0 ] || tail -20 "$OUT/prefill_bench.log"
fi
if [ "${NVFP4KV_SHORT:-0}" != 0 ]; then
  # Issue 21's short-query goal: q length 4 within 1.3x of one-token decode at the same
  # batch and context (the same bytes read). --mixed: mixed_attention's routes; without
  # it, prefill_attention (the route q length 4 took before the short-query route).
  step "short queries: mixed_attention at q length 1, 2, 4 (8), and prefill's route"
  for ctx in 8192 32768; do
    for args in "--mixed --batch 32 --prompt 1,2,4" "--batch 32 --prompt 4" "--mixed --batch 1 --prompt 1,4" \
                "--mixed --batch 32 --prompt 1,2,8 --q-heads 64 --head-dim 128" ; do
      for prompt in $(echo "$args" | sed -E 's/.*--prompt ([0-9,]+).*/\1/' | tr , ' '); do
        timeout 60 build/gpu/nvfp4kv bench prefill $(echo "$args" | sed -E "s/--prompt [0-9,]+/--prompt $prompt/") \
          --cached $((ctx - prompt)) --json
      done
    done
  done 2>&1 | tee "$TABLES/short.jsonl" | tail -30
fi
if [ "${NVFP4KV_NCU:-0}" = source ]; then
  # Per-instruction executed counts and stall samples of the decode kernel (the SASS
  # page of Nsight Compute's source view), for where the cycles go inside a tile.
  step "ncu source counters: decode, batch 16 x 32768, 32/8 heads, D 128"
  timeout 240 ncu --clock-control none -k regex:decode_kernel -s 2 -c 1 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SourceCounters --section InstructionStats -o "$OUT/decode_prof" \
    build/gpu/nvfp4kv bench decode --batch 16 --context 32768 > "$OUT/ncu_decode.log" 2>&1
  ncu -i "$OUT/decode_prof.ncu-rep" --page details > "$OUT/ncu_details.log" 2>&1
  ncu -i "$OUT/decode_prof.ncu-rep" --page source --csv --print-source sass > "$TABLES/decode_sass.csv" 2>"$OUT/ncu_source.err"
  grep -E "Duration|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Warp Cycles Per Issued|Stall|Executed Instructions " "$OUT/ncu_details.log" | head -40
  wc -l "$TABLES/decode_sass.csv"; head -c 600 "$OUT/ncu_source.err"
fi
if [ "${NVFP4KV_NCU:-0}" = prefill ]; then
  # The prefill kernel's stall samples per SASS instruction (source page), and its
  # roles' shares: where a tile's time goes between the producers and the consumers.
  step "ncu source counters: prefill, 1 x 8192, 32/8 heads, D 128"
  timeout 240 ncu --clock-control none -k regex:prefill_kernel -s 3 -c 1 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SourceCounters --section InstructionStats --section ComputeWorkloadAnalysis \
    -o "$OUT/prefill_prof" build/gpu/nvfp4kv bench prefill --batch 1 --prompt 8192 > "$OUT/ncu_prefill.log" 2>&1
  ncu -i "$OUT/prefill_prof.ncu-rep" --page details > "$OUT/ncu_prefill_details.log" 2>&1
  ncu -i "$OUT/prefill_prof.ncu-rep" --page source --csv --print-source sass > "$TABLES/prefill_sass.csv" 2>"$OUT/ncu_source.err"
  grep -E "Duration|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Warp Cycles Per Issued|Stall|Executed Instructions |Registers|Pipe" "$OUT/ncu_prefill_details.log" | head -40
  wc -l "$TABLES/prefill_sass.csv"; head -c 600 "$OUT/ncu_source.err"
fi
if [ "${NVFP4KV_NCU:-0}" = 1 ]; then
  step "ncu: decode, batch 16 x 32768, 32/8 heads, D 128"
  timeout 200 ncu --clock-control none -k regex:decode_kernel -s 2 -c 1 --section SpeedOfLight --section Occupancy \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    build/gpu/nvfp4kv bench decode --batch 16 --context 32768 > "$OUT/ncu_decode.log" 2>&1
  grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc A|Stall|Mem Busy|Max Bandwidth|Waves" "$OUT/ncu_decode.log" | head -30
fi
if [ -n "${NVFP4KV_DECODE_VARIANTS:-}" ]; then
  step "decode variants: $NVFP4KV_DECODE_VARIANTS"
  timeout 300 bench/decode_variants.sh $NVFP4KV_DECODE_VARIANTS 2>&1 | tee "$OUT/decode_variants.log"
fi
step "summary"
printf '%s\n' "${status[@]}"
[ -f "$TABLES/decode.md" ] && cat "$TABLES/decode.md"
[ -f "$TABLES/prefill.md" ] && cat "$TABLES/prefill.md"
