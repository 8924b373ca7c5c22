#!/usr/bin/env bash
# Decode-attention variants side by side in one GPU session: for each patch
# (applied alone on top of the working tree), build the CLI for sm_90a in its own
# directory and time a few decode shapes (`nvfp4kv bench decode`, which checks
# each shape against the fp64 reference before timing it). The tree itself runs
# first as the baseline.  Usage: [NVFP4KV_VARIANT_SHAPES="--head-dim 64 ..."] bench/decode_variants.sh A.patch [B.patch ...]
set -uo pipefail
root=$PWD
work=${TMPDIR:-/tmp}/nvfp4kv-decode-variants
rm -rf "$work" && mkdir -p "$work"
# NVFP4KV_VARIANT_SHAPES: other `bench decode` options (default: the D 128 shapes below).
read -r -a shapes <<< "${NVFP4KV_VARIANT_SHAPES:---batch 1,16,128 --context 2048,32768}"
shapes+=(--json)
run() {  # name, build dir
  echo "=== $1"
  "$2/nvfp4kv" bench decode "${shapes[@]}" 2>&1 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        print("  " + line.rstrip()); continue
    if "ceiling_read_tbs" in r:
        print("  read ceiling %.2f TB/s" % r["ceiling_read_tbs"]); continue
    print("  B %4d L %6d: %8.1f us %5.2f TB/s (%3.0f%%) splits %d" % (r["batch"], r["context"], r["ms"] * 1e3, r["tbs"], 100 * r["of_ceiling"], r["splits"]))'
}
# Every variant's tree is patched and built first, all builds at once (they share
# the machine's cores), then each is timed in turn with the GPU to itself.
. "$root/bench/variant_builds.sh"
build_variants "$root" "$work" 8 "$@"
run "baseline (working tree)" "$root/build/gpu"
n=0
for patch in "$@"; do
  n=$((n + 1))
  dir="$work/v$n"
  if [ -f "$dir/failed" ]; then echo "=== $patch: build failed"; grep -E "error" -A3 "$dir/build.log" | head; continue; fi
  grep -E "spill" "$dir/build.log" | grep -E "Li128ELi8|Li64ELi8" | head -2
  run "$patch" "$dir/build"
done
