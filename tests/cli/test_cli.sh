#!/usr/bin/env bash
# The CLI's contract (docs/cli-json.md): exit 0 on success, 1 on a negative verdict
# (rejected layout, disagreement, failed check), 2 on unusable input, 3 for what this
# machine or build cannot do; reports on stdout whatever their verdict, usage errors on
# stderr; --json output valid against docs/cli-json.schema.json.
# usage: test_cli.sh PATH/TO/nvfp4kv
set -u
bin=$1
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small="--heads 1 --head-dim 128 --tokens-per-page 16 --pages 1"

# expect CODE "pattern on stdout+stderr" command...
expect() {
  local code=$1 pattern=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" = "$code" ] && grep -qE -- "$pattern" "$tmp/out" "$tmp/err"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $* -> exit $got (want $code), pattern '$pattern'"
    head -5 "$tmp/out" "$tmp/err"
  fi
}

expect 0 "vllm-packed-nhd-reader-sm120 +REJECTED" "$bin" layout presets
expect 0 "former name vllm-packed-nhd-reader" "$bin" layout presets
expect 0 "sound: " "$bin" layout check nvfp4kv-native-layers --layers 64 --pages 200000 --heads 8 --head-dim 128 --tokens-per-page 16
expect 1 'k_data\[layer 0, page 0, token 8, head 0, byte 0\] and k_scale\[layer 0, page 0, token 0, head 0, group 0\] share byte 1024 of buffer "kv"' \
  "$bin" layout check vllm-packed-nhd-reader $small
expect 1 "share byte 72" "$bin" layout check vllm-packed-nhd-writer $small
expect 1 "place 2160 of 2304 elements differently" "$bin" layout compare vllm-packed-nhd-writer vllm-packed-nhd-reader $small
expect 0 "agree: " "$bin" layout compare vllm-legacy-hnd vllm-packed-hnd $small
# vLLM #50084: upstream's writer interleaves V scales, SM120 reads them linearly.
expect 1 "place 120 of 2304 elements differently \(k_data 0, k_scale 0, v_data 0, v_scale 120\)" \
  "$bin" layout compare vllm-legacy-hnd-writer-upstream vllm-legacy-hnd-reader-sm120 $small
expect 0 "agree: " "$bin" layout compare vllm-legacy-hnd-writer-upstream vllm-legacy-hnd-reader-sm100 $small
expect 1 "v_scale\[layer 0, page 0, token 0, head 0, group 4\] and v_scale\[layer 0, page 0, token 4, head 0, group 0\] share byte" \
  "$bin" layout check vllm-legacy-hnd-writer-upstream --heads 1 --head-dim 96 --tokens-per-page 16 --pages 3
expect 0 "V scale: side \+ H\*N\*dd \+ h\*N\*sd \+ swizzled_t" "$bin" layout show vllm-legacy-hnd-writer-upstream $small
expect 1 "!!!!" "$bin" layout show vllm-packed-nhd-writer $small
expect 0 "KKKK" "$bin" layout show vllm-packed-nhd-rows $small
expect 0 '"inner": 4' "$bin" layout show trtllm --json $small
expect 0 "token capacity" "$bin" layout plan --layers 32 --kv-heads 8 --head-dim 128 --memory 40GiB --tp-size 2 --tp-rank 1
expect 2 "pad the head dim up to 112" "$bin" layout plan --layers 32 --kv-heads 8 --head-dim 100 --pages 10
expect 2 "leaves sizes open: give --pages, --tokens-per-page, --heads, --head-dim" "$bin" layout check vllm-legacy-hnd
expect 2 "neither a preset nor a readable file" "$bin" layout check no-such-layout
expect 2 'unknown option "--bogus"' "$bin" layout check nvfp4kv-native --bogus 1
expect 2 "unknown command" "$bin" frobnicate
expect 0 "round trip: PASS" "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only
# A layout file of one's own, with a typo: named, not defaulted.
sed 's/"token": "dd"/"tokn": "dd"/' "$(dirname "$0")/../../layouts/vllm-legacy-hnd-writer-sm12x.json" > "$tmp/typo.json"
expect 2 'unknown key "tokn"' "$bin" layout check "$tmp/typo.json" $small
# A cache format: printed with its bits per value, checked against the layout's sizes.
echo '{"nvfp4kv_format": 1, "layers": [{"k": {"element": "fp8_e4m3"}, "v": {"rule": "4over6", "rotation": 64}}]}' > "$tmp/format.json"
expect 0 "layer 0: K fp8_e4m3; V nvfp4 4over6, rotation 64 \(6.25 bits\)" "$bin" layout show nvfp4kv-native $small --k-element fp8_e4m3 --format "$tmp/format.json"
expect 2 "format.layers\[0\].k.element: fp8_e4m3, but the layout holds K as nvfp4" "$bin" layout show nvfp4kv-native $small --format "$tmp/format.json"
# FP8 pages: the layout holds them (a K row of D bytes, no K scales), sizes them and proves them.
expect 0 "elements K fp8_e4m3: data row 128 B, no scales" "$bin" layout show nvfp4kv-native $small --k-element fp8_e4m3
expect 0 '"k": "fp8_e4m3"' "$bin" layout show nvfp4kv-native $small --k-element fp8_e4m3 --json
expect 0 "elements        K fp8_e4m3, V nvfp4" "$bin" layout plan --layers 4 --kv-heads 8 --head-dim 128 --pages 10 --k-element fp8_e4m3
expect 1 "share byte" "$bin" layout check nvfp4kv-native-v1 $small --k-element fp8_e4m3
expect 0 "k_data 16 B k_scale none v_data 16 B" "$bin" layout check nvfp4kv-native $small --k-element fp8_e4m3
expect 1 "k_data token stride is 128, the reader says 64" "$bin" layout compare nvfp4kv-native nvfp4kv-native-v1 $small --k-element fp8_e4m3
expect 2 "round trip checks NVFP4 pages only" "$bin" roundtrip --layout nvfp4kv-native --k-element fp8_e4m3 --cpu-only
expect 2 "--k-element expects nvfp4 or fp8_e4m3" "$bin" layout show nvfp4kv-native $small --k-element fp4
expect 0 "plain NVFP4 for K and V in every layer" "$bin" layout show nvfp4kv-native $small
expect 2 "format.layers\[0\].v.rotation: 64 does not divide the head dim 80" "$bin" layout show nvfp4kv-native --heads 1 --head-dim 80 --tokens-per-page 16 --pages 1 --format "$tmp/format.json"
echo '{"nvfp4kv_format": 1, "k_mean": [1, 2]}' > "$tmp/format-mu.json"
expect 2 "format.k_mean: 2 values, expected \(layers 1, heads 1, D 128\) = 128" "$bin" layout show nvfp4kv-native $small --format "$tmp/format-mu.json"
echo '{"nvfp4kv_format": 2}' > "$tmp/format-v2.json"
expect 2 "format.nvfp4kv_format: version 2" "$bin" layout show nvfp4kv-native $small --format "$tmp/format-v2.json"

