#pragma once
// BF16 and FP16 bit conversions with round-to-nearest-even, identical on host
// and device, so gathered values can be compared bit for bit.
#include "nvfp4kv/core/config.hpp"

namespace nvfp4kv {

enum class ElementType : uint8_t { kFloat32, kBFloat16, kFloat16 };

NVFP4KV_HD float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

NVFP4KV_HD uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

NVFP4KV_HD float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 0) {
    const float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

NVFP4KV_HD uint16_t float_to_fp16(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u);
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds past 65504: Inf
  if (a < 0x38800000u) {                                   // below 2^-14: subnormal grid 2^-24
    const float scaled = bits_float(a) * 16777216.0f;      // exact
    const uint32_t whole = uint32_t(scaled);
    const float frac = scaled - float(whole);
    return uint16_t(sign | (whole + ((frac > 0.5f || (frac == 0.5f && (whole & 1u))) ? 1u : 0u)));
  }
  const uint32_t rounded = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  return uint16_t(sign | (rounded - (112u << 10)));
}

NVFP4KV_HD float element_to_float(const void* base, int64_t index, ElementType type) {
  switch (type) {
    case ElementType::kFloat32: return static_cast<const float*>(base)[index];
    case ElementType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
}

inline const char* element_type_name(ElementType t) {
  return t == ElementType::kFloat32 ? "fp32" : t == ElementType::kBFloat16 ? "bf16" : "fp16";
}

}  // namespace nvfp4kv
