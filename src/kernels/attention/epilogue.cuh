#pragma once
// Writing attention results: a row's elements in the query's 16-bit type, and the
// NaN that marks a row that must not pass for data (a bad page, a bad length, an
// unusable global scale, a NaN partial).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv::kernels::attention {

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7FC00000); }

template <ElementType kType>
__device__ __forceinline__ uint16_t to_half_bits(float value) {
  if constexpr (kType == ElementType::kBFloat16) return __bfloat16_as_ushort(__float2bfloat16_rn(value));
  else return __half_as_ushort(__float2half_rn(value));
}

}  // namespace nvfp4kv::kernels::attention
