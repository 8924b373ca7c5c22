#pragma once
// Loading a query row as the FP16 MMA operand the format policy pairs with:
// the row scaled by a power of two that puts its largest element in
// [2^14, 2^15) (a BF16 query has FP32's range; FP16 needs the headroom for the
// products), and the row's logit multiplier that undoes it, carrying the
// caller's scale (softmax scale times K's global scale), the placement's
// 2^-kExponentBias and log2(e) (the softmax runs in base 2).
#include <cuda_fp16.h>

#include <cstdint>

#include "nvfp4kv/core/half.hpp"
#include "softmax.cuh"

namespace nvfp4kv::kernels::attention {

// One warp, one row: lane l takes columns l + 32 k of `row` (kType bits; null
// for a padding row, all zeros), writes the prescaled row by put(column, value)
// (kD halves, columns past `dim` zero) and returns the row's logit multiplier
// (every lane).
template <int kD, ElementType kType, typename Format, typename Put>
__device__ __forceinline__ float prescale_query_row_to(const uint16_t* row, int64_t dim, int lane, Put put,
                                                       float logit_scale) {
  float v[kD / 32];
  float amax = 0;
#pragma unroll
  for (int k = 0; k < kD / 32; ++k) {
    const int col = lane + 32 * k;
    v[k] = 0;
    if (row && col < dim) {
      const uint16_t bits = row[col];
      v[k] = kType == ElementType::kBFloat16 ? __uint_as_float(uint32_t(bits) << 16) : __half2float(__ushort_as_half(bits));
    }
    amax = fmaxf(amax, fabsf(v[k]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  int shift = 0;
  if (amax > 0 && amax <= 3.0e38f) shift = 14 - ilogbf(amax);
#pragma unroll
  for (int k = 0; k < kD / 32; ++k) put(lane + 32 * k, __float2half_rn(ldexpf(v[k], shift)));
  return ldexpf(logit_scale, Format::kExponentBias - shift) * kLog2e;
}

// The same into a contiguous row `to`.
template <int kD, ElementType kType, typename Format>
__device__ __forceinline__ float prescale_query_row(const uint16_t* row, int64_t dim, int lane, __half* to,
                                                    float logit_scale) {
  return prescale_query_row_to<kD, kType, Format>(
      row, dim, lane, [to](int col, __half v) { to[col] = v; }, logit_scale);
}

}  // namespace nvfp4kv::kernels::attention
