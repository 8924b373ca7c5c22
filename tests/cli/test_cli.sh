#!/usr/bin/env bash
# The CLI's contract: exit 0 on success, 1 on a rejected layout or disagreement,
# 2 on bad usage; diagnostics on stderr. usage: test_cli.sh PATH/TO/nvfp4kv
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

# Hostile input (issue 9): each reproducer answers or is refused in under a
# second; a refusal (exit 2) is one line on stderr and nothing on stdout.
# expect_fast CODE "pattern" command...
expect_fast() {
  local code=$1 pattern=$2
  shift 2
  local start end
  start=$(date +%s%N)
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  end=$(date +%s%N)
  local ms=$(((end - start) / 1000000)) why=""
  [ "$got" = "$code" ] || why="exit $got (want $code)"
  grep -qE -- "$pattern" "$tmp/out" "$tmp/err" || why="$why; no '$pattern'"
  [ "$ms" -lt 1000 ] || why="$why; took $ms ms"
  if [ "$code" = 2 ] && { [ -s "$tmp/out" ] || [ "$(wc -l <"$tmp/err")" != 1 ]; }; then why="$why; not one line on stderr"; fi
  if [ "$code" = 1 ] && [ -s "$tmp/out" ]; then why="$why; a rejection printed on stdout"; fi
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
expect_fast 0 "sound: " "$bin" layout show trtllm $d32
expect_fast 0 "agree: " "$bin" layout compare trtllm trtllm $d32
expect_fast 2 "v_scale.column: inner extent sd/4 = 0 at head dim 32" "$bin" layout show flashinfer-trtllm-gen-hnd $d32
expect_fast 2 "inner extent sd/4 = 0" "$bin" layout compare flashinfer-trtllm-gen-hnd flashinfer-hnd $d32
# 2. 100000 nested arrays (200 KB).
{ printf '{"name":"t","buffers":['; repeat '[' 100000; repeat ']' 100000; printf ']}'; } >"$tmp/deep.json"
expect_fast 2 "nested more than 32 levels deep" "$bin" layout check "$tmp/deep.json"
# 3. 200000 unary minus signs.
{ printf '"page": "'; repeat - 200000; printf '1", "head": "N*dd"'; } >"$tmp/minus"
splice "$legacy" '"page": "2*H*N*F", "head": "N*dd"' "$tmp/minus" >"$tmp/minus.json"
expect_fast 2 'k_data.page: expression "-+"\.\.\. \(200001 characters\): nested more than 64 levels deep' \
  "$bin" layout check "$tmp/minus.json" $small
# 4. plan at 2^62 kv heads.
expect_fast 2 "plan: .*integer overflow" "$bin" layout plan --layers 1 --kv-heads 4611686018427387904 --head-dim 128 --pages 1
# 5. compare at ten million heads: counted, not enumerated.
expect_fast 0 "agree: .* 23040000000 elements" "$bin" layout compare vllm-legacy-hnd vllm-legacy-hnd --pages 1 --heads 10000000 --head-dim 128 --tokens-per-page 16
expect_fast 1 "DISAGREE: .* 23039999424000 of 23040000000000 elements" "$bin" layout compare vllm-legacy-hnd vllm-legacy-nhd --pages 1000 --heads 10000000 --head-dim 128 --tokens-per-page 16
# 6. totals past 64 bits.
big="--layers 1099511627776 --pages 200000 --heads 8 --head-dim 128 --tokens-per-page 16"
expect_fast 2 "layers 1099511627776 x pages 200000 .* the bound on any count" "$bin" layout check nvfp4kv-native $big
expect_fast 2 "layers 4611686018427387904 x pages 200000" "$bin" layout check nvfp4kv-native --layers 4611686018427387904 --pages 200000 --heads 8 --head-dim 128 --tokens-per-page 16
expect_fast 2 "the bound on any count" "$bin" layout show nvfp4kv-native $big
expect_fast 2 "the bound on any count" "$bin" layout compare nvfp4kv-native nvfp4kv-native-layers $big
# 7. coordinates outside the cache, and a buffer without "bytes" at 2^61 pages.
expect_fast 2 "page 9223372036854775807 is outside the cache's \[0, 4\)" "$bin" layout show vllm-legacy-hnd --page 9223372036854775807 --pages 4 --heads 8 --head-dim 128 --tokens-per-page 16
expect_fast 2 "layer 4611686018427387904 is outside the cache's \[0, 1\)" "$bin" layout show vllm-legacy-hnd --layer 4611686018427387904 $small
expect_fast 2 "page -1 is outside" "$bin" layout show vllm-legacy-hnd --page -1 $small
expect_fast 2 "the byte map of one page draws heads 10000000" "$bin" layout show vllm-legacy-hnd --pages 4 --heads 10000000 --head-dim 128 --tokens-per-page 16
sed 's/, "bytes": "P\*2\*H\*N\*F"//' "$legacy" >"$tmp/open.json"
expect_fast 0 "sound: " "$bin" layout check "$tmp/open.json" $small
expect_fast 2 "pages 2305843009213693952 .* the bound on any count" "$bin" layout check "$tmp/open.json" --pages 2305843009213693952 --heads 1 --head-dim 16 --tokens-per-page 1
# 8. duplicate keys.
sed "0,/$k_page/s//\"page\": 72, \"page\": 1, \"head\": \"N*dd\", \"token\": \"dd\"}/" "$legacy" >"$tmp/dup-key.json"
expect_fast 2 'layout.regions.k_data: key "page" appears twice' "$bin" layout check "$tmp/dup-key.json" $small
sed 's/"regions": {/"regions": {"k_data": {"page": 0, "head": 0, "token": 0},/' "$legacy" >"$tmp/dup-region.json"
expect_fast 2 'layout.regions: key "k_data" appears twice' "$bin" layout check "$tmp/dup-region.json" $small
# check's own work: bounded for the whole proof, refused up front, UNDECIDED rather than REJECTED.
expect_fast 2 "UNDECIDED: cannot prove the layout sound at these sizes: .* 8388608 \(2\^23\)" "$bin" layout check vllm-legacy-nhd --pages 4 --heads 7000 --head-dim 128 --tokens-per-page 16
# Smaller ones: integers past int64, long names, nine buffers, host allocation, demo size, streams.
sed "0,/$k_page/s//\"page\": 18446744073709551616, \"head\": \"N*dd\", \"token\": \"dd\"}/" "$legacy" >"$tmp/huge.json"
expect_fast 2 "layout.regions.k_data.page: 1.8446744073709552e\+19 is outside the 64-bit signed integers" "$bin" layout check "$tmp/huge.json" $small
repeat n 2000000 >"$tmp/n"
splice "$legacy" vllm-legacy-hnd "$tmp/n" >"$tmp/long-name.json"
expect_fast 2 "layout text is more than 1048576 bytes" "$bin" layout check "$tmp/long-name.json" $small
sed "s/\"name\": \"vllm-legacy-hnd-writer-sm12x\"/\"name\": \"$(repeat n 1000)\"/" "$legacy" >"$tmp/name.json"
expect_fast 2 '"n{48}"\.\.\. \(1000 characters\) is not a name' "$bin" layout check "$tmp/name.json" $small
sed 's/"buffers": \[{"name": "kv", "bytes": "P\*2\*H\*N\*F"}\]/"buffers": [{"name": "kv", "bytes": "P*2*H*N*F"}, {"name": "b1"}, {"name": "b2"}, {"name": "b3"}, {"name": "b4"}, {"name": "b5"}, {"name": "b6"}, {"name": "b7"}, {"name": "b8"}]/' \
  "$legacy" >"$tmp/nine.json"
expect_fast 2 "buffers: 9 buffers; a layout has at most 8" "$bin" layout check "$tmp/nine.json" $small
expect_fast 2 "roundtrip allocates the cache of one layer on the host: .* 268435456 \(256 MiB\)" "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only --pages 1099511627776
expect_fast 2 "pass --tokens 512 or fewer" "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only --heads 128 --head-dim 256
expect_fast 2 "--tokens must be in \[1, 8192\], got 1048576" "$bin" demo --tokens 1048576
expect_fast 1 "REJECTED: .* share byte 576" "$bin" roundtrip --layout vllm-packed-nhd-writer --cpu-only
expect_fast 1 "REJECTED: " "$bin" layout check vllm-packed-nhd-reader $small
expect_fast 1 "DISAGREE: " "$bin" layout compare vllm-packed-nhd-writer vllm-packed-nhd-reader $small
expect_fast 2 'unknown option "--x+"\.\.\. \(100002 characters\)' "$bin" layout check nvfp4kv-native "--$(repeat x 100000)"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
