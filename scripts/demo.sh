#!/usr/bin/env bash
# Build and run the demo: NVFP4 accuracy on a model-like KV tensor, a broken
# engine layout caught, and a round trip on the CPU and (when present) the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset cpu >/dev/null
# The build's own output (compiler lines, ptxas register reports) goes to a log: the
# demo's output is what a newcomer reads. Where nvcc is found this compiles the CUDA
# kernels too, which takes minutes on a few cores.
log=build/cpu/demo-build.log
echo "building the nvfp4kv command (build/cpu/nvfp4kv; log: $log) ..."
cmake --build --preset cpu -j "$(nproc)" --target nvfp4kv >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
build/cpu/nvfp4kv demo "$@"
echo
echo "The command is build/cpu/nvfp4kv (cmake --install puts it in PREFIX/bin; pip install . on PATH)."
