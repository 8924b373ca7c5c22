#include "nvfp4kv/reference/quantize.hpp"

#include <cmath>
#include <string>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/layout.hpp"

#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/core/transform.hpp"

namespace nvfp4kv::reference {

QuantizedTensor quantize(const void* input, ElementType type, DenseShape shape, float global_scale,
                         ScaleRule rule) {
  if (shape.tokens < 0 || shape.heads <= 0)
    throw ArgumentError("reference::quantize: need tokens >= 0 and heads > 0, got tokens " +
                        std::to_string(shape.tokens) + ", heads " + std::to_string(shape.heads));
  if (const std::string p = head_dim_problem(shape.head_dim); !p.empty()) throw ArgumentError("reference::quantize: " + p);
  require_valid_global_scale(global_scale, "reference::quantize");
  QuantizedTensor q;
  q.shape = shape;
  const int64_t blocks = shape.elements() / kBlockSize;
  q.data.resize(size_t(blocks) * (kBlockSize / 2));
  q.scales.resize(size_t(blocks));
  float x[kBlockSize];
  for (int64_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < kBlockSize; ++i) x[i] = element_to_float(input, b * kBlockSize + i, type);
    const QuantizedBlock qb = quantize_block(x, global_scale, rule);
    for (int i = 0; i < kBlockSize / 2; ++i) q.data[size_t(b) * (kBlockSize / 2) + i] = qb.packed[i];
    q.scales[size_t(b)] = qb.scale;
    q.non_finite += qb.non_finite;
  }
  return q;
}

std::vector<float> dequantize(const QuantizedTensor& q, float global_scale) {
  std::vector<float> out(size_t(q.shape.elements()));
  for (size_t e = 0; e < out.size(); ++e)
    out[e] = dequantize_element(q.data[e / 2], int(e % 2), q.scales[e / kBlockSize], global_scale);
  return out;
}

namespace {

void require_dense_shape(const DenseShape& shape, const char* who) {
  if (shape.tokens < 0 || shape.heads <= 0)
    throw ArgumentError(std::string(who) + ": need tokens >= 0 and heads > 0, got tokens " +
                        std::to_string(shape.tokens) + ", heads " + std::to_string(shape.heads));
  if (const std::string p = head_dim_problem(shape.head_dim); !p.empty()) throw ArgumentError(std::string(who) + ": " + p);
}

}  // namespace

Fp8Tensor quantize_fp8(const void* input, ElementType type, DenseShape shape, float scale) {
  require_dense_shape(shape, "reference::quantize_fp8");
  require_valid_global_scale(scale, "reference::quantize_fp8 (the per-tensor scale)");
  Fp8Tensor q;
  q.shape = shape;
  q.codes.resize(size_t(shape.elements()));
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < shape.elements(); ++i) {
    const float x = element_to_float(input, i, type);
    q.non_finite += fp8_input_finite(x) ? 0 : 1;
    q.codes[size_t(i)] = fp8_encode_element(x, inv);
  }
  return q;
}

std::vector<float> dequantize_fp8(const Fp8Tensor& q, float scale) {
  std::vector<float> out(q.codes.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = fp8_decode_element(q.codes[i], scale);
  return out;
}

ErrorStats error_stats(const std::vector<float>& reference, const std::vector<float>& approx) {
  if (reference.size() != approx.size()) throw ArgumentError("error_stats: size mismatch");
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double d = double(approx[i]) - double(reference[i]);
    num += d * d;
    den += double(reference[i]) * double(reference[i]);
    mx = std::max(mx, std::fabs(d));
  }
  return {den > 0 ? std::sqrt(num / den) : std::sqrt(num), mx};
}

}  // namespace nvfp4kv::reference
