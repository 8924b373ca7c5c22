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

// FP8 E4M3 with a per-tensor scale (the dequant multiplier, usable as a global scale is):
// code = e4m3(x * (1 / scale)), round to nearest even, saturating at +-448; NaN and +-Inf
// inputs are stored as +0 and counted (core/transform.hpp).
struct Fp8Tensor {
  DenseShape shape;
  std::vector<uint8_t> codes;  // (tokens, heads, D) E4M3 bytes
  int64_t non_finite = 0;
};
Fp8Tensor quantize_fp8(const void* input, ElementType type, DenseShape shape, float scale);
// (tokens, heads, D) floats: e4m3 * scale, one rounding.
std::vector<float> dequantize_fp8(const Fp8Tensor& q, float scale);

struct ErrorStats {
  double rel_l2 = 0;   // ||x^ - x|| / ||x||
  double max_abs = 0;  // max |x^ - x|
};
ErrorStats error_stats(const std::vector<float>& reference, const std::vector<float>& approx);

}  // namespace nvfp4kv::reference
