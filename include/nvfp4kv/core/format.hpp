#pragma once
// The NVFP4 number format: E2M1 element codes, E4M3 ("fn") block scales and the
// quantization of one 16-element block. Host and device share this code, so the
// CPU reference and the kernels round identically by construction; the codecs
// themselves are tested exhaustively and against ml_dtypes.
//
// Non-finite inputs (decided here, documented in docs/format.md): a NaN or +-Inf
// element is stored as +0 and does not take part in the block's amax, so one bad
// value never poisons its 15 neighbours and the cache never holds a NaN. The
// count of such elements is returned with every quantized block.
#include "nvfp4kv/core/config.hpp"

namespace nvfp4kv {

inline constexpr int kBlockSize = 16;       // elements per block scale
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE4M3MaxCode = 0x7E;  // 0x7F is NaN in the "fn" variant

// ---- E2M1 ----------------------------------------------------------------
// Code: bit 3 sign, bits 0-2 magnitude index into {0, .5, 1, 1.5, 2, 3, 4, 6}.
NVFP4KV_HD float e2m1_decode(uint8_t code) {
  const uint8_t mag = code & 7u;
  // exponent field e = mag >> 1 (bias 1), mantissa m = mag & 1.
  const float v = (mag < 2) ? 0.5f * float(mag)
                            : float(2 + (mag & 1)) * float(1 << ((mag >> 1) - 1)) * 0.5f;
  return (code & 8u) ? -v : v;
}

// Round to nearest, ties to the even code, saturating at +-6. The sign is kept,
// so a small negative value becomes -0 (code 8), as ml_dtypes and the hardware do.
// NaN encodes as +0; the block quantizer never passes one in.
// Written with float bit arithmetic instead of a compare chain (about half the
// instructions on the GPU, where the store kernel spends its time here):
//  - |x| < 1: the grid is {0, .5, 1}; 2|x| + 2^23 rounds 2|x| to an integer with
//    ties to even, and that integer is the code (0, 1 or 2);
//  - 1 <= |x| <= 6: E2M1 keeps one mantissa bit, so rounding the float's
//    mantissa to 1 bit (half-even) and rebiasing the exponent gives the code.
// tests/cpu/test_format.cpp checks it against the plain threshold definition.
// Both candidate codes are computed and one is selected: no branch, so a warp
// never diverges per element (the branchy form cost the store kernel ~2x).
// Precondition: x is not NaN (the block rule guarantees it, see quantize_with_scale).
NVFP4KV_HD uint32_t e2m1_code_not_nan(float x) {
  const uint32_t u = float_bits(x);
  const float v = bits_float(u & 0x7FFFFFFFu);
  const float a = v < kE2M1Max ? v : kE2M1Max;
#if defined(__CUDA_ARCH__)
  const float rounded = __fmaf_rn(a, 2.0f, 8388608.0f);  // exact product: the same value as below, one FFMA
#else
  const float rounded = a * 2.0f + 8388608.0f;
#endif
  const uint32_t small = float_bits(rounded) & 3u;
  const uint32_t b = float_bits(a);
  // (b + 0x1FFFFF + lsb) >> 22 rounds the mantissa to one bit; subtracting 252 << 22
  // first rebiases the exponent (1.0 -> code 2) in the same add.
  const uint32_t large = (b + (0x1FFFFFu - (252u << 22)) + ((b >> 22) & 1u)) >> 22;
  return ((u >> 28) & 8u) | (a < 1.0f ? small : large);
}

NVFP4KV_HD uint32_t e2m1_code(float x) {
  return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u ? 0u : e2m1_code_not_nan(x);
}

NVFP4KV_HD uint8_t e2m1_encode(float x) { return uint8_t(e2m1_code(x)); }

// ---- E4M3 (fn) -----------------------------------------------------------
// Bias 7, max 448, subnormals m * 2^-9, NaN = 0x7F / 0xFF, no Inf.
NVFP4KV_HD float e4m3_decode(uint8_t code) {
  const uint32_t e = (code >> 3) & 15u, m = code & 7u;
  float v;
  if (e == 15 && m == 7) {
    v = bits_float(0x7FC00000u);
  } else if (e == 0) {
    v = float(m) * (1.0f / 512.0f);
  } else {
    v = bits_float(((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e-7)
  }
  return (code & 0x80u) ? -v : v;
}

// Round to nearest even, saturating finite values and +-Inf to +-448 (PTX's
// cvt.rn.satfinite); NaN stays NaN (0x7F).
NVFP4KV_HD uint8_t e4m3_encode(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;
  uint32_t code;
  if (a < 0x3C800000u) {  // below 2^-6: subnormal grid of 2^-9, exact scaling
    const float scaled = bits_float(a) * 512.0f;
    const uint32_t whole = uint32_t(scaled);
    const float frac = scaled - float(whole);
    code = whole + ((frac > 0.5f || (frac == 0.5f && (whole & 1u))) ? 1u : 0u);
  } else {
    // Drop 20 mantissa bits with round-half-even; a carry moves the exponent.
    const uint32_t rounded = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    code = rounded - (120u << 3);  // rebias 127 -> 7
    if (code > kE4M3MaxCode) code = kE4M3MaxCode;
  }
  return uint8_t(sign | code);
}

// ---- Block quantization --------------------------------------------------
enum class ScaleRule : uint8_t {
  kStandard,    // SF = e4m3(amax / global / 6)
  kFourOverSix  // also try SF = e4m3(amax / global / 4); keep the lower squared error
};

struct QuantizedBlock {
  uint8_t packed[kBlockSize / 2];  // element 2i in the low nibble of byte i
  uint8_t scale;                   // E4M3 block scale
  uint8_t non_finite;              // inputs that were NaN or +-Inf (stored as +0)
};

// Usable global scales. The bounds keep 1 / (block scale * global scale) finite
// (block scales are >= 2^-9), so quantization never forms 0 * Inf; amax / 2688
// lands inside for any amax in [2^-88, 2^111].
inline constexpr float kMinGlobalScale = 7.8886090522101181e-31f;  // 2^-100
inline constexpr float kMaxGlobalScale = 1.2676506002282294e30f;   // 2^100
NVFP4KV_HD bool global_scale_usable(float s) { return s >= kMinGlobalScale && s <= kMaxGlobalScale; }

namespace detail {

// Quantize with one candidate scale code; returns the squared reconstruction
// error summed in element order (the order is part of the contract: 4over6's
// choice must be the same on every device).
NVFP4KV_HD float quantize_with_scale(const float* x, uint8_t scale, float global_scale,
                                     uint8_t* packed) {
  const float scale_f = e4m3_decode(scale);
  const float block_scale = scale_f * global_scale;
  const float inv = (scale == 0) ? 0.0f : 1.0f / block_scale;
  float err = 0.0f;
  for (int i = 0; i < kBlockSize; i += 2) {
    // x is finite and inv finite (usable global scales keep 1 / block_scale below 2^110),
    // so x * inv is never NaN.
    const uint32_t lo = e2m1_code_not_nan(x[i] * inv), hi = e2m1_code_not_nan(x[i + 1] * inv);
    packed[i / 2] = uint8_t(lo | (hi << 4));
    const float d0 = (e2m1_decode(uint8_t(lo)) * scale_f) * global_scale - x[i];
    const float d1 = (e2m1_decode(uint8_t(hi)) * scale_f) * global_scale - x[i + 1];
    err = err + d0 * d0;
    err = err + d1 * d1;
  }
  return err;
}

}  // namespace detail

// global_scale is the dequant multiplier of this layer and side, in
// [kMinGlobalScale, kMaxGlobalScale] (callers check with global_scale_usable).
NVFP4KV_HD QuantizedBlock quantize_block(const float* in, float global_scale, ScaleRule rule) {
  // amax as the integer max of |x|'s bit patterns: the same order as the float max
  // for non-negative values, and anything >= 0x7F800000 reveals an Inf or NaN.
  float x[kBlockSize];
  uint32_t amax_bits = 0;
  for (int i = 0; i < kBlockSize; ++i) {
    x[i] = in[i];
    const uint32_t a = float_bits(x[i]) & 0x7FFFFFFFu;
    amax_bits = a > amax_bits ? a : amax_bits;
  }
  uint8_t non_finite = 0;
  if (amax_bits >= 0x7F800000u) {  // rare: store non-finite elements as +0, leave them out of amax
    amax_bits = 0;
    for (int i = 0; i < kBlockSize; ++i) {
      const uint32_t a = float_bits(x[i]) & 0x7FFFFFFFu;
      const bool ok = a < 0x7F800000u;
      x[i] = ok ? x[i] : 0.0f;
      non_finite += ok ? 0 : 1;
      amax_bits = (ok && a > amax_bits) ? a : amax_bits;
    }
  }
  const float amax = bits_float(amax_bits);
  const float target = amax * (1.0f / global_scale);
  QuantizedBlock q{};
  q.non_finite = non_finite;
  q.scale = e4m3_encode(target / 6.0f);
  const float err6 = detail::quantize_with_scale(x, q.scale, global_scale, q.packed);
  if (rule == ScaleRule::kFourOverSix) {
    QuantizedBlock alt{};
    alt.scale = e4m3_encode(target / 4.0f);
    const float err4 = detail::quantize_with_scale(x, alt.scale, global_scale, alt.packed);
    if (err4 < err6) {
      alt.non_finite = non_finite;
      return alt;
    }
  }
  return q;
}

// Element i of a block, dequantized: (e2m1 * scale) is exact in fp32, so one
// rounding happens, at the multiplication by the global scale.
NVFP4KV_HD float dequantize_element(uint8_t packed_byte, int nibble, uint8_t scale,
                                    float global_scale) {
  const uint8_t code = nibble ? (packed_byte >> 4) : (packed_byte & 15u);
  return (e2m1_decode(code) * e4m3_decode(scale)) * global_scale;
}

}  // namespace nvfp4kv
