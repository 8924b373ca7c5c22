#pragma once
// The online softmax every attention family keeps per query row, in base 2: a
// row's logits are already multiplied by log2(e); a row (or a warp's or a split's
// part of it) holds its running maximum m and the sum l of 2^(x - m) over the
// tokens it has seen, and its output accumulator relative to the same m. Parts
// combine by rebasing onto their common maximum. Two cases are decided here once:
// a row that has seen only masked tokens (m = -inf, l = 0) and the sink (a logit
// per head that joins the denominator only).
#include <cmath>
#include <limits>

namespace nvfp4kv::kernels::attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^x, approximately (relative error ~2^-22), flushing results below 2^-126 to zero.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Moving a row's maximum from m_old to m_new (>= m_old): alpha rescales what was
// summed so far, and new logits are taken relative to m_use (0 while the row has
// seen only masked tokens, so -inf - -inf never happens).
struct Rebase {
  float alpha, m_use;
};
__device__ __forceinline__ Rebase rebase(float m_old, float m_new) {
  const float m_use = m_new == kNegInf ? 0.0f : m_new;
  return {fast_exp2(m_old - m_use), m_use};
}

// The weight of a part with maximum m_part once the parts are rebased onto m_all
// (0 for an empty part).
__device__ __forceinline__ float part_weight(float m_part, float m_all) {
  return m_part == kNegInf ? 0.0f : exp2f(m_part - m_all);
}

// A finished row: its parts' maximum mx and rebased sum l, and the sink (kNegInf
// when there is none). The output is o * factor / total (o summed relative to mx),
// the log-sum-exp in natural log; an empty row has total 0 (output 0, LSE -inf).
struct RowTotal {
  float factor;  // rebases o from mx onto max(mx, sink)
  float total;   // the softmax denominator relative to max(mx, sink)
  float lse;     // natural log
};
__device__ __forceinline__ RowTotal finish_row(float mx, float l, float sink) {
  const float m_all = fmaxf(mx, sink);
  const float factor = part_weight(mx, m_all);
  const float total = l * factor + (sink == kNegInf ? 0.0f : exp2f(sink - m_all));
  return {factor, total, total > 0 ? (m_all + log2f(total)) / kLog2e : kNegInf};
}

}  // namespace nvfp4kv::kernels::attention
