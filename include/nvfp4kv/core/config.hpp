#pragma once
// Host/device qualifiers that vanish outside nvcc, so core stays plain C++
// (the same trick as CuTe's config.hpp).
#if defined(__CUDACC__)
#define NVFP4KV_HD __host__ __device__ __forceinline__
#else
#define NVFP4KV_HD inline
#endif

#include <cstdint>
#include <cstring>

namespace nvfp4kv {

// Bit reinterpretation usable in host and device code.
NVFP4KV_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

NVFP4KV_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// A product rounded once to float and never fused with a neighbouring add, on
// either side and under any contraction setting (nvcc's --fmad, GCC's
// -ffp-contract=fast in GNU mode): arithmetic that must round exactly as the
// reference does uses this wherever a product meets an add, so any target may
// build it with contraction on. On the host the product of two floats is exact
// in double, and the conversion is the one rounding.
NVFP4KV_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return float(double(a) * double(b));
#endif
}

}  // namespace nvfp4kv
