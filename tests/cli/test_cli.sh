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
expect 2 "unknown option --bogus" "$bin" layout check nvfp4kv-native --bogus 1
expect 2 "unknown command" "$bin" frobnicate
expect 0 "round trip: PASS" "$bin" roundtrip --layout vllm-legacy-nhd --cpu-only
# A layout file of one's own, with a typo: named, not defaulted.
sed 's/"token": "dd"/"tokn": "dd"/' "$(dirname "$0")/../../layouts/vllm-legacy-hnd-writer-sm12x.json" > "$tmp/typo.json"
expect 2 'unknown key "tokn"' "$bin" layout check "$tmp/typo.json" $small
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
