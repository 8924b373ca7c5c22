#pragma once
// The per-element parts of a cache format (cache_format.hpp) that writers must
// compute identically: the FP8 E4M3 element codec with a per-tensor scale and the
// float32 Hadamard rotation applied before quantizing. Host and device share it, like
// format.hpp. Readers undo the rotation in their own precision (the reference: fp64).
#include "nvfp4kv/core/format.hpp"

namespace nvfp4kv {

// ---- FP8 E4M3 elements with a per-tensor scale -------------------------------------
// scale is the dequant multiplier (x ~= e4m3(code) * scale), usable as a global scale is
// (global_scale_usable). A NaN or +-Inf input is stored as +0, as NVFP4 stores it, and the
// caller counts it; finite values round to nearest even and saturate at +-448 (satfinite).
NVFP4KV_HD bool fp8_input_finite(float x) { return (float_bits(x) & 0x7FFFFFFFu) < 0x7F800000u; }

// inv = 1 / scale, computed once per tensor by the caller (one rounding, part of the contract).
NVFP4KV_HD uint8_t fp8_encode_element(float x, float inv) {
  return fp8_input_finite(x) ? e4m3_encode(x * inv) : uint8_t(0);
}

// e4m3 * scale: one rounding, at the multiplication.
NVFP4KV_HD float fp8_decode_element(uint8_t code, float scale) { return e4m3_decode(code) * scale; }

// ---- Hadamard rotation ----------------------------------------------------------------
// 1 / sqrt(2^k) rounded to float, for k in [0, 20]: 2^-(k/2), times float(1/sqrt(2)) when k
// is odd (scaling by a power of two is exact, so this is the correctly rounded value).
NVFP4KV_HD float hadamard_scale(int64_t n) {
  int k = 0;
  while ((int64_t(1) << k) < n) ++k;
  const float half_power = bits_float(uint32_t(127 - k / 2) << 23);
  return (k % 2) ? half_power * 0.70710678118654752440f : half_power;
}

// In place, x (n floats, n a power of two) -> H_n x / sqrt(n) with H_n Sylvester's
// Hadamard matrix (symmetric, so its own inverse once normalized). The order of the
// float32 operations is the contract: butterflies of span 1, 2, 4, ... (x[j], x[j+h] ->
// x[j] + x[j+h], x[j] - x[j+h]), then one multiplication by hadamard_scale(n).
// The unnormalized butterflies, in that order, in T's precision.
template <typename T>
NVFP4KV_HD void hadamard_butterflies(T* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

NVFP4KV_HD void hadamard_rotate(float* x, int64_t n) {
  hadamard_butterflies(x, n);
  const float s = hadamard_scale(n);
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] * s;
}

}  // namespace nvfp4kv
