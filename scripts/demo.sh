#!/usr/bin/env bash
# Build and run the demo: NVFP4 accuracy on a model-like KV tensor, a broken
# engine layout caught, and a round trip on the CPU and (when present) the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target nvfp4kv
build/cpu/nvfp4kv demo "$@"
