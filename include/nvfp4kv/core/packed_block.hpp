#pragma once
// The standard block rule on the raw 16-bit input words, the form the store
// kernel's fast path runs. Same results as quantize_block (format.hpp) on the
// widened floats, bit for bit; tests/cpu/test_packed_block.cpp checks that on
// the host and the GPU tests check the kernel against the reference.
// What it saves over quantize_block, per 16-element block (see src/kernels/NOTES.md):
//  - amax: one packed max per pair of elements instead of an and and an integer
//    max per element;
//  - signs: gathered from the input words four bytes at a time by byte
//    permutes, instead of a shift and a mask per element;
//  - nibble packing: one multiply-add per pair and three permutes per 8 elements.
// Non-finite inputs are not handled here: the caller checks packed_amax against
// non_finite_floor and takes quantize_block's path for such (rare) blocks.
#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv {

// PTX prmt (default mode): byte n of the result is byte (s >> 4n) & 7 of {x, y}
// (x's bytes are 0-3, y's 4-7), or, where bit 3 of that selector nibble is set,
// that byte's top bit copied into all 8 bits.
NVFP4KV_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(s));
  return r;
#else
  const uint64_t v = uint64_t(x) | uint64_t(y) << 32;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t sel = (s >> (4 * n)) & 15u;
    uint32_t byte = uint32_t(v >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * n);
  }
  return r;
#endif
}

NVFP4KV_HD float fp16_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact, like the host conversion
  return f;
#else
  return fp16_to_float(h);
#endif
}

template <ElementType kType>
NVFP4KV_HD float low_element(uint32_t w) {
  if constexpr (kType == ElementType::kBFloat16) return bits_float(w << 16);
  else return fp16_bits_to_float(uint16_t(w));
}

template <ElementType kType>
NVFP4KV_HD float high_element(uint32_t w) {
  if constexpr (kType == ElementType::kBFloat16) return bits_float(w & 0xFFFF0000u);
  else return fp16_bits_to_float(uint16_t(w >> 16));
}

// Magnitude bit patterns at and above this are Inf or NaN.
template <ElementType kType>
NVFP4KV_HD uint32_t non_finite_floor() {
  return kType == ElementType::kBFloat16 ? 0x7F80u : 0x7C00u;
}

// Lane-wise max of the magnitudes of two pairs; a NaN in either lane gives a
// NaN, whose magnitude bits are above non_finite_floor. Only the magnitude bits
// of the result are meaningful (the device instruction puts a sign there).
template <ElementType kType>
NVFP4KV_HD uint32_t max_abs_pair(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (kType == ElementType::kBFloat16)
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else
    asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  // Finite magnitudes order like their bit patterns; NaN patterns sit above Inf.
  const uint32_t lo = (a & 0x7FFFu) > (b & 0x7FFFu) ? (a & 0x7FFFu) : (b & 0x7FFFu);
  const uint32_t ha = (a >> 16) & 0x7FFFu, hb = (b >> 16) & 0x7FFFu;
  return lo | (ha > hb ? ha : hb) << 16;
#endif
}

// The magnitude bits of the block's largest |x|, or a value >= non_finite_floor
// if any element is Inf or NaN.
template <ElementType kType>
NVFP4KV_HD uint32_t packed_amax(const uint32_t (&w)[8]) {
  const uint32_t m = max_abs_pair<kType>(max_abs_pair<kType>(max_abs_pair<kType>(w[0], w[1]), max_abs_pair<kType>(w[2], w[3])),
                                         max_abs_pair<kType>(max_abs_pair<kType>(w[4], w[5]), max_abs_pair<kType>(w[6], w[7])));
  const uint32_t lo = m & 0x7FFFu, hi = (m >> 16) & 0x7FFFu;
  return lo > hi ? lo : hi;
}

// Blackwell (sm_100a, sm_120a and their families) converts two floats to E2M1
// in one instruction; Hopper has no such conversion and uses e2m1_counts.
// The instruction's semantics (rounding, signed zeros, saturation, nibble order:
// its first source goes to the high nibble) are the CUDA toolkit's definition,
// which tests/cpu/test_toolkit_conversions.cpp checks equal to ours.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH__ >= 1000 && \
    __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define NVFP4KV_NATIVE_E2M1 1
#else
#define NVFP4KV_NATIVE_E2M1 0
#endif

// Elements 8k .. 8k + 7 (the words w[4k .. 4k + 3]) as one word of 8 nibbles,
// element 2i in the low nibble of byte i; any architecture.
template <ElementType kType>
NVFP4KV_HD uint32_t encode_eight_portable(const uint32_t* w, float inv) {
  uint32_t pair[4];
  for (int k = 0; k < 4; ++k) {
    // Each sum holds its magnitude code in bits 0-2 and zeros in bits 3-23, so
    // hi * 16 + lo has both codes in byte 0 with the sign positions clear.
    const uint32_t lo = e2m1_counts(low_element<kType>(w[k]) * inv).sum();
    const uint32_t hi = e2m1_counts(high_element<kType>(w[k]) * inv).sum();
    pair[k] = hi * 16u + lo;
  }
  const uint32_t magnitudes = byte_perm(byte_perm(pair[0], pair[1], 0x0040u), byte_perm(pair[2], pair[3], 0x0040u), 0x5410u);
  // Sign of element 2k + 1 is bit 7 of byte 3 of w[k], of element 2k bit 7 of
  // byte 1. x * inv keeps x's sign (inv >= 0; a zero inv gives a signed zero), so
  // these are the signs of the codes.
  const uint32_t s01 = byte_perm(w[0], w[1], 0x5173u), s23 = byte_perm(w[2], w[3], 0x5173u);
  const uint32_t odd = byte_perm(s01, s23, 0x5410u), even = byte_perm(s01, s23, 0x7632u);
  return magnitudes | (odd & 0x80808080u) | ((even >> 4) & 0x08080808u);
}

