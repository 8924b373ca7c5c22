#pragma once
// The dequantize part of attention: cache elements and block scales as FP16 MMA
// operands. A format policy is a struct with the same members; the tiles call
// only these, so a second element format (FP8 below; a transform applied to q and
// the output instead of K/V) changes the policy, not the tile. Per side (K, V) a
// kernel takes the policy of that side's element format (CacheDims::element).
//
// The members a tile uses:
//   kBlockScales       the side has a block scale per 16 elements (else a per-tensor
//                      scale only, which the kernel folds into the logit or output scale);
//   kWordsPer8         32-bit data words holding 8 elements (NVFP4 1, FP8 2);
//   data_row(D), scale_row(D)  bytes of one token's data row and scale row at head dim D;
//   kExponentBias, kUndo       the power of two every placed element carries (undone once
//                      per row, in the logit multiplier for K and the output scale for V);
//   place8(w, r)       8 elements (words w[0 .. kWordsPer8)) as 4 FP16 pairs (e k, e k + 4);
//   place_pairs(a, b, r)  8 elements of two tokens as FP16 pairs (a's, b's) of element
//                      4 h + k in r[h][k];
//   scale_pair(code), scale_pair2(lo, hi)  block scales as FP16 pairs (kBlockScales only).
//
// Nvfp4Fp16: E2M1 codes placed as FP16 values code * 2^-kExponentBias (exact, by
// bit placement: Hopper has no E2M1 conversion instruction) and E4M3 block scales
// converted to FP16 (exact: FP16 holds every E4M3 value); their product is exact
// in FP16 (<= 6 significant bits, >= 2^-24). A kernel undoes 2^-kExponentBias
// once per row, in the logit multiplier for K and in the output scale for V.
#include <cuda_fp16.h>

#include <cstdint>

namespace nvfp4kv::kernels::attention {

struct Nvfp4Fp16 {
  static constexpr bool kBlockScales = true;
  static constexpr int kWordsPer8 = 1;
  __host__ __device__ static constexpr int data_row(int d) { return d / 2; }
  __host__ __device__ static constexpr int scale_row(int d) { return d / 16; }
  // Every placed element carries this power of two: value = code * 2^-14.
  static constexpr int kExponentBias = 14;
  static constexpr float kUndo = 16384.0f;  // 2^kExponentBias

  // An E4M3 block scale as two equal FP16 values.
  __device__ __forceinline__ static uint32_t scale_pair(uint32_t code) {
    uint32_t pair;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(pair) : "h"(uint16_t(code * 0x101u)));
    return pair;
  }

  // Two E4M3 block scales as one FP16 pair (lo, hi).
  __device__ __forceinline__ static uint32_t scale_pair2(uint32_t lo, uint32_t hi) {
    uint32_t pair;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(pair) : "h"(uint16_t(lo | (hi << 8))));
    return pair;
  }

  // Eight E2M1 codes (a data word: element e in bits 4e..4e+3) as four FP16 pairs
  // (element k, element k + 4), each value e2m1 * 2^-14 exactly: the 3 magnitude
  // bits go under the FP16 exponent's low bits and the mantissa's top bit (a
  // subnormal for code 1, 0.5 * 2^-14), the sign to bit 15; the low byte is zero.
  // So each FP16's high byte is (sign << 7) | (magnitude << 1): made for the low
  // nibbles (lo) and the high nibbles (hi) of the word's four bytes at once, then
  // moved into place by byte permutes with a zero register. About 11 operations
  // per 8 elements.
  __device__ __forceinline__ static void place(uint32_t w, uint32_t (&r)[4]) {
    const uint32_t lo = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
    const uint32_t hi = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
    r[0] = __byte_perm(lo, 0u, 0x2404);  // elements 0, 4: low nibbles of bytes 0, 2
    r[1] = __byte_perm(hi, 0u, 0x2404);  // elements 1, 5: high nibbles of bytes 0, 2
    r[2] = __byte_perm(lo, 0u, 0x3414);  // elements 2, 6
    r[3] = __byte_perm(hi, 0u, 0x3414);  // elements 3, 7
  }

  __device__ __forceinline__ static void place8(const uint32_t* w, uint32_t (&r)[4]) { place(w[0], r); }
  // Two tokens' words: their low halves merged (4 elements each) place as (a's, b's) pairs.
  __device__ __forceinline__ static void place_pairs(const uint32_t* a, const uint32_t* b, uint32_t (&r)[2][4]) {
    place(__byte_perm(a[0], b[0], 0x5410), r[0]);
    place(__byte_perm(a[0], b[0], 0x7632), r[1]);
  }
};

