#!/usr/bin/env bash
# Install what the build and tests need, where it is missing (Debian: apt-get and pip).
set -euo pipefail
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++ make)
command -v clang++ >/dev/null || need_apt+=(clang)
[ -d /usr/src/googletest ] || need_apt+=(googletest libgtest-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need_apt+=(libclang-rt-dev)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! python3 -c "import ml_dtypes, numpy" 2>/dev/null; then
  echo "installing: ml_dtypes numpy (pip)"
  python3 -m pip install -q ml_dtypes numpy 2>&1 | grep -v "WARNING: Running pip as the 'root'" || true
fi
