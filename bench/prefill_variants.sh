#!/usr/bin/env bash
# Prefill-attention variants side by side in one GPU session, as decode_variants.sh does for
# decode: for each patch (applied alone on top of the working tree), build the CLI for sm_90a
# in its own directory and time a few prefill shapes (`nvfp4kv bench prefill`, which times
# without checking the output: correctness is the GPU tests' job, and probes time wrong results). The tree itself (build/gpu) runs
# first as the baseline.  Usage: [NVFP4KV_VARIANT_SHAPES="--batch 1 --prompt 8192"] bench/prefill_variants.sh A.patch [B.patch ...]
set -uo pipefail
root=$PWD
work=${TMPDIR:-/tmp}/nvfp4kv-prefill-variants
rm -rf "$work" && mkdir -p "$work"
read -r -a shapes <<< "${NVFP4KV_VARIANT_SHAPES:---batch 1,8 --prompt 2048,8192}"
run() {  # name, build dir
  echo "=== $1"
  for d in 128 64 256; do
    "$2/nvfp4kv" bench prefill "${shapes[@]}" --head-dim $d --json 2>&1 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        print("  " + line.rstrip()); continue
    if "ms" not in r: continue
    print("  B %3d L %6d D %3d: %9.3f ms %6.1f TFLOP/s" % (r["batch"], r["prompt"], r["head_dim"], r["ms"], r.get("tflops", 0)))'
  done
}
. "$root/bench/variant_builds.sh"
build_variants "$root" "$work" 16 "$@"
run "baseline (working tree)" "$root/build/gpu"
n=0
for patch in "$@"; do
  n=$((n + 1))
  dir="$work/v$n"
  if [ -f "$dir/failed" ]; then echo "=== $patch: build failed"; grep -E "error" -A3 "$dir/build.log" | head; continue; fi
  grep -E "spill" "$dir/build.log" | grep prefill | sort -u | head -3
  run "$patch" "$dir/build"
done
