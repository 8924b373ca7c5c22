#!/usr/bin/env bash
# The accuracy table (bench/transformers/accuracy.py) on the lent H200, from the staged model, in
# calls after bench/transformers/gpu.sh's two on the same warm machine: call 1 installed nvfp4kv
# and kept part a in /tmp, call 2 brought part b (with accuracy-inputs.npz in part a, every token
# id the table needs: the GPU machine has no tokenizer). Each call here runs one slice of the
# table, named by its first argument; the rest are accuracy.py's options, after (so overriding)
# the defaults below. Carry .whl (optimum-quanto, hqq and termcolor wheels: transformers' quanto
# and HQQ caches); without it, the wheels calls 1 and 2 put in /tmp/site are used.
#
#   bash bench/transformers/gpu_accuracy.sh NAME [accuracy.py options]
#
#   call 3: bash bench/transformers/gpu_accuracy.sh c512-2048 --contexts 512,2048 --decode-windows 0 --prompts 0 \
#             --batch-tokens 32768 --deadline 300
#   call 4: bash bench/transformers/gpu_accuracy.sh c8192 --contexts 8192 --decode-windows 0 --prompts 0 \
#             --batch-tokens 32768
#   call 5: bash bench/transformers/gpu_accuracy.sh decode-gen --contexts "" --decode-windows 4 --prompts 50 \
#             --batch-tokens 4096
#   then here: python3 bench/transformers/plot.py --merge accuracy-c512-2048.json accuracy-c8192.json \
#                accuracy-decode-gen.json bench/results/DATE-transformers-accuracy-h200.json
# --batch-tokens puts that many tokens' windows through one cache per forward (one sequence each:
# the same numbers as one window at a time, checked on the CPU; HQQ's rows always run alone).
#
# $OUT gets accuracy-NAME.json (rewritten after every window, so a call cut off leaves what it
# measured) and accuracy-NAME.log (a line per window with the time and the time still to go).
# accuracy.py starts nothing new after --deadline seconds (default 440) and is killed at 500, so
# a call stays under 9 minutes (the 10 a command may take, with room to start).
set -uo pipefail
OUT=${OUT:-/tmp/nvfp4kv-out}
STAGE=/tmp/nvfp4kv-transformers19   # gpu.sh's: outlives a call while the machine is warm
mkdir -p "$OUT" "$STAGE"
cd "$(dirname "$0")/../.."
name=${1:?"usage: gpu_accuracy.sh NAME [accuracy.py options]"}
shift
for part in a b; do
  [ -d ".carry/transformers19-$part" ] && cp -r ".carry/transformers19-$part" "$STAGE/"
  [ -d "$STAGE/transformers19-$part" ] ||
    { echo "part $part is not in $STAGE: run bench/transformers/gpu.sh's calls 1 and 2 first (the machine was given back?)"; exit 2; }
done
[ -f "$STAGE/transformers19-a/accuracy-inputs.npz" ] ||
  { echo "part a has no accuracy-inputs.npz: stage it again with this tree's bench/transformers/stage_gpu.py"; exit 2; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
(cd /tmp && python3 -c 'import nvfp4kv.transformers') || { echo "nvfp4kv is not installed: run gpu.sh's call 1 first"; exit 2; }
(cd /tmp && python3 -c 'import optimum.quanto, hqq.core.quantize; print("optimum-quanto and hqq import")') ||
  echo "a peer cache does not import: accuracy.py reports its rows as failed"
rows=bf16,fp8,nvfp4,nvfp4-cal,nvfp4-4over6,nvfp4-4over6-cal,quanto-int4,quanto-int2,hqq-4
echo "=== accuracy.py, slice $name ($(date +%T))"
timeout 500 python3 bench/transformers/accuracy.py --staged "$STAGE/transformers19-a" "$STAGE/transformers19-b" \
  --device cuda --threads 8 --rows "$rows" --tokens 131072 --deadline 440 --out "$OUT/accuracy-$name.json" "$@" \
  2>&1 | tee "$OUT/accuracy-$name.log" | grep -v "window [0-9]*/" | tail -40
rc=${PIPESTATUS[0]}
grep "window [0-9]*/" "$OUT/accuracy-$name.log" | tail -3
echo "accuracy.py rc $rc ($(date +%T)); $OUT/accuracy-$name.json"
exit "$rc"