// The same placement from data bytes in the fp16-split code order (core/layout.hpp): element
// 2i already where an FP16's high byte wants it (sign at bit 7, e1 e0 m at bits 3..1), element
// 2i + 1 with its sign at bit 0 and e1 e0 m at bits 6..4. Byte-local like place(), so token
// pairs merged by byte permutes before it still place right. 9 operations per 8 elements.
struct Nvfp4Fp16Split : Nvfp4Fp16 {
  __device__ __forceinline__ static void place(uint32_t w, uint32_t (&r)[4]) {
    const uint32_t lo = w & 0x8E8E8E8Eu;
    const uint32_t hi = ((w >> 3) & 0x0E0E0E0Eu) | ((w << 7) & 0x80808080u);
    r[0] = __byte_perm(lo, 0u, 0x2404);
    r[1] = __byte_perm(hi, 0u, 0x2404);
    r[2] = __byte_perm(lo, 0u, 0x3414);
    r[3] = __byte_perm(hi, 0u, 0x3414);
  }
  __device__ __forceinline__ static void place8(const uint32_t* w, uint32_t (&r)[4]) { place(w[0], r); }
  __device__ __forceinline__ static void place_pairs(const uint32_t* a, const uint32_t* b, uint32_t (&r)[2][4]) {
    place(__byte_perm(a[0], b[0], 0x5410), r[0]);
    place(__byte_perm(a[0], b[0], 0x7632), r[1]);
  }
};

// FP8 E4M3 elements (one byte each, a per-tensor scale only): two bytes become an FP16
// pair by one conversion (exact: FP16 holds every E4M3 value, NaN stays NaN), after a
// byte permute that pairs the bytes the MMA operand wants. No block scales, no power
// of two to undo. 8 elements: 2 permutes and 4 conversions.
struct Fp8E4m3Fp16 {
  static constexpr bool kBlockScales = false;
  static constexpr int kWordsPer8 = 2;
  __host__ __device__ static constexpr int data_row(int d) { return d; }
  __host__ __device__ static constexpr int scale_row(int) { return 0; }
  static constexpr int kExponentBias = 0;
  static constexpr float kUndo = 1.0f;

  // Bytes lo (bits 0..7) and hi (bits 8..15) of x as the FP16 pair (lo, hi).
  __device__ __forceinline__ static uint32_t pair(uint32_t x) {
    uint32_t out;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(uint16_t(x)));
    return out;
  }
  // Elements 0..3 in w[0], 4..7 in w[1]: pairs (k, k + 4).
  __device__ __forceinline__ static void place8(const uint32_t* w, uint32_t (&r)[4]) {
    const uint32_t p01 = __byte_perm(w[0], w[1], 0x5140), p23 = __byte_perm(w[0], w[1], 0x7362);
    r[0] = pair(p01), r[1] = pair(p01 >> 16), r[2] = pair(p23), r[3] = pair(p23 >> 16);
  }
  // Token a's elements 4 h .. 4 h + 3 in a[h], b's in b[h]: pairs (a's, b's) of element 4 h + k.
  __device__ __forceinline__ static void place_pairs(const uint32_t* a, const uint32_t* b, uint32_t (&r)[2][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t p01 = __byte_perm(a[h], b[h], 0x5140), p23 = __byte_perm(a[h], b[h], 0x7362);
      r[h][0] = pair(p01), r[h][1] = pair(p01 >> 16), r[h][2] = pair(p23), r[h][3] = pair(p23 >> 16);
    }
  }
};

}  // namespace nvfp4kv::kernels::attention
