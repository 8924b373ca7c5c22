# Sourced by bench/decode_variants.sh and bench/prefill_variants.sh: the CLI of the working
# tree with each patch applied alone, all built at once for sm_90a (they share the machine's
# cores), the tree of patch n in $work/v$n ($work/v$n/failed when it does not apply or build).
# Usage: build_variants ROOT WORK JOBS PATCH...
build_variants() {
  local root=$1 work=$2 jobs=$3 n=0 patch dir
  shift 3
  for patch in "$@"; do
    n=$((n + 1))
    dir="$work/v$n"
    mkdir -p "$dir"
    (cd "$root" && tar cf - --exclude=./build --exclude=./.git --exclude=./.carry .) | (cd "$dir" && tar xf -)
    (cd "$dir" && patch -p1 -s < "$root/$patch") || { echo "$patch: does not apply"; touch "$dir/failed"; continue; }
    (cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4KV_REQUIRE_CUDA=ON -DNVFP4KV_BUILD_TESTS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DNVFP4KV_EXTRA_INCLUDE="$root/.carry/include" > "$dir/configure.log" 2>&1 &&
      cmake --build "$dir/build" -j "$jobs" --target nvfp4kv > "$dir/build.log" 2>&1 || touch "$dir/failed") &
  done
  wait
}
