#!/usr/bin/env bash
# What the cache format's attention steps cost, in one GPU session: this tree built whole
# (the GPU tests, memcheck and racecheck on the format tests), trees made from it by patches
# built beside it (the CLI only), then plain-cache decode and prefill timed for every tree, the
# trees alternating, and every tree's decode and prefill for each transform (--transform)
# beside plain NVFP4, a process per transform and tree, alternating, the SM clock and power
# sampled meanwhile.
# bench/format_steps_summary.py turns the JSON into tables.
# Usage: bench/format_steps.sh [NAME=PATCH ...]   (from the repository root; results in $OUT)
# Environment (the grids are `nvfp4kv bench` options; an empty one skips that part):
#   NVFP4KV_REPS (plain repetitions, 3), NVFP4KV_TRANSFORM_REPS (2),
#   NVFP4KV_PLAIN_DECODE ("--batch 1,16,128 --context 2048,32768"),
#   NVFP4KV_PLAIN_PREFILL ("--batch 1 --prompt 8192 --head-dim 64,128,256"),
#   NVFP4KV_TRANSFORMS (plain and every transform, comma-separated; each runs as its own process),
#   NVFP4KV_DECODE_TRANSFORMS (decode's, NVFP4KV_TRANSFORMS),
#   NVFP4KV_TRANSFORM_DECODE ("--batch 1,16 --context 32768,131072 --head-dim 64,128"),
#   NVFP4KV_TRANSFORM_PREFILL ("--batch 1 --prompt 8192 --head-dim 64,128,256"),
#   NVFP4KV_TARGETS (this tree's build targets, all), NVFP4KV_GTEST_FILTER (the GPU tests to run, all),
#   NVFP4KV_MEMCHECK_FILTER (the tests under memcheck, the format tests), NVFP4KV_RACECHECK_FILTER (under
#   racecheck: decode's format and options tests), NVFP4KV_SANITIZE_TIMEOUT (seconds for each, 90), NVFP4KV_STORE_FORMATS (1: `nvfp4kv_bench --formats`, store
#   and gather per format beside plain, into $OUT/store_formats.md; needs the nvfp4kv_bench target), NVFP4KV_NCU_PREFILL (transforms to profile
#   one prefill launch of with Nsight Compute, none; last, only if the script has run fewer
#   seconds than NVFP4KV_NCU_BEFORE_S, 480: the lent machine stops a call at 600 s),
#   NVFP4KV_BINARIES (an .tar.xz of this tree's nvfp4kv, nvfp4kv_bench and tests/nvfp4kv_gpu_tests,
#   built elsewhere for sm_90a, unpacked into build/gpu instead of building; patched trees still build).
# The device machine has no package manager: .carry/ holds GoogleTest and the nlohmann headers
# (bench/README.md says how to make it). Few files come back from it: the logs travel as logs.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
mkdir -p "$OUT/logs"
LOGS=$OUT/logs
trap 'tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"' EXIT
root=$PWD
work=${TMPDIR:-/tmp}/nvfp4kv-format-steps
rm -rf "$work" && mkdir -p "$work"
step() { echo; echo "=== $* ($(date +%T))"; echo "$(date +%s.%N) $*" >> "$LOGS/phases.txt"; }
source bench/variant_builds.sh
all_transforms=plain,rotate-k,rotate-v,smooth-k,rotate-k+rotate-v+smooth-k
plain_decode=${NVFP4KV_PLAIN_DECODE-"--batch 1,16,128 --context 2048,32768"}
plain_prefill=${NVFP4KV_PLAIN_PREFILL-"--batch 1 --prompt 8192 --head-dim 64,128,256"}
transforms=${NVFP4KV_TRANSFORMS-$all_transforms}
decode_transforms=${NVFP4KV_DECODE_TRANSFORMS-$transforms}
transform_decode=${NVFP4KV_TRANSFORM_DECODE-"--batch 1,16 --context 32768,131072 --head-dim 64,128"}
transform_prefill=${NVFP4KV_TRANSFORM_PREFILL-"--batch 1 --prompt 8192 --head-dim 64,128,256"}

