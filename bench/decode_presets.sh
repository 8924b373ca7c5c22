#!/usr/bin/env bash
# Decode attention's speed on every sound preset at one shape (default batch 16 x 32768
# tokens, 32/8 heads, D 128, 16 tokens per page), each checked against the fp64
# reference before it is timed (`nvfp4kv bench decode --layout`). Writes
# $OUT/decode_presets.md (and .json lines) and prints the table.
# Usage: bench/decode_presets.sh [BUILD_DIR] (default build/gpu, built if missing)
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
build=${1:-build/gpu}
if [ ! -x "$build/nvfp4kv" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON -DNVFP4KV_BUILD_TESTS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DNVFP4KV_EXTRA_INCLUDE="$PWD/.carry/include" > "$OUT/configure_presets.log" 2>&1 &&
    cmake --build "$build" -j 16 --target nvfp4kv > "$OUT/build_presets.log" 2>&1 || { tail -20 "$OUT/build_presets.log"; exit 1; }
fi
shape=(--batch 16 --context 32768 --q-heads 32 --kv-heads 8 --head-dim 128)
: > "$OUT/decode_presets.jsonl"
for p in $("$build/nvfp4kv" layout presets | awk '/^  [a-z]/ && $2 == "sound" {print $1}'); do
  res=$("$build/nvfp4kv" bench decode "${shape[@]}" --layout "$p" --json 2>&1)
  line=$(printf '%s\n' "$res" | grep '"batch"' | tail -1)
  [ -n "$line" ] || line=$(printf '%s\n' "$res" | tail -1 | python3 -c 'import json,sys; print(json.dumps({"batch": None, "error": sys.stdin.read().strip()}))')
  printf '%s\n' "$line" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['layout']='$p'; print(json.dumps(r))" >> "$OUT/decode_presets.jsonl"
done
python3 - "$OUT/decode_presets.jsonl" "$OUT/decode_presets.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
native = next((r for r in rows if r.get("layout") == "nvfp4kv-native" and "ms" in r), None)
out = ["| layout | copy | us | NVFP4 TB/s | of read ceiling | vs nvfp4kv-native |", "|---|---|---:|---:|---:|---:|"]
for r in rows:
    if "ms" not in r:
        out.append("| %s | - | %s | | | |" % (r["layout"], r.get("error", "failed")))
        continue
    rel = native["ms"] / r["ms"] if native else float("nan")
    out.append("| %s | %s | %.1f | %.2f | %.0f%% | %.2fx |" % (r["layout"], "planes" if r.get("dense") else "tensor rows" if r.get("tensor_rows") else "rows",
               r["ms"] * 1e3, r["tbs"], 100 * r["of_ceiling"], rel))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
