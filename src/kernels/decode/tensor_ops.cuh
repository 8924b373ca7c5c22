#pragma once
// The instructions decode attention is built from (sm_90): FP16 tensor-core MMA,
// register transposes, E4M3 conversion, and the E2M1 -> FP16 bit placement.
#include <cuda_fp16.h>

#include <cstdint>

namespace nvfp4kv::kernels::decode {

// c += a (16 x 16, row-major fragments) * b (16 x 8, column-major), FP16 in, FP32 accumulate.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// An E4M3 block scale as two equal FP16 values (exact: FP16 holds every E4M3 value).
__device__ __forceinline__ uint32_t scale_pair(uint32_t code) {
  uint32_t pair;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(pair) : "h"(uint16_t(code * 0x101u)));
  return pair;
}

// Eight E2M1 codes (a data word: element e in bits 4e..4e+3) as four FP16 pairs
// (element k, element k + 4), each value e2m1 * 2^-14 exactly: the 3 magnitude
// bits go under the FP16 exponent's low bits and the mantissa's top bit (a
// subnormal for code 1, 0.5 * 2^-14), the sign to bit 15; the low byte is zero.
// So each FP16's high byte is (sign << 7) | (magnitude << 1): made for the low
// nibbles (lo) and the high nibbles (hi) of the word's four bytes at once, then
// moved into place by byte permutes with a zero register. About 11 operations
// per 8 elements; Hopper has no E2M1 conversion instruction.
__device__ __forceinline__ void place_e2m1(uint32_t w, uint32_t (&r)[4]) {
  const uint32_t lo = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
  const uint32_t hi = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
  r[0] = __byte_perm(lo, 0u, 0x2404);  // elements 0, 4: low nibbles of bytes 0, 2
  r[1] = __byte_perm(hi, 0u, 0x2404);  // elements 1, 5: high nibbles of bytes 0, 2
  r[2] = __byte_perm(lo, 0u, 0x3414);  // elements 2, 6
  r[3] = __byte_perm(hi, 0u, 0x3414);  // elements 3, 7
}

// Two E4M3 block scales as one FP16 pair (lo, hi), exactly.
__device__ __forceinline__ uint32_t scale_pair2(uint32_t lo, uint32_t hi) {
  uint32_t pair;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(pair) : "h"(uint16_t(lo | (hi << 8))));
  return pair;
}

// The transpose of an 8 x 8 FP16 matrix held as m8n8 fragments (lane 4r + q: row
// r, columns 2q and 2q + 1).
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// 2^x, approximately (relative error ~2^-22), flushing results below 2^-126 to zero.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 r = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&r);
}

}  // namespace nvfp4kv::kernels::decode
