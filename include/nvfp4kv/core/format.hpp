#pragma once
// The NVFP4 number format: E2M1 element codes, E4M3 ("fn") block scales and the
// quantization of one 16-element block. Host and device share this code, so the
// CPU reference and the kernels round identically: by construction, except where
// the device swaps in a conversion instruction (E4M3, sm_89+) or a cheaper
// division (by 6, block_scale_code), and those are proven equal by exhaustive
// tests. The codecs themselves are tested exhaustively and against ml_dtypes.
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
//
// Hopper has no E2M1 conversion, so the rounding is built from FP32 arithmetic,
// which Hopper issues at twice the rate of integer and logic operations (the
// bit-manipulation encoder this replaces cost ~12 integer ops per element and
// made the store kernel integer-issue-bound, see src/kernels/NOTES.md).
// The E2M1 grid has three uniform pieces: steps of 0.5 on [0, 2], of 1 on
// [2, 4] and of 2 on [4, 6]. The magnitude code counts steps, so it is the sum
// of three independently rounded counts:
//   n1 = rne(4 * sat(a / 2))      steps of 0.5 below 2      (0..4)
//   n2 = rne(2 * sat(a / 2 - 1))  steps of 1 between 2 and 4 (0..2)
//   n3 = rne(sat(a / 2 - 2))      steps of 2 between 4 and 6 (0..1)
// where sat clamps to [0, 1] (a free modifier on the GPU's FMUL/FFMA). On each
// piece only one count is fractional and the other two are at their ends, so
// the sum is the round-to-nearest code; ties go to the even count, which is the
// even code because the pieces start at even codes (0, 4, 6); beyond 6 all
// three saturate (code 7). Every product and difference above is exact in fp32
// (a / 2 - k for a in the piece where it is not clamped: Sterbenz), so the only
// roundings are the three "+ 2^23", each to an integer with ties to even; the
// counts land in the low mantissa bits and one integer add sums them.
// tests/cpu/test_format.cpp checks it against the plain threshold definition.
NVFP4KV_HD float sat01(float v) {
#if defined(__CUDA_ARCH__)
  return __saturatef(v);
#else
  return v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f;
#endif
}

// a * b + c with one rounding. Used only where a * b is exact, so the host's
// separate multiply and add (the build turns contraction off) give the same value.
NVFP4KV_HD float fma_exact_product(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return a * b + c;
#endif
}

inline constexpr float kTwo23 = 8388608.0f;  // values in [2^23, 2^24) have unit spacing

// The three rounded counts of |y| (y not NaN), each as the bits of 2^23 + n;
// the code is the low 3 bits of their sum (the high bits hold 3 * 0x4B000000).
struct E2M1Counts {
  uint32_t n1, n2, n3;
  NVFP4KV_HD uint32_t sum() const { return n1 + n2 + n3; }
};

NVFP4KV_HD E2M1Counts e2m1_counts(float y) {
#if defined(__CUDA_ARCH__)
  const float a = fabsf(y);  // an operand modifier, not an instruction
#else
  const float a = bits_float(float_bits(y) & 0x7FFFFFFFu);
#endif
  const float s1 = sat01(a * 0.5f);
  const float s2 = sat01(fma_exact_product(a, 0.5f, -1.0f));
  const float s3 = sat01(fma_exact_product(a, 0.5f, -2.0f));
  return {float_bits(fma_exact_product(s1, 4.0f, kTwo23)), float_bits(fma_exact_product(s2, 2.0f, kTwo23)),
          float_bits(s3 + kTwo23)};
}

// The value of a magnitude code given by its counts: n1 / 2 + n2 + 2 n3, exact.
NVFP4KV_HD float e2m1_counts_value(const E2M1Counts& c) {
  const float n1 = bits_float(c.n1) - kTwo23, n2 = bits_float(c.n2) - kTwo23, n3 = bits_float(c.n3) - kTwo23;
  return fma_exact_product(n3, 2.0f, fma_exact_product(n1, 0.5f, n2));
}

// Precondition: y is not NaN (the block rule guarantees it, see quantize_with_scale).
NVFP4KV_HD uint32_t e2m1_code_not_nan(float y) {
  return ((float_bits(y) >> 28) & 8u) | (e2m1_counts(y).sum() & 7u);
}

NVFP4KV_HD uint32_t e2m1_code(float x) {
  return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u ? 0u : e2m1_code_not_nan(x);
}

NVFP4KV_HD uint8_t e2m1_encode(float x) { return uint8_t(e2m1_code(x)); }

