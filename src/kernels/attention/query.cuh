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
#include "nvfp4kv/core/transform.hpp"
#include "softmax.cuh"

namespace nvfp4kv::kernels::attention {

// The query step's part of a cache format's transforms (common/format_view.hpp). The
// writer stored H ((k - mu) / lambda) for K's orthonormal, symmetric block-diagonal
// Hadamard H, smoothing row mu and channel scale lambda, so
// q . k = (H (lambda q)) . stored + q . mu: the query is scaled and rotated once here
// (nothing per token) and q . mu is returned for the logit, in float32 from the
// query's own values, before the scaling.
struct QueryTransform {
  int rotation = 0;                      // block size of K's rotation; 0: none
  const float* mean = nullptr;           // the kv head's mu row (D floats), or null
  const float* channel_scale = nullptr;  // the kv head's lambda row (D floats), or null
};

// H_n on a row spread as lane l's v[k] = column l + 32 k (butterflies of span < 32 across
// lanes, the others inside a lane), then the 1 / sqrt(n) normalization.
template <int kD>
__device__ __forceinline__ void rotate_spread_row(float (&v)[kD / 32], int n, int lane) {
  for (int span = 1; span < n && span < 32; span *= 2) {
    const bool high = (lane & span) != 0;
#pragma unroll
    for (int k = 0; k < kD / 32; ++k) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, v[k], span);
      v[k] = high ? other - v[k] : v[k] + other;
    }
  }
#pragma unroll
  for (int m = 1; m < kD / 32; m *= 2) {
    if (32 * m >= n) break;
#pragma unroll
    for (int k = 0; k < kD / 32; ++k)
      if ((k & m) == 0) {
        const float a = v[k], b = v[k + m];
        v[k] = a + b, v[k + m] = a - b;
      }
  }
  const float s = hadamard_scale(n);
#pragma unroll
  for (int k = 0; k < kD / 32; ++k) v[k] *= s;
}

// The same out of line, by value (the rows' values are copied, their registers never
// addressed): the query step's rotation stays out of the attention kernels' bodies.
template <int kD>
struct SpreadRow {
  float v[kD / 32];
};
template <int kD>
__device__ __noinline__ SpreadRow<kD> rotated_spread_row(SpreadRow<kD> r, int n, int lane) {
  rotate_spread_row<kD>(r.v, n, lane);
  return r;
}

// One warp, one row: lane l takes columns l + 32 k of `row` (kType bits; null
// for a padding row, all zeros), applies the format's query transform (t: q . mu
// into *q_dot_mean on every lane when t.mean is given, then q times lambda, then the rotation), writes the prescaled row by
// put(column, value) (kD halves, columns past `dim` zero) and returns the row's
// logit multiplier (every lane). kInlineRotation: K's rotation in the caller's body
// instead of the out-of-line call (a call saves and restores registers through local
// memory, which a kernel whose shared memory takes nearly all of L1 pays in L2 round trips).
template <int kD, ElementType kType, typename Format, bool kInlineRotation = false, typename Put>
__device__ __forceinline__ float prescale_query_row_to(const uint16_t* row, int64_t dim, int lane, Put put,
                                                       float logit_scale, QueryTransform t = {},
                                                       float* q_dot_mean = nullptr) {
  float v[kD / 32], mu[kD / 32], lambda[kD / 32];
  float amax = 0;
  // mu's and lambda's loads issued beside the query's, so that their latencies overlap (one
  // after the other, a block's query step would wait for several trips to memory per row).
#pragma unroll
  for (int k = 0; k < kD / 32; ++k) {
    const int col = lane + 32 * k;
    v[k] = 0;
    mu[k] = 0;
    lambda[k] = 1;
    if (row && col < dim) {
      const uint16_t bits = row[col];
      v[k] = kType == ElementType::kBFloat16 ? __uint_as_float(uint32_t(bits) << 16) : __half2float(__ushort_as_half(bits));
    }
    if (t.mean && col < dim) mu[k] = t.mean[col];
    if (t.channel_scale && col < dim) lambda[k] = t.channel_scale[col];
  }
  if (t.mean) {
    float dot = 0;
#pragma unroll
    for (int k = 0; k < kD / 32; ++k)
      if (lane + 32 * k < dim) dot += v[k] * mu[k];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
    if (q_dot_mean) *q_dot_mean = dot;
  }
  if (t.channel_scale) {
#pragma unroll
    for (int k = 0; k < kD / 32; ++k) v[k] *= lambda[k];
  }
  if (t.rotation > 0) {
    if constexpr (kInlineRotation) {
      rotate_spread_row<kD>(v, t.rotation, lane);
    } else {
      SpreadRow<kD> r;
#pragma unroll
      for (int k = 0; k < kD / 32; ++k) r.v[k] = v[k];
      r = rotated_spread_row<kD>(r, t.rotation, lane);
#pragma unroll
      for (int k = 0; k < kD / 32; ++k) v[k] = r.v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < kD / 32; ++k) amax = fmaxf(amax, fabsf(v[k]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  int shift = 0;
  if (amax > 0 && amax <= 3.0e38f) shift = 14 - ilogbf(amax);
#pragma unroll
  for (int k = 0; k < kD / 32; ++k) put(lane + 32 * k, __float2half_rn(ldexpf(v[k], shift)));
  return ldexpf(logit_scale, Format::kExponentBias - shift) * kLog2e;
}

// The same into a contiguous row `to`.
template <int kD, ElementType kType, typename Format, bool kInlineRotation = false>
__device__ __forceinline__ float prescale_query_row(const uint16_t* row, int64_t dim, int lane, __half* to,
                                                    float logit_scale, QueryTransform t = {},
                                                    float* q_dot_mean = nullptr) {
  return prescale_query_row_to<kD, kType, Format, kInlineRotation>(
      row, dim, lane, [to](int col, __half v) { to[col] = v; }, logit_scale, t, q_dot_mean);
}

}  // namespace nvfp4kv::kernels::attention
