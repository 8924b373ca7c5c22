#!/usr/bin/env bash
# Two layouts, A and B, timed alternately in one run on the same decode and prefill cells
# (nvfp4kv bench decode / prefill --json), ROUNDS times each, so that a difference between
# them is not a difference between runs. Lines go to $OUT/layout_ab.jsonl (each with its
# layout and kind), a table of the medians to $OUT/layout_ab.md and stdout.
#   bench/layout_ab.sh [A (default nvfp4kv-native)] [B (default nvfp4kv-native-v1)] [BUILD (default build/gpu)]
set -uo pipefail
cd "$(dirname "$0")/.."
A=${1:-nvfp4kv-native}
B=${2:-nvfp4kv-native-v1}
build=${3:-build/gpu}
OUT=${OUT:-/tmp/nvfp4kv-out}
rounds=${ROUNDS:-2}
mkdir -p "$OUT"
: > "$OUT/layout_ab.jsonl"
decode_cells=("--batch 16 --context 32768" "--batch 128 --context 32768" "--batch 1 --context 131072" "--batch 1 --context 8192")
prefill_cells=("--batch 1 --prompt 8192" "--batch 8 --prompt 2048" "--batch 1 --prompt 8192 --head-dim 256" "--batch 1 --prompt 512 --cached 8192")
for r in $(seq "$rounds"); do
  for L in "$A" "$B"; do
    for c in "${decode_cells[@]}"; do
      "$build/nvfp4kv" bench decode $c --layout "$L" --json 2>&1 | grep '"batch"' | tail -1 |
        python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(layout='$L', kind='decode', cell='$c'); print(json.dumps(d))"
    done
    for c in "${prefill_cells[@]}"; do
      "$build/nvfp4kv" bench prefill $c --layout "$L" --json 2>&1 | grep '"batch"' | tail -1 |
        python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(layout='$L', kind='prefill', cell='$c'); print(json.dumps(d))"
    done
  done
done >> "$OUT/layout_ab.jsonl"
python3 - "$OUT/layout_ab.jsonl" "$A" "$B" <<'PY' | tee "$OUT/layout_ab.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
a, b = sys.argv[2], sys.argv[3]
def ms(d):
    for k in ("us", "ms"):
        if k in d: return d[k] / (1000.0 if k == "us" else 1.0)
    return float("nan")
print("| kind | cell | %s ms | %s ms | B / A |" % (a, b))
print("|---|---|---:|---:|---:|")
for kind in ("decode", "prefill"):
    for cell in dict.fromkeys(r["cell"] for r in rows if r["kind"] == kind):
        t = {L: statistics.median(ms(r) for r in rows if r["kind"] == kind and r["cell"] == cell and r["layout"] == L)
             for L in (a, b) if any(r["layout"] == L and r["cell"] == cell for r in rows)}
        if len(t) == 2:
            print("| %s | %s | %.4f | %.4f | %.3f |" % (kind, cell, t[a], t[b], t[b] / t[a]))
PY
