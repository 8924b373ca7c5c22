#pragma once
// The instructions decode attention is built from (sm_90): FP16 tensor-core MMA,
// transposing shared-memory loads, per-thread asynchronous copies, E4M3
// conversion, and the E2M1 -> FP16 bit placement.
#include <cuda_fp16.h>

#include <cstdint>

namespace nvfp4kv::kernels::decode {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// c += a (16 x 16, row-major fragments) * b (16 x 8, column-major), FP16 in, FP32 accumulate.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8 x 8 FP16 matrices, transposed: lane 8m + r gives row r of matrix m.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// Per-thread asynchronous copies of 4, 8 or 16 bytes.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(shared_address(shared)), "l"(global), "n"(kBytes)
               : "memory");
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
// subnormal for code 1, 0.5 * 2^-14), the sign to bit 15. Two shifts and one
// logic op per pair; Hopper has no E2M1 conversion instruction.
__device__ __forceinline__ void place_e2m1(uint32_t w, uint32_t (&r)[4]) {
  r[0] = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
  r[1] = ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u);
  r[2] = ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u);
  r[3] = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
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
