#pragma once
// Scalar CPU reference for NVFP4 quantization of dense [tokens, heads, D]
// tensors. Readable on purpose: every kernel is compared with it bit for bit.
#include <cstdint>
#include <vector>

#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv::reference {

struct DenseShape {
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;  // multiple of 16
  int64_t elements() const { return tokens * heads * head_dim; }
};

struct QuantizedTensor {
  DenseShape shape;
  std::vector<uint8_t> data;    // (tokens, heads, D/2) bytes, element 2j in the low nibble
  std::vector<uint8_t> scales;  // (tokens, heads, D/16) E4M3 bytes
  int64_t non_finite = 0;       // inputs stored as +0 because they were NaN or +-Inf
};

// input: (tokens, heads, D) of `type`, contiguous. Throws ArgumentError
// on a bad shape or global scale.
QuantizedTensor quantize(const void* input, ElementType type, DenseShape shape, float global_scale,
                         ScaleRule rule);

// (tokens, heads, D) floats: e2m1 * scale * global_scale, one rounding.
std::vector<float> dequantize(const QuantizedTensor& q, float global_scale);

struct ErrorStats {
  double rel_l2 = 0;   // ||x^ - x|| / ||x||
  double max_abs = 0;  // max |x^ - x|
};
ErrorStats error_stats(const std::vector<float>& reference, const std::vector<float>& approx);

}  // namespace nvfp4kv::reference
