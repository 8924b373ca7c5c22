#!/usr/bin/env bash
# The SASS of one CUDA source, without a GPU: compiles it for sm_90a as the build
# does and disassembles it with cuobjdump/nvdisasm (from PyPI's nvidia-cuda-cuobjdump
# and nvidia-cuda-nvdisasm when the toolkit lacks them), then lists its loops
# (sass_loops.py). Registers and spills come from ptxas.
# Usage: bench/sass/sass_of.sh [SOURCE (default src/kernels/decode/decode_d128.cu)] [FUNCTION_SUBSTRING] [--copies] [--body HEX]
# Example (the plain bf16 instance, no soft-cap, decode route, no format steps): bench/sass/sass_of.sh src/kernels/decode/decode_d128.cu 'decode_kernelILi128ELi8ELNS_11ElementTypeE1ELb0ELb0ELb0ENS0_9attention9Nvfp4Fp16E'
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:-src/kernels/decode/decode_d128.cu}
fn=${2:-decode_kernelILi128ELi8ELNS_11ElementTypeE1ELb0E}
out=${TMPDIR:-/tmp}/nvfp4kv-sass
tools=$out/tools
mkdir -p "$out"
if ! command -v cuobjdump >/dev/null || ! command -v nvdisasm >/dev/null; then
  if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
    echo "fetching cuobjdump and nvdisasm from PyPI into $tools"
    python3 -m pip download --quiet --no-deps -d "$tools" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    (cd "$tools" && for w in *.whl; do python3 -m zipfile -e "$w" .; done && chmod +x nvidia/*/bin/*)
  fi
  export PATH="$(dirname "$(ls "$tools"/nvidia/*/bin/nvdisasm | head -1)"):$PATH"
fi
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$nvcc" -DNVFP4KV_HAVE_CUDA=1 -Iinclude -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] \
  -Xptxas=-warn-spills --expt-relaxed-constexpr -std=c++17 -x cu -c "$src" -o "$out/kernel.o" 2>&1 | grep -E "spill" | grep -F "$fn" || true
cuobjdump -sass "$out/kernel.o" > "$out/kernel.sass"
python3 bench/sass/sass_loops.py "$out/kernel.sass" "$fn" "${@:3}"
