#!/usr/bin/env bash
# Decode attention at pages of 16, 32, 64 and 128 tokens, two cells each (16 x 32768 and
# 1 x 32768 tokens, 32/8 heads, D 128), every shape checked against the fp64 reference
# before it is timed, the read ceiling measured in the same run (`nvfp4kv bench decode`).
# Usage: bench/decode_page_sizes.sh [BUILD_DIR] (default build/gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/gpu}
for n in 16 32 64 128; do
  echo "=== $n tokens per page"
  "$build/nvfp4kv" bench decode --batch 1,16 --context 32768 --q-heads 32 --kv-heads 8 --head-dim 128 --tokens-per-page "$n" 2>&1
done