# Hostile input (issue 9): each reproducer answers or is refused with work bounded by
# construction (closed forms, counted steps, caps; the counts are in the messages), never by
# a clock: a run past 120 s counts as a hang, nothing shorter fails. A refusal (exit 2) is one
# line on stderr and nothing on stdout; a negative verdict (exit 1) is on stdout like any
# report (issue 12), stderr empty.
# expect_bounded CODE "pattern" command...
expect_bounded() {
  local code=$1 pattern=$2
  shift 2
  timeout 120 "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$? why=""
  [ "$got" != 124 ] || why="hung (killed after 120 s)"
  [ "$got" = "$code" ] || why="$why; exit $got (want $code)"
  grep -qE -- "$pattern" "$tmp/out" "$tmp/err" || why="$why; no '$pattern'"
  if [ "$code" = 2 ] && { [ -s "$tmp/out" ] || [ "$(wc -l <"$tmp/err")" != 1 ]; }; then why="$why; not one line on stderr"; fi
  if [ "$code" = 1 ] && { [ ! -s "$tmp/out" ] || [ -s "$tmp/err" ]; }; then why="$why; the verdict not on stdout alone"; fi
  if [ -z "$why" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $(echo "$*" | cut -c1-300) -> $why"
    head -c 600 "$tmp/out" "$tmp/err"
  fi
}
repeat() { head -c "$2" /dev/zero | tr '\0' "$1"; }
# splice FILE MARK TEXT_FILE: FILE with its first MARK replaced by the contents of TEXT_FILE
# (the texts are too long for a sed argument).
splice() { awk -v mark="$2" -v from="$3" 'BEGIN { getline text < from } !done && (i = index($0, mark)) {
  $0 = substr($0, 1, i - 1) text substr($0, i + length(mark)); done = 1 } { print }' "$1"; }
legacy="$(dirname "$0")/../../layouts/vllm-legacy-hnd-writer-sm12x.json"
k_page='"page": "2\*H\*N\*F", "head": "N\*dd", "token": "dd"}'
d32="--pages 2 --heads 2 --head-dim 32 --tokens-per-page 16"
# 1. the 4-token interleave at D 32: TensorRT-LLM's spelling is sound there, FlashInfer's cannot be formed.
expect_bounded 0 "sound: " "$bin" layout show trtllm $d32
expect_bounded 0 "agree: " "$bin" layout compare trtllm trtllm $d32
# ... and below 4 tokens per page, where the interleave is a plain stride.
expect_bounded 0 "sound: " "$bin" layout check trtllm --pages 1 --heads 1 --head-dim 16 --tokens-per-page 3
expect_bounded 2 "v_scale.column: inner extent sd/4 = 0 at head dim 32" "$bin" layout show flashinfer-trtllm-gen-hnd $d32
expect_bounded 2 "inner extent sd/4 = 0" "$bin" layout compare flashinfer-trtllm-gen-hnd flashinfer-hnd $d32
# 2. 100000 nested arrays (200 KB).
{ printf '{"name":"t","buffers":['; repeat '[' 100000; repeat ']' 100000; printf ']}'; } >"$tmp/deep.json"
expect_bounded 2 "nested more than 32 levels deep" "$bin" layout check "$tmp/deep.json"
# 3. 200000 unary minus signs.
{ printf '"page": "'; repeat - 200000; printf '1", "head": "N*dd"'; } >"$tmp/minus"
splice "$legacy" '"page": "2*H*N*F", "head": "N*dd"' "$tmp/minus" >"$tmp/minus.json"
expect_bounded 2 'k_data.page: expression "-+"\.\.\. \(200001 characters\): nested more than 64 levels deep' \
  "$bin" layout check "$tmp/minus.json" $small
# 4. plan at 2^62 kv heads.
expect_bounded 2 "plan: .*integer overflow" "$bin" layout plan --layers 1 --kv-heads 4611686018427387904 --head-dim 128 --pages 1
# 5. compare at ten million heads: counted, not enumerated.
expect_bounded 0 "agree: .* 23040000000 elements" "$bin" layout compare vllm-legacy-hnd vllm-legacy-hnd --pages 1 --heads 10000000 --head-dim 128 --tokens-per-page 16
expect_bounded 1 "DISAGREE: .* 23039999424000 of 23040000000000 elements" "$bin" layout compare vllm-legacy-hnd vllm-legacy-nhd --pages 1000 --heads 10000000 --head-dim 128 --tokens-per-page 16
# 6. totals past 64 bits.
big="--layers 1099511627776 --pages 200000 --heads 8 --head-dim 128 --tokens-per-page 16"
expect_bounded 2 "layers 1099511627776 x pages 200000 .* the bound on any count" "$bin" layout check nvfp4kv-native $big
expect_bounded 2 "layers 4611686018427387904 x pages 200000" "$bin" layout check nvfp4kv-native --layers 4611686018427387904 --pages 200000 --heads 8 --head-dim 128 --tokens-per-page 16
expect_bounded 2 "the bound on any count" "$bin" layout show nvfp4kv-native $big
expect_bounded 2 "the bound on any count" "$bin" layout compare nvfp4kv-native nvfp4kv-native-layers $big
# 7. coordinates outside the cache, and a buffer without "bytes" at 2^61 pages.
expect_bounded 2 "page 9223372036854775807 is outside the cache's \[0, 4\)" "$bin" layout show vllm-legacy-hnd --page 9223372036854775807 --pages 4 --heads 8 --head-dim 128 --tokens-per-page 16
expect_bounded 2 "layer 4611686018427387904 is outside the cache's \[0, 1\)" "$bin" layout show vllm-legacy-hnd --layer 4611686018427387904 $small
expect_bounded 2 "page -1 is outside" "$bin" layout show vllm-legacy-hnd --page -1 $small
expect_bounded 2 "the byte map of one page draws heads 10000000" "$bin" layout show vllm-legacy-hnd --pages 4 --heads 10000000 --head-dim 128 --tokens-per-page 16
sed 's/, "bytes": "P\*2\*H\*N\*F"//' "$legacy" >"$tmp/open.json"
expect_bounded 0 "sound: " "$bin" layout check "$tmp/open.json" $small
expect_bounded 2 "pages 2305843009213693952 .* the bound on any count" "$bin" layout check "$tmp/open.json" --pages 2305843009213693952 --heads 1 --head-dim 16 --tokens-per-page 1
# 8. duplicate keys.
sed "0,/$k_page/s//\"page\": 72, \"page\": 1, \"head\": \"N*dd\", \"token\": \"dd\"}/" "$legacy" >"$tmp/dup-key.json"
expect_bounded 2 'layout.regions.k_data: key "page" appears twice' "$bin" layout check "$tmp/dup-key.json" $small
sed 's/"regions": {/"regions": {"k_data": {"page": 0, "head": 0, "token": 0},/' "$legacy" >"$tmp/dup-region.json"
expect_bounded 2 'layout.regions: key "k_data" appears twice' "$bin" layout check "$tmp/dup-region.json" $small
# check's own work: bounded for the whole proof, refused up front, UNDECIDED rather than REJECTED.
expect_bounded 2 "UNDECIDED: cannot prove the layout sound at these sizes: .* 8388608 \(2\^23\)" "$bin" layout check vllm-legacy-nhd --pages 4 --heads 7000 --head-dim 128 --tokens-per-page 16
# Smaller ones: integers past int64, long names, nine buffers, host allocation, demo size, streams.
sed "0,/$k_page/s//\"page\": 18446744073709551616, \"head\": \"N*dd\", \"token\": \"dd\"}/" "$legacy" >"$tmp/huge.json"
expect_bounded 2 "layout.regions.k_data.page: 1.8446744073709552e\+19 is outside the 64-bit signed integers" "$bin" layout check "$tmp/huge.json" $small
repeat n 2000000 >"$tmp/n"
splice "$legacy" vllm-legacy-hnd "$tmp/n" >"$tmp/long-name.json"
expect_bounded 2 "layout text is more than 1048576 bytes" "$bin" layout check "$tmp/long-name.json" $small
sed "s/\"name\": \"vllm-legacy-hnd-writer-sm12x\"/\"name\": \"$(repeat n 1000)\"/" "$legacy" >"$tmp/name.json"
expect_bounded 2 '"n{48}"\.\.\. \(1000 characters\) is not a name' "$bin" layout check "$tmp/name.json" $small
sed 's/"buffers": \[{"name": "kv", "bytes": "P\*2\*H\*N\*F"}\]/"buffers": [{"name": "kv", "bytes": "P*2*H*N*F"}, {"name": "b1"}, {"name": "b2"}, {"name": "b3"}, {"name": "b4"}, {"name": "b5"}, {"name": "b6"}, {"name": "b7"}, {"name": "b8"}]/' \
  "$legacy" >"$tmp/nine.json"
expect_bounded 2 "buffers: 9 buffers; a layout has at most 8" "$bin" layout check "$tmp/nine.json" $small
expect_bounded 2 "roundtrip allocates the cache of one layer on the host: .* 268435456 \(256 MiB\)" "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only --pages 1099511627776
expect_bounded 2 "pass --tokens 512 or fewer" "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only --heads 128 --head-dim 256
expect_bounded 2 "--tokens must be in \[1, 8192\], got 1048576" "$bin" demo --tokens 1048576
# The demo's accuracy tables say what they are measured against, and why 4over6 loses on K outliers.
expect 0 "The reference point is FP8 E4M3" "$bin" demo --cpu-only --tokens 64
expect 0 "on the K-outlier row here 4over6 is (higher|not higher) \\([0-9.]+ against amax/6's [0-9.]+\\)" "$bin" demo --cpu-only --tokens 64
expect_bounded 1 "REJECTED: .* share byte 576" "$bin" roundtrip --layout vllm-packed-nhd-writer --cpu-only
expect_bounded 1 "REJECTED: " "$bin" layout check vllm-packed-nhd-reader $small
expect_bounded 1 "DISAGREE: " "$bin" layout compare vllm-packed-nhd-writer vllm-packed-nhd-reader $small
expect_bounded 2 'unknown option "--x+"\.\.\. \(100002 characters\)' "$bin" layout check nvfp4kv-native "--$(repeat x 100000)"

# ---- issue 12: the CLI people expect -------------------------------------------------
root="$(cd "$(dirname "$0")/../.." && pwd)"
validate="python3 $root/tests/json/validate.py $root/docs/cli-json.schema.json"
s2="--heads 2 --head-dim 128 --tokens-per-page 16 --pages 2"
# expect_streams CODE "pattern" command...: the report and its verdict on stdout, nothing on stderr.
expect_streams() {
  local code=$1 pattern=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" = "$code" ] && grep -qE -- "$pattern" "$tmp/out" && [ ! -s "$tmp/err" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL (streams): $* -> exit $got (want $code), pattern '$pattern' on stdout, stderr empty"
    head -5 "$tmp/out" "$tmp/err"
  fi
}
# expect_json CODE command...: exit CODE, stdout valid against the schema, nothing on stderr.
expect_json() {
  local code=$1
  shift
  "$@" --json >"$tmp/out.json" 2>"$tmp/err"
  local got=$?
  if [ "$got" = "$code" ] && $validate "$tmp/out.json" >"$tmp/why" && [ ! -s "$tmp/err" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL (json): $* --json -> exit $got (want $code)"
    head -5 "$tmp/why" "$tmp/err"
  fi
}

expect 0 "^nvfp4kv [0-9]+\.[0-9]+\.[0-9]+: (CUDA kernels for sm_[0-9]+.* \(nvcc [0-9.]+\)|CPU only)" "$bin" --version
# --help on every command, listing every option.
expect 0 "usage: nvfp4kv layout plan" "$bin" layout plan --help
for opt in layers kv-heads head-dim tokens-per-page memory pages tp-size tp-rank layout cross-layer v-scales k-element v-element json help; do
  expect 0 "^  --$opt( |$)" "$bin" layout plan --help
done
for opt in layers pages heads head-dim tokens-per-page examples json; do expect 0 "^  --$opt " "$bin" layout compare --help; done
for cmd in "layout presets" "layout show" "layout check" "roundtrip" "demo" "bench decode" "bench prefill" "conformance gen" \
           "conformance check-write" "conformance check-read"; do
  expect 0 "usage: nvfp4kv $cmd" "$bin" $cmd --help
done
expect 0 "usage: nvfp4kv layout compare" "$bin" help layout compare
for opt in layout dir cache inferred examples json; do expect 0 "^  --$opt " "$bin" conformance check-write --help; done
# "Did you mean" for commands, subcommands, options and presets.
expect 2 'unknown command "layuot" \(did you mean "layout"\?\)' "$bin" layuot
expect 2 'unknown layout subcommand "chek" \(did you mean "check"\?\)' "$bin" layout chek x
expect 2 'unknown conformance subcommand "check-writ" \(did you mean "check-write"\?\)' "$bin" conformance check-writ
expect 2 'unknown option "--head-di" \(did you mean "--head-dim"\?\)' "$bin" layout check nvfp4kv-native --head-di 64
expect 2 'did you mean "vllm-packed-nhd-rows"\?' "$bin" layout check vllm-packed-nhd-rwos $small
# A size the file fixes is not overridden by the command line; the ones assumed are printed.
"$bin" layout show vllm-legacy-hnd-writer-sm12x $s2 --json | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["layout_json"]))' >"$tmp/fixed.json"
expect 2 'layout "vllm-legacy-hnd-writer-sm12x" fixes pages 2; --pages 3 contradicts it' "$bin" layout check "$tmp/fixed.json" --pages 3
expect 0 "sound: " "$bin" layout check "$tmp/fixed.json" --pages 2
expect 0 "^assumed: layers 1 \(neither the layout nor the command line sets it; --layers does\)" "$bin" layout check nvfp4kv-native $s2
"$bin" layout check nvfp4kv-native $s2 --layers 1 >"$tmp/out" && ! grep -q assumed "$tmp/out" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: an assumed size printed though --layers was given"; }
expect 0 "^assumed: layers 1, pages 64, tokens per page 16, heads 8, head dim 128" "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only --tokens 16
# Agreement and disagreement on the same stream; compare's examples spread and its stride-level diagnosis.
expect_streams 0 "^agree: " "$bin" layout compare vllm-legacy-hnd vllm-packed-hnd $s2
expect_streams 1 "^DISAGREE: " "$bin" layout compare vllm-packed-nhd-writer vllm-packed-nhd-reader $s2
expect_streams 1 "REJECTED: " "$bin" layout check vllm-packed-nhd-reader $s2
expect_streams 1 "k_data token stride is 128 \(H\*dd\), the reader says 256 \(2\*H\*dd\)" "$bin" layout compare vllm-packed-nhd-writer vllm-packed-nhd-reader $s2
expect_streams 1 "v_scale token is \(4,_\):\(1,32\), the reader says 8 \(sd\): V scales are in the 4-token interleave" \
  "$bin" layout compare vllm-legacy-hnd-writer-upstream vllm-legacy-hnd-reader-sm120 $s2
