#!/usr/bin/env bash
# Build and measure candidate changes side by side in one GPU session: for each
# patch named on the command line (applied cumulatively, in order, on top of the
# working tree), build for sm_90a in its own directory, run the GPU tests and
# `nvfp4kv_bench --quick`, and print one line per variant. The lent GPU is
# scarce; this gets several measured steps out of one machine start.
# Usage: bench/variants.sh A.patch [B.patch ...]   (run from the repository root)
set -uo pipefail
root=$PWD
work=${TMPDIR:-/tmp}/nvfp4kv-variants
rm -rf "$work" && mkdir -p "$work"
prev="$root"
n=0
for patch in "$@"; do
  n=$((n + 1))
  dir="$work/v$n"
  mkdir -p "$dir"
  (cd "$prev" && tar cf - --exclude=./build --exclude=./.git .) | (cd "$dir" && tar xf -)
  (cd "$dir" && { git apply "$root/$patch" 2>/dev/null || patch -p1 -s < "$root/$patch"; }) ||
    { echo "variant $n ($patch): does not apply"; exit 1; }
  echo "=== variant $n: + $patch"
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DNVFP4KV_EXTRA_INCLUDE="$root/.carry/include" \
    -DNVFP4KV_GTEST_SOURCE="$root/.carry/googletest" > "$dir/configure.log" 2>&1 &&
    cmake --build "$dir/build" -j 16 > "$dir/build.log" 2>&1 || { grep -E "error" -A3 "$dir/build.log" | head -20; prev="$dir"; continue; }
  "$dir/build/tests/nvfp4kv_gpu_tests" > "$dir/gpu_tests.log" 2>&1 && echo "gpu tests: pass" ||
    { echo "gpu tests: FAIL"; grep -E "Failure|FAILED|Expected|Which" "$dir/gpu_tests.log" | head -12; }
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$dir/build/tests/nvfp4kv_gpu_tests" \
    --gtest_filter='-Gpu.LargeRandom*:GpuCodecs.E4M3Encode*' > "$dir/memcheck.log" 2>&1 && echo "memcheck: clean" || echo "memcheck: FAIL (rc $?)"
  timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$dir/build/tests/nvfp4kv_gpu_tests" \
    --gtest_filter='Gpu.SlotEdgeCases:Gpu.OddShapes*:Gpu.GatherMarks*' > "$dir/racecheck.log" 2>&1 && echo "racecheck: clean" || echo "racecheck: FAIL (rc $?)"
  "$dir/build/nvfp4kv_bench" --quick 2>&1 | grep -E "^\|" | grep -v -- "---|" | grep -E "store|gather|copy"
  if [ "${NVFP4KV_NCU:-0}" = 1 ]; then
    timeout 150 ncu --clock-control none -k regex:store_kernel -s 8 -c 1 --section SpeedOfLight --section Occupancy \
      --section LaunchStats "$dir/build/nvfp4kv_bench" --profile > "$dir/ncu_store.log" 2>&1
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|L2 Cache Throughput" "$dir/ncu_store.log" | head -8
  fi
  prev="$dir"
done