// ---- E4M3 (fn) -----------------------------------------------------------
// Bias 7, max 448, subnormals m * 2^-9, NaN = 0x7F / 0xFF, no Inf.
// The _bits functions are the definitions, run on the host; on sm_89 and newer
// the device uses the conversion instructions (one each instead of ~15
// operations with a branch), which tests/cpu/test_toolkit_conversions.cpp checks against
// the toolkit's definition of those instructions and tests/gpu against these.
NVFP4KV_HD float e4m3_decode_bits(uint8_t code) {
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
NVFP4KV_HD uint8_t e4m3_encode_bits(float x) {
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define NVFP4KV_NATIVE_E4M3 1
#else
#define NVFP4KV_NATIVE_E4M3 0
#endif

NVFP4KV_HD float e4m3_decode(uint8_t code) {
#if NVFP4KV_NATIVE_E4M3
  // E4M3 -> f16 is exact (f16 holds every E4M3 value), then f16 -> f32 is exact.
  uint32_t pair;
  float f;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(pair) : "h"(uint16_t(code)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(uint16_t(pair)));
  return f;
#else
  return e4m3_decode_bits(code);
#endif
}

// Only finite or infinite x reach this in the block rule; a NaN gives a NaN code
// on both paths (0x7F here, the instruction's canonical NaN there).
NVFP4KV_HD uint8_t e4m3_encode(float x) {
#if NVFP4KV_NATIVE_E4M3
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));  // x -> low byte
  return uint8_t(pair);
#else
  return e4m3_encode_bits(x);
#endif
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

// The two steps of a block rule that depend only on the block's amax, shared by
// the reference and the kernels' fast path.
// The E4M3 scale code for amax (finite, >= 0): divisor 6 for the standard rule,
// 4 for 4over6's alternative.
// The definition divides by 6 (or 4). On the GPU an IEEE division is a
// reciprocal, three fused multiply-adds and a slow-path check; the division by
// 6 is instead one multiply and one correction step, which is the correctly
// rounded quotient for every float except those below 2^-125, whose quotients
// encode to E4M3 zero either way. Targets are first clamped to 4096 (any
// quotient above 464 saturates to 448, and an infinite target would make the
// correction NaN). tests/cpu/test_format.cpp checks the codes for every float.
// Division by 4 is exact scaling.
NVFP4KV_HD float scale_quotient(float target, float divisor) {
#if defined(__CUDA_ARCH__)
  if (divisor == 6.0f) {
    const float t = fminf(target, 4096.0f);
    const float q = t * (1.0f / 6.0f);
    return __fmaf_rn(__fmaf_rn(-q, 6.0f, t), 1.0f / 6.0f, q);
  }
  return target * (1.0f / divisor);  // 4: a power of two
#else
  return target / divisor;
#endif
}

NVFP4KV_HD uint8_t block_scale_code(float amax, float global_scale, float divisor) {
  const float target = amax * (1.0f / global_scale);
  return e4m3_encode(scale_quotient(target, divisor));
}

// The multiplier that takes an input element to E2M1 units: 1 / (scale * global
// scale), or 0 for a zero scale (then every element encodes as a signed zero).
NVFP4KV_HD float block_inverse_scale(uint8_t scale, float global_scale) {
  const float block_scale = e4m3_decode(scale) * global_scale;
  return (scale == 0) ? 0.0f : 1.0f / block_scale;
}

namespace detail {

// Quantize with one candidate scale code; returns the squared reconstruction
// error summed in element order (the order is part of the contract: 4over6's
// choice must be the same on every device). The error of an element does not
// depend on its sign, so it is computed on magnitudes.
NVFP4KV_HD float quantize_with_scale(const float* x, uint8_t scale, float global_scale,
                                     uint8_t* packed) {
  const float scale_f = e4m3_decode(scale);
  const float inv = block_inverse_scale(scale, global_scale);
  float err = 0.0f;
  for (int i = 0; i < kBlockSize; i += 2) {
    // x is finite and inv finite (usable global scales keep 1 / block_scale below 2^110),
    // so x * inv is never NaN.
    const float y0 = x[i] * inv, y1 = x[i + 1] * inv;
    const E2M1Counts c0 = e2m1_counts(y0), c1 = e2m1_counts(y1);
    const uint32_t lo = ((float_bits(y0) >> 28) & 8u) | (c0.sum() & 7u);
    const uint32_t hi = ((float_bits(y1) >> 28) & 8u) | (c1.sum() & 7u);
    packed[i / 2] = uint8_t(lo | (hi << 4));
    // Products meet sums here: mul_rn keeps each one rounded on its own (config.hpp).
    const float d0 = mul_rn(e2m1_counts_value(c0) * scale_f, global_scale) - bits_float(float_bits(x[i]) & 0x7FFFFFFFu);
    const float d1 = mul_rn(e2m1_counts_value(c1) * scale_f, global_scale) - bits_float(float_bits(x[i + 1]) & 0x7FFFFFFFu);
    err = err + mul_rn(d0, d0);
    err = err + mul_rn(d1, d1);
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
  QuantizedBlock q{};
  q.non_finite = non_finite;
  q.scale = block_scale_code(amax, global_scale, 6.0f);
  const float err6 = detail::quantize_with_scale(x, q.scale, global_scale, q.packed);
  if (rule == ScaleRule::kFourOverSix) {
    QuantizedBlock alt{};
    alt.scale = block_scale_code(amax, global_scale, 4.0f);
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
