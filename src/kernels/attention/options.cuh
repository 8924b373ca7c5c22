#pragma once
// The options of an attention call, one vocabulary for every family (core's
// DecodeArgs carries the values; the prefill family takes the same):
//  - window w > 0: a query at position p attends to keys in [p + 1 - w, p + 1);
//  - soft-cap c > 0: logits become c * tanh(logit / c);
//  - sinks: a logit per query head that joins the softmax denominator only.
// The soft-cap is the one option applied per element, so it is a compile-time
// policy (dispatched once, NVFP4KV_DISPATCH_SOFTCAP): with it off, the logit path
// has no instruction for it. The window and the sinks cost per row or per block,
// never per element, and stay run-time values.
#include <cstdint>

#include "softmax.cuh"

namespace nvfp4kv::kernels::attention {

template <bool kSoftcap>
struct Logits {
  float cap2;  // soft-cap in base 2: c * log2(e)
  __device__ __forceinline__ static Logits make(float softcap) { return {softcap * kLog2e}; }
  // y: a logit already multiplied by log2(e).
  __device__ __forceinline__ float operator()(float y) const {
    if constexpr (kSoftcap) return cap2 * tanhf(y / cap2);
    else return y;
  }
};

// The first key position a query at position `query_pos` attends to.
__device__ __forceinline__ int64_t window_start(int64_t query_pos, int64_t window) {
  return window > 0 ? (query_pos + 1 - window > 0 ? query_pos + 1 - window : 0) : 0;
}

// Head `head`'s sink logit in base 2, or kNegInf without sinks.
__device__ __forceinline__ float sink_logit2(const float* sinks, int64_t head) {
  return sinks ? sinks[head] * kLog2e : kNegInf;
}

}  // namespace nvfp4kv::kernels::attention