"$bin" layout compare vllm-packed-nhd-writer vllm-packed-nhd-reader $s2 --examples 8 >"$tmp/out"
examples=$(grep -cE "^  (k|v)_(data|scale)\[" "$tmp/out")
regions=$(grep -oE "^  (k|v)_(data|scale)" "$tmp/out" | sort -u | wc -l)
if [ "$examples" = 8 ] && [ "$regions" = 4 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --examples 8 gave $examples examples over $regions regions"; cat "$tmp/out"; fi
# plan sizes a layout of one's own; its JSON has the summary numbers.
expect 0 "^layout          flashinfer-nhd \(4 buffers\)" "$bin" layout plan --layout flashinfer-nhd --layers 4 --kv-heads 8 --head-dim 128 --memory 1GiB
expect 2 "plan: layout \"vllm-packed-nhd-writer-sm12x\" at .* is REJECTED" "$bin" layout plan --layout vllm-packed-nhd-writer-sm12x --layers 4 --kv-heads 8 --head-dim 128 --pages 8
expect 0 '"token_capacity": ' "$bin" layout plan --layers 32 --kv-heads 8 --head-dim 128 --memory 40GiB --json
# --json for every command, valid against the schema.
expect_json 0 "$bin" layout presets
expect_json 0 "$bin" layout show trtllm $s2
expect_json 0 "$bin" layout show nvfp4kv-native $small --k-element fp8_e4m3 --format "$tmp/format.json"
expect_json 0 "$bin" layout check nvfp4kv-native $small --k-element fp8_e4m3
# calibrate: samples from numpy (where it is installed), shapes checked, nothing written on refusal.
if python3 -c "import numpy" 2>/dev/null; then
  python3 -c "
import numpy as np, sys
g = np.random.default_rng(0)
a = {'%s_%d' % (s, l): g.standard_normal((64, 2, 32)).astype(np.float32) for s in 'kv' for l in range(4)}
np.savez(sys.argv[1], **a)
del a['v_3']
np.savez(sys.argv[2], **a)" "$tmp/samples.npz" "$tmp/samples-missing.npz"
  expect 0 "policy for 5 bits per value: 4.9375" "$bin" calibrate --samples "$tmp/samples.npz" --bits 5 --out "$tmp/cal.json"
  expect_json 0 "$bin" calibrate --samples "$tmp/samples.npz" --bits 5 --out "$tmp/cal.json"
  expect 2 "missing v_3" "$bin" calibrate --samples "$tmp/samples-missing.npz" --out "$tmp/cal-missing.json"
  expect 2 "\[4.5, 8\]" "$bin" calibrate --samples "$tmp/samples.npz" --bits 3 --out "$tmp/cal-missing.json"
  if [ -e "$tmp/cal-missing.json" ]; then fail=$((fail + 1)); echo "FAIL: a refused calibrate wrote its --out"; fi
fi
expect_json 1 "$bin" layout show vllm-packed-nhd-writer-sm12x $s2
expect_json 0 "$bin" layout check nvfp4kv-native-layers --layers 4 $s2
expect_json 1 "$bin" layout check vllm-packed-nhd-reader-sm120 $s2
expect_json 0 "$bin" layout compare trtllm trtllm $s2
expect_json 1 "$bin" layout compare vllm-legacy-hnd-writer-upstream vllm-legacy-hnd-reader-sm120 $s2
expect_json 0 "$bin" layout plan --layers 32 --kv-heads 8 --head-dim 128 --memory 40GiB --tp-size 2 --tp-rank 1
expect_json 0 "$bin" layout plan --layout vllm-legacy-nhd --layers 2 --kv-heads 4 --head-dim 64 --pages 16
expect_json 0 "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only --tokens 64
expect_json 1 "$bin" roundtrip --layout vllm-packed-nhd-writer --cpu-only --tokens 64
# A transform bench does not know is a usage error, GPU or not (it is checked before anything runs).
expect 2 "rotate-q. is none of rotate-k, rotate-v, smooth-k" "$bin" bench decode --batch 1 --context 64 --transform plain,rotate-q
expect 2 "names smooth-k twice" "$bin" bench prefill --batch 1 --prompt 64 --transform smooth-k+smooth-k
# Without a GPU the message says there is none (or that this build has no CUDA), and bench exits 3.
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect 3 "no CUDA GPU on this machine|built without CUDA" "$bin" bench decode --batch 1 --context 64 --transform plain,rotate-k+smooth-k
  expect 3 "no CUDA GPU on this machine|built without CUDA" "$bin" bench prefill --batch 1 --prompt 64 --cached 0,32
  expect 0 "not run: (no CUDA GPU on this machine|nvfp4kv was built without CUDA)" "$bin" roundtrip --layout nvfp4kv-native --tokens 64
fi
# Progress on stderr once work takes more than two seconds.
"$bin" roundtrip --layout nvfp4kv-native --cpu-only --pages 2048 --heads 4 --tokens 32000 >"$tmp/out" 2>"$tmp/err"
if grep -q "^nvfp4kv roundtrip: .*%" "$tmp/err" && grep -q "round trip: PASS" "$tmp/out"; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "FAIL: no progress on stderr from a long round trip"; head -3 "$tmp/err"; fi

# ---- issue 12: the conformance kit, with docs/conformance.md's engine (numpy) -------------
engine="python3 $root/examples/conformance/vllm_packed_nhd.py"
kit="$tmp/kit"
s16="--heads 2 --head-dim 128 --tokens-per-page 16 --pages 16"
expect 0 "conformance kit for \"vllm-packed-nhd-rows\"" "$bin" conformance gen --layout vllm-packed-nhd-rows $s16 --out "$kit" 2>/dev/null
expect_json 0 "$bin" conformance gen --layout vllm-packed-nhd-rows $s16 --out "$tmp/kit-json"
expect 1 "conformance needs a sound layout" "$bin" conformance gen --layout vllm-packed-nhd-writer-sm12x $s2 --out "$tmp/nokit"
python3 -c "import numpy as np; a = np.load('$kit/k.npy'); b = np.load('$kit/k.f32.npy'); import sys; sys.exit(not (a.dtype == np.uint16 and (a.astype(np.uint32) << 16).view(np.float32).tolist() == b.tolist()))" \
  && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: k.npy (bf16 bits) and k.f32.npy disagree under numpy"; }
$engine write "$kit" "$tmp/written.bin"
$engine write "$kit" "$tmp/fixed.bin" --physical-rows
expect_streams 1 "k_data token stride is 128 \(H\*dd\), the layout says 288 \(2\*H\*F\)" \
  "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache kv="$tmp/written.bin" --inferred "$tmp/writer.json"
expect 1 "^DISAGREE: \"vllm-packed-nhd-rows-as-written\"" "$bin" layout compare "$tmp/writer.json" vllm-packed-nhd-rows
expect 1 "REJECTED: .* share byte" "$bin" layout check "$tmp/writer.json"
expect_streams 0 "k_data .*rounding-only \(reciprocal-multiply\)" "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache "$tmp/fixed.bin"
expect_json 1 "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache kv="$tmp/written.bin"
expect_json 0 "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache kv="$tmp/fixed.bin"
$engine read "$kit" "$tmp/k.npy" "$tmp/v.npy"
$engine read "$kit" "$tmp/k2.npy" "$tmp/v2.npy" --physical-rows
expect_streams 1 "aliased data/scale bytes" "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --k "$tmp/k.npy" --v "$tmp/v.npy"
expect_streams 0 "check-read: PASS" "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --k "$tmp/k2.npy" --v "$tmp/v2.npy"
expect_json 1 "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --k "$tmp/k.npy" --v "$tmp/v.npy"
$engine attend "$kit" "$tmp/out.npy"
$engine attend "$kit" "$tmp/out2.npy" --physical-rows
expect 1 "probe outputs right" "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --out "$tmp/out.npy"
expect 0 "256 of 256 probe outputs right" "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --out "$tmp/out2.npy"
expect_json 0 "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --out "$tmp/out2.npy"
# Unusable input: exit 2, one line on stderr.
expect 2 "--pages 4 contradicts the kit in .*, generated at layers 1, pages 16" "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache "$tmp/fixed.bin" --pages 4
expect 2 "--k-element fp8_e4m3 contradicts the kit in .*, whose pages hold nvfp4" "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache "$tmp/fixed.bin" --k-element fp8_e4m3
expect 2 "was generated for layout \"vllm-packed-nhd-rows\"" "$bin" conformance check-write --layout vllm-legacy-nhd --dir "$kit" --cache "$tmp/fixed.bin"
expect 2 "--cache kv=FILE is missing" "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit"
expect 2 'no buffer "kvv" \(did you mean "kv"\?\)' "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache kvv="$tmp/fixed.bin"
head -c 100 /dev/zero >"$tmp/short.bin"
expect 2 "is 73728 bytes in the layout, the dump holds 100" "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache kv="$tmp/short.bin"
expect 2 "give --k FILE and --v FILE" "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --k "$tmp/k.npy"
expect 2 "is not a .npy file" "$bin" conformance check-read --layout vllm-packed-nhd-rows --dir "$kit" --out "$tmp/fixed.bin"
# The files the conformance commands read, hostile: each refused (exit 2, one line) before it is
# read whole, parsed without bounds or waited on; the hang detector is expect_bounded's.
rd="check-read --layout vllm-packed-nhd-rows --dir"
wr="check-write --layout vllm-packed-nhd-rows --dir"
cp -r "$kit" "$tmp/deep"
python3 - "$tmp/deep/manifest.json" <<'PY'
import sys
p = sys.argv[1]
t = open(p).read()
i, j = t.index('"layout"'), t.index('"dims"')
open(p, "w").write(t[:i] + '"layout": ' + "[" * 100000 + "]" * 100000 + ",\n  " + t[j:])
PY
expect_bounded 2 "manifest.layout\[0\]\[0\].*: nested more than 32 levels deep" "$bin" conformance $wr "$tmp/deep" --cache "$tmp/fixed.bin"
expect_bounded 2 "nested more than 32 levels deep" "$bin" conformance $rd "$tmp/deep" --k "$tmp/k2.npy" --v "$tmp/v2.npy"
cp -r "$kit" "$tmp/dup"
sed -i '0,/"seed"/s//"seed": 7, "seed"/' "$tmp/dup/manifest.json"
expect_bounded 2 'manifest: key "seed" appears twice' "$bin" conformance $wr "$tmp/dup" --cache "$tmp/fixed.bin"
expect_bounded 2 'kv \(/dev/zero\) is a character device' "$bin" conformance $wr "$kit" --cache kv=/dev/zero
cp -r "$kit" "$tmp/zero" && ln -sf /dev/zero "$tmp/zero/cache/kv.bin"
expect_bounded 2 "the kit's cache .* is a character device" "$bin" conformance $wr "$tmp/zero" --cache "$tmp/fixed.bin"
truncate -s 4G "$tmp/4g.bin"
expect_bounded 2 "4294967296 bytes .*; at most 73728 bytes" "$bin" conformance $wr "$kit" --cache kv="$tmp/4g.bin"
python3 -c "
import numpy as np
with open('$tmp/2g.npy', 'wb') as f:  # a 2 GiB float32 array, sparse: its header, then a hole
    np.lib.format.write_array_header_1_0(f, {'descr': '<f4', 'fortran_order': False, 'shape': (2097152, 2, 128)})
    f.truncate(f.tell() + 2097152 * 2 * 128 * 4)"
expect_bounded 2 "--k .* has shape \(2097152, 2, 128\); it must be \(128, 2, 128\)" "$bin" conformance $rd "$kit" --k "$tmp/2g.npy" --v "$tmp/v2.npy"
mkfifo "$tmp/fifo"
expect_bounded 2 "layout file .* is a FIFO" "$bin" layout check "$tmp/fifo"
expect_bounded 2 "--cache kv .* is a FIFO" "$bin" conformance $wr "$kit" --cache kv="$tmp/fifo"
expect_bounded 2 "--k .* is a FIFO" "$bin" conformance $rd "$kit" --k "$tmp/fifo" --v "$tmp/v2.npy"
expect_bounded 2 "--v .* is a FIFO" "$bin" conformance $rd "$kit" --k "$tmp/k2.npy" --v "$tmp/fifo"
expect_bounded 2 "--out .* is a FIFO" "$bin" conformance $rd "$kit" --out "$tmp/fifo"
expect_bounded 2 "--inferred .* is a FIFO" "$bin" conformance $rd "$kit" --out "$tmp/out2.npy" --inferred "$tmp/fifo"
expect_bounded 2 "is a directory" "$bin" conformance $wr "$kit" --cache kv="$tmp"
# The reader's arrays: its shape exactly, in a type it produced (Python's check_read refuses the same).
python3 - "$tmp" <<'PY'
import sys, numpy as np
t = sys.argv[1]
k = np.load(t + "/k2.npy")
np.save(t + "/k-transposed.npy", np.ascontiguousarray(k.reshape(-1, 2, 128).transpose(1, 0, 2)))
np.save(t + "/k-flat.npy", k.reshape(-1))
np.save(t + "/k-f64.npy", k.astype(np.float64))
np.save(t + "/k-empty.npy", np.zeros((0, 2, 128), np.float32))
PY
expect_bounded 2 "--k .* has shape \(2, 128, 128\); it must be \(128, 2, 128\)" "$bin" conformance $rd "$kit" --k "$tmp/k-transposed.npy" --v "$tmp/v2.npy"
expect_bounded 2 "has shape \(32768,\); it must be \(128, 2, 128\)" "$bin" conformance $rd "$kit" --k "$tmp/k-flat.npy" --v "$tmp/v2.npy"
expect_bounded 2 "element type '<f8' is not float32, float16 or bfloat16" "$bin" conformance $rd "$kit" --k "$tmp/k-f64.npy" --v "$tmp/v2.npy"
expect_bounded 2 "has shape \(0, 2, 128\); it must be \(128, 2, 128\)" "$bin" conformance $rd "$kit" --k "$tmp/k-empty.npy" --v "$tmp/v2.npy"
# A writer that never writes V scales: v_scale misplaced and its map unknown, so --inferred
# writes nothing and says so (no claimed layout passed off as the writer's).
python3 - "$kit" "$tmp/fixed.bin" "$tmp/no-v-scales.bin" <<'PY'
import sys, numpy as np
kit, src, dst = sys.argv[1:]
b = bytearray(open(src, "rb").read())
H, N, D = 2, 16, 128
F, dd = D // 2 + D // 16, D // 2
for slot in np.load(kit + "/slot_mapping.npy"):
    if slot < 0: continue
    page, tok = divmod(int(slot), N)
    for h in range(H):
        at = H * F + dd + page * 2 * H * N * F + tok * 2 * H * F + h * F
        b[at:at + D // 16] = b"\x88" * (D // 16)
open(dst, "wb").write(b)
PY
rm -f "$tmp/none.json"
expect_streams 1 "nothing written to .*none.json: the writer's map is not known for every misplaced region" \
  "$bin" conformance $wr "$kit" --cache "$tmp/no-v-scales.bin" --inferred "$tmp/none.json"
[ ! -e "$tmp/none.json" ] && grep -q "could not be inferred" "$tmp/out" && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL: --inferred wrote a layout though v_scale's map is unknown"; }
expect_json 1 "$bin" conformance $wr "$kit" --cache "$tmp/no-v-scales.bin"
python3 -c "import json, sys; sys.exit(json.load(open('$tmp/out.json'))['not_inferred'] != ['v_scale'])" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: not_inferred in JSON"; }
# Counts given are used or refused, never replaced by a default; a flag given twice is a usage error.
expect_bounded 2 "--tokens must be at least 1, got -5" "$bin" conformance gen --layout vllm-packed-nhd-rows $s16 --out "$tmp/k5" --tokens -5
expect_bounded 2 "--q-heads must be at least 1, got -8" "$bin" conformance gen --layout vllm-packed-nhd-rows $s16 --out "$tmp/k8" --q-heads -8
expect_bounded 2 "--json is given twice" "$bin" layout check trtllm $s2 --json --json
# An UNDECIDED layout says so in JSON too (exit 2), valid against the schema.
"$bin" layout show vllm-legacy-nhd --pages 4 --heads 7000 --head-dim 128 --tokens-per-page 16 --json >"$tmp/undecided.json" 2>/dev/null
if [ $? = 2 ] && $validate "$tmp/undecided.json" >/dev/null && grep -q '"verdict": *"undecided"' "$tmp/undecided.json"; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: layout show --json of an UNDECIDED layout"; head -c 300 "$tmp/undecided.json"; fi
printf '\x11' | dd of="$kit/cache/kv.bin" bs=1 seek=3 conv=notrunc 2>/dev/null
expect 2 "is not the cache this nvfp4kv generates" "$bin" conformance check-write --layout vllm-packed-nhd-rows --dir "$kit" --cache "$tmp/fixed.bin"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