names=() patches=()
for arg in "$@"; do names+=("${arg%%=*}"); patches+=("${arg#*=}"); done

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/device.txt"
step "build: this tree (everything) and ${#patches[@]} patched trees (the CLI)"
[ ${#patches[@]} -gt 0 ] && { build_variants "$root" "$work" 8 "${patches[@]}" > "$LOGS/variants_build.log" 2>&1 & }
if [ -n "${NVFP4KV_BINARIES:-}" ]; then
  # Binaries built elsewhere for sm_90a from this tree (an xz tar of nvfp4kv, nvfp4kv_bench and
  # tests/nvfp4kv_gpu_tests as a build folder lays them out): no build here.
  mkdir -p build/gpu && xz -dc "$NVFP4KV_BINARIES" | tar xf - -C build/gpu || { echo "cannot unpack $NVFP4KV_BINARIES"; exit 1; }
  ls -l build/gpu/nvfp4kv build/gpu/nvfp4kv_bench build/gpu/tests/nvfp4kv_gpu_tests
else
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DNVFP4KV_EXTRA_INCLUDE="$root/.carry/include" -DNVFP4KV_GTEST_SOURCE="$root/.carry/googletest" > "$LOGS/configure.log" 2>&1 ||
    { tail -20 "$LOGS/configure.log"; exit 1; }
  cmake --build build/gpu -j 16 ${NVFP4KV_TARGETS:+--target $NVFP4KV_TARGETS} > "$LOGS/build.log" 2>&1 || { grep -E "error" -A5 "$LOGS/build.log" | head -40; exit 1; }
  grep -E "spill" "$LOGS/build.log" | sed 's/.*function .//' | sort | uniq > "$LOGS/spills.txt"
fi
wait
cat "$LOGS/variants_build.log" 2>/dev/null
trees=("build/gpu/nvfp4kv") tags=("this")
for i in "${!patches[@]}"; do
  n=$((i + 1))
  if [ -f "$work/v$n/failed" ]; then echo "${names[$i]}: failed to build"; grep -E "error" "$work/v$n/build.log" | head -5; continue; fi
  trees+=("$work/v$n/build/nvfp4kv") tags+=("${names[$i]}")
done

step "GPU tests"
timeout 240 build/gpu/tests/nvfp4kv_gpu_tests --gtest_filter="${NVFP4KV_GTEST_FILTER:-*}" > "$LOGS/gpu_tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|read as plain" "$LOGS/gpu_tests.log" | head -40

step "memcheck and racecheck: the format tests"
filter=${NVFP4KV_MEMCHECK_FILTER:-'GpuDecode.FormatTransforms*:GpuPrefill.FormatTransforms*:GpuDecode.Fp8Sides*:GpuPrefill.Fp8Sides*:Gpu.StoreAndGatherTakeEveryFormat:GpuDecode.OptionsMatch*:GpuDecode.SplitSequences*'}
timeout "${NVFP4KV_SANITIZE_TIMEOUT:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests \
  --gtest_filter="$filter" > "$LOGS/memcheck.log" 2>&1; echo "memcheck rc $?"; tail -2 "$LOGS/memcheck.log"
timeout "${NVFP4KV_SANITIZE_TIMEOUT:-90}" compute-sanitizer --tool racecheck --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests \
  --gtest_filter="${NVFP4KV_RACECHECK_FILTER:-GpuDecode.FormatTransforms*:GpuDecode.OptionsMatch*}" > "$LOGS/racecheck.log" 2>&1
echo "racecheck rc $?"; tail -2 "$LOGS/racecheck.log"

# The SM clock and power while the benchmarks run (phases.txt says which ran when).
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > "$LOGS/clocks.csv" 2>&1 &
smi=$!
# The store per format first: the transform grids below can run long, and the call stops at 600 s.
if [ "${NVFP4KV_STORE_FORMATS:-0}" = 1 ]; then
  step "store and gather per format beside plain (nvfp4kv_bench --formats)"
  timeout 120 build/gpu/nvfp4kv_bench --formats --markdown "$OUT/store_formats.md" > "$LOGS/store_formats.log" 2>&1
  echo "nvfp4kv_bench rc $?"; grep -E "^\|" "$OUT/store_formats.md" | head -40
fi
if [ -n "$plain_decode$plain_prefill" ]; then
  step "plain caches, the trees alternating (${tags[*]})"
  for rep in $(seq "${NVFP4KV_REPS:-3}"); do
    for i in "${!trees[@]}"; do
      [ -n "$plain_decode" ] && "${trees[$i]}" bench decode $plain_decode --json 2>&1 |
        sed "s/^{/{\"tree\": \"${tags[$i]}\", \"rep\": $rep, \"kernel\": \"decode\", /" >> "$OUT/plain.jsonl"
      [ -n "$plain_prefill" ] && "${trees[$i]}" bench prefill $plain_prefill --json 2>&1 |
        sed "s/^{/{\"tree\": \"${tags[$i]}\", \"rep\": $rep, \"kernel\": \"prefill\", /" >> "$OUT/plain.jsonl"
    done
  done
  grep -v '^{' "$OUT/plain.jsonl" | head -5
fi

if [ -n "$transforms$decode_transforms" ] && [ -n "$transform_decode$transform_prefill" ]; then
  step "each transform beside plain NVFP4, a process per transform and tree, alternating"
  for rep in $(seq "${NVFP4KV_TRANSFORM_REPS:-2}"); do
    for kernel in decode prefill; do
      grid=$transform_decode
      [ $kernel = prefill ] && grid=$transform_prefill
      [ -z "$grid" ] && continue
      list=$transforms
      [ $kernel = decode ] && list=$decode_transforms
      for t in ${list//,/ }; do
        for i in "${!trees[@]}"; do
          # A tree whose CLI predates --transform times plain only.
          [ "$t" != plain ] && ! "${trees[$i]}" bench $kernel --help | grep -q -- --transform && continue
          step "$kernel $t, ${tags[$i]} (rep $rep)"
          "${trees[$i]}" bench $kernel $grid --transform "$t" --json 2>&1 |
            sed "s/^{/{\"tree\": \"${tags[$i]}\", \"rep\": $rep, \"kernel\": \"$kernel\", /" >> "$OUT/transforms.jsonl"
        done
      done
    done
  done
  grep -v '^{' "$OUT/transforms.jsonl" | head -5
fi
kill $smi 2>/dev/null

# Nsight Compute on one prefill launch per transform (NVFP4KV_NCU_PREFILL: the transforms,
# comma-separated, e.g. plain,rotate-v): the launch's duration, clocks, registers, occupancy
# and where its warps wait, with the clocks unlocked as in the benchmarks.
if [ -n "${NVFP4KV_NCU_PREFILL:-}" ] && [ "$SECONDS" -lt "${NVFP4KV_NCU_BEFORE_S:-480}" ]; then
  for t in ${NVFP4KV_NCU_PREFILL//,/ }; do
    step "ncu: prefill 1 x 8K D 128, $t"
    timeout 120 ncu --clock-control none -k regex:prefill_kernel -s 3 -c 1 --section SpeedOfLight --section LaunchStats \
      --section Occupancy --section SchedulerStats --section WarpStateStats \
      build/gpu/nvfp4kv bench prefill --batch 1 --prompt 8192 --head-dim 128 --transform "$t" > "$LOGS/ncu_prefill_$t.log" 2>&1
    grep -E "prefill_kernel|Duration|SM Frequency|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|Dynamic Shared|Compute \(SM\) Throughput|Memory Throughput" \
      "$LOGS/ncu_prefill_$t.log" | head -24
  done
fi

step "summary"
python3 bench/format_steps_summary.py "$OUT" | tee "$OUT/summary.md"
