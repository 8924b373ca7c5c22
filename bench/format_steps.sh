#!/usr/bin/env bash
# What the cache format's attention steps cost, in one GPU session: this tree built whole
# (the GPU tests, memcheck on the format tests), trees made from it by patches built beside
# it (the CLI only), then plain-cache decode and prefill timed for every tree, the trees
# alternating, and this tree's decode and prefill for each transform (--transform) beside
# plain NVFP4 in the same process. bench/format_steps_summary.py turns the JSON into tables.
# Usage: bench/format_steps.sh [NAME=PATCH ...]   (from the repository root; results in $OUT)
# Environment: NVFP4KV_REPS (plain repetitions, 3), NVFP4KV_TRANSFORM_REPS (2), NVFP4KV_MEMCHECK_BEFORE_S
# (memcheck of the format tests runs last, only if the script has run fewer seconds than this: 480).
# The device machine has no package manager: .carry/ holds GoogleTest and the nlohmann headers
# (bench/README.md says how to make it).
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
mkdir -p "$OUT"
root=$PWD
work=${TMPDIR:-/tmp}/nvfp4kv-format-steps
rm -rf "$work" && mkdir -p "$work"
step() { echo; echo "=== $* ($(date +%T))"; }
source bench/variant_builds.sh

names=() patches=()
for arg in "$@"; do names+=("${arg%%=*}"); patches+=("${arg#*=}"); done

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/device.txt"
step "build: this tree (everything) and ${#patches[@]} patched trees (the CLI)"
[ ${#patches[@]} -gt 0 ] && { build_variants "$root" "$work" 8 "${patches[@]}" > "$OUT/variants_build.log" 2>&1 & }
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DNVFP4KV_EXTRA_INCLUDE="$root/.carry/include" -DNVFP4KV_GTEST_SOURCE="$root/.carry/googletest" > "$OUT/configure.log" 2>&1 ||
  { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -40; exit 1; }
grep -E "spill" "$OUT/build.log" | grep -E "ILi128E" | sed 's/.*function .//' | sort | uniq | head -24 > "$OUT/spills_d128.txt"
wait
cat "$OUT/variants_build.log" 2>/dev/null
trees=("build/gpu/nvfp4kv") tags=("this")
for i in "${!patches[@]}"; do
  n=$((i + 1))
  if [ -f "$work/v$n/failed" ]; then echo "${names[$i]}: failed to build"; grep -E "error" "$work/v$n/build.log" | head -5; continue; fi
  trees+=("$work/v$n/build/nvfp4kv") tags+=("${names[$i]}")
done

step "GPU tests"
timeout 240 build/gpu/tests/nvfp4kv_gpu_tests > "$OUT/gpu_tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|read as plain" "$OUT/gpu_tests.log" | head -40

step "plain caches, the trees alternating (${tags[*]})"
for rep in $(seq "${NVFP4KV_REPS:-3}"); do
  for i in "${!trees[@]}"; do
    "${trees[$i]}" bench decode --batch 1,16,128 --context 2048,32768 --json 2>&1 |
      sed "s/^{/{\"tree\": \"${tags[$i]}\", \"rep\": $rep, \"kernel\": \"decode\", /" >> "$OUT/plain.jsonl"
    "${trees[$i]}" bench prefill --batch 1 --prompt 8192 --head-dim 64,128,256 --json 2>&1 |
      sed "s/^{/{\"tree\": \"${tags[$i]}\", \"rep\": $rep, \"kernel\": \"prefill\", /" >> "$OUT/plain.jsonl"
  done
done
grep -v '^{' "$OUT/plain.jsonl" | head -5

step "this tree: each transform beside plain NVFP4"
t=plain,rotate-k,rotate-v,smooth-k,rotate-k+rotate-v+smooth-k
for rep in $(seq "${NVFP4KV_TRANSFORM_REPS:-2}"); do
  build/gpu/nvfp4kv bench decode --batch 1,16 --context 32768,131072 --head-dim 64,128 --transform $t --json 2>&1 |
    sed "s/^{/{\"tree\": \"this\", \"rep\": $rep, \"kernel\": \"decode\", /" >> "$OUT/transforms.jsonl"
  build/gpu/nvfp4kv bench prefill --batch 1 --prompt 8192 --head-dim 64,128,256 --transform $t --json 2>&1 |
    sed "s/^{/{\"tree\": \"this\", \"rep\": $rep, \"kernel\": \"prefill\", /" >> "$OUT/transforms.jsonl"
done
grep -v '^{' "$OUT/transforms.jsonl" | head -5
# Last, with what time the device machine's call has left (the lent one stops a call at 600 s).
if [ "$SECONDS" -lt "${NVFP4KV_MEMCHECK_BEFORE_S:-480}" ]; then
  step "memcheck: the format tests"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build/gpu/tests/nvfp4kv_gpu_tests \
    --gtest_filter='GpuDecode.FormatTransforms*:GpuPrefill.FormatTransforms*:Gpu.StoreAndGatherTakeEveryFormat:GpuDecode.OptionsMatch*' \
    > "$OUT/memcheck.log" 2>&1; echo "memcheck rc $?"; tail -2 "$OUT/memcheck.log"
fi
step "summary"
python3 bench/format_steps_summary.py "$OUT" | tee "$OUT/summary.md"
