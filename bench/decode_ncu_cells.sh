#!/usr/bin/env bash
# Nsight Compute on a few decode cells that miss the goals for reasons other than the
# bandwidth-bound ones (batch 1, short contexts, D 64): both kernels of one call
# (decode and, when split, the merge), their durations, issue and DRAM figures.
# Builds only the CLI. Output: $OUT/ncu_cells.log and a summary on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON -DNVFP4KV_BUILD_TESTS=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DNVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" > "$OUT/configure.log" 2>&1 &&
  cmake --build build/gpu -j 16 --target nvfp4kv > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
cells=("--batch 1 --context 2048" "--batch 1 --context 8192" "--batch 1 --context 32768" "--batch 8 --context 2048"
       "--batch 8 --context 32768 --head-dim 64")
for c in "${cells[@]}"; do
  echo "=== $c" | tee -a "$OUT/ncu_cells.log"
  # skip the correctness check's launches and the warm-up: profile one graph-free call of each kernel
  timeout 120 ncu --clock-control none -k regex:"decode_kernel|merge_kernel" -s 4 -c 2 --section SpeedOfLight \
    --section Occupancy --section LaunchStats build/gpu/nvfp4kv bench decode $c > "$OUT/ncu_cell.log" 2>&1
  cat "$OUT/ncu_cell.log" >> "$OUT/ncu_cells.log"
  grep -E "decode_kernel|merge_kernel|Duration|Issue Slots|DRAM Throughput|Grid Size|Achieved Occupancy|Waves" "$OUT/ncu_cell.log" |
    sed -E 's/\(DecodeParams\)|void nvfp4kv::kernels::decode:://g' | cut -c1-110
done