// The same with Blackwell's conversion instruction where it exists.
template <ElementType kType>
NVFP4KV_HD uint32_t encode_eight(const uint32_t* w, float inv) {
#if NVFP4KV_NATIVE_E2M1
  float y[8];
  for (int k = 0; k < 4; ++k) y[2 * k] = low_element<kType>(w[k]) * inv, y[2 * k + 1] = high_element<kType>(w[k]) * inv;
  uint32_t r;
  asm("{\n .reg .b8 b0, b1, b2, b3;\n"
      " cvt.rn.satfinite.e2m1x2.f32 b0, %2, %1;\n"
      " cvt.rn.satfinite.e2m1x2.f32 b1, %4, %3;\n"
      " cvt.rn.satfinite.e2m1x2.f32 b2, %6, %5;\n"
      " cvt.rn.satfinite.e2m1x2.f32 b3, %8, %7;\n"
      " mov.b32 %0, {b0, b1, b2, b3};\n}"
      : "=r"(r)
      : "f"(y[0]), "f"(y[1]), "f"(y[2]), "f"(y[3]), "f"(y[4]), "f"(y[5]), "f"(y[6]), "f"(y[7]));
  return r;
#else
  return encode_eight_portable<kType>(w, inv);
#endif
}

struct PackedBlock {
  uint32_t data[2];  // the 8 data bytes, little-endian
  uint8_t scale;
};

// The standard rule for a block of finite elements whose packed_amax is amax_bits.
template <ElementType kType>
NVFP4KV_HD PackedBlock quantize_finite_block(const uint32_t (&w)[8], uint32_t amax_bits, float global_scale) {
  const float amax = kType == ElementType::kBFloat16 ? bits_float(amax_bits << 16) : fp16_bits_to_float(uint16_t(amax_bits));
  PackedBlock b;
  b.scale = block_scale_code(amax, global_scale, 6.0f);
  const float inv = block_inverse_scale(b.scale, global_scale);
  b.data[0] = encode_eight<kType>(w, inv);
  b.data[1] = encode_eight<kType>(w + 4, inv);
  return b;
}

// ---- Dequantization (the gather kernel) ------------------------------------
// The output of an element depends only on its code and its block's scale, so a
// block is decoded through a table of the 8 magnitudes' outputs, looked up four
// elements at a time by byte permutes (the 3-bit magnitude codes are valid
// permute selectors); the sign is then flipped in the output's sign bit, which
// gives -0 for code 8, as the reference's (-0 * scale) * global scale does.
// Each entry is computed as dequantize_element does, (e2m1 * scale) * global
// scale rounded to the output type.
struct DecodeTable {
  uint32_t low[2], high[2];  // byte m of {low[0], low[1]}: low byte of magnitude m's output
};

// Two floats rounded to nearest even into one word of two 16-bit values.
template <ElementType kOut>
NVFP4KV_HD uint32_t round_pair(float a, float b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (kOut == ElementType::kBFloat16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
#else
  if constexpr (kOut == ElementType::kBFloat16) return uint32_t(float_to_bf16(a)) | uint32_t(float_to_bf16(b)) << 16;
  else return uint32_t(float_to_fp16(a)) | uint32_t(float_to_fp16(b)) << 16;
#endif
}

template <ElementType kOut>
NVFP4KV_HD DecodeTable decode_table(uint8_t scale, float global_scale) {
  const float sf = e4m3_decode(scale);
  uint32_t pairs[4];
  for (int k = 0; k < 4; ++k)
    pairs[k] = round_pair<kOut>((e2m1_decode(uint8_t(2 * k)) * sf) * global_scale,
                                (e2m1_decode(uint8_t(2 * k + 1)) * sf) * global_scale);
  return {{byte_perm(pairs[0], pairs[1], 0x6420u), byte_perm(pairs[2], pairs[3], 0x6420u)},
          {byte_perm(pairs[0], pairs[1], 0x7531u), byte_perm(pairs[2], pairs[3], 0x7531u)}};
}

// The 8 elements of one data word (element 2i in the low nibble of byte i) as
// four words of two outputs.
NVFP4KV_HD void decode_eight(const DecodeTable& t, uint32_t d, uint32_t (&out)[4]) {
  const uint32_t m = d & 0x77777777u;
  const uint32_t lo03 = byte_perm(t.low[0], t.low[1], m), hi03 = byte_perm(t.high[0], t.high[1], m);
  const uint32_t lo47 = byte_perm(t.low[0], t.low[1], m >> 16), hi47 = byte_perm(t.high[0], t.high[1], m >> 16);
  out[0] = byte_perm(lo03, hi03, 0x5140u);
  out[1] = byte_perm(lo03, hi03, 0x7362u);
  out[2] = byte_perm(lo47, hi47, 0x5140u);
  out[3] = byte_perm(lo47, hi47, 0x7362u);
  // Signs: element 2k's is bit 7 of byte k of d << 4, element 2k + 1's bit 7 of
  // byte k of d; the permute's replicate mode copies each into bits 15 and 31.
  const uint32_t e = d << 4;
  for (int k = 0; k < 4; ++k) out[k] ^= byte_perm(e, d, 0x8888u | uint32_t(k) << 4 | uint32_t(k + 4) << 12) & 0x80008000u;
}

}  // namespace nvfp4kv
