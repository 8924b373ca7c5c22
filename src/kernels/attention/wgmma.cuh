#pragma once
// Warpgroup MMA (wgmma, sm_90a only) for the attention tiles: FP16 operands, FP32
// accumulators, A from shared memory or registers, B from shared memory, both read
// through 128-byte-swizzled tiles.
//
// The shared-memory tile these instructions read (swizzled_offset below): rows of a
// matrix split into panels of 64 FP16 columns (128 bytes a row); in a panel, row r's
// 16-byte chunk c sits at chunk c ^ (r % 8) of the row, each panel's rows back to back
// and every panel 1024-byte aligned (the swizzle acts on address bits 4-6 by bits 7-9).
// One layout serves both operand orders: a (token, D) tile is a K-major B operand of
// S = Q K^T (K = D) and an N-major B operand of O = P V (K = tokens, N = D).
//
// Facts taken from the PTX ISA: the matrix descriptor (start address, leading and
// stride byte offsets in 16-byte units, swizzle mode in bits 62-63: 1 = 128 bytes); for
// a K-major swizzled operand the stride offset steps 8-row groups and a k-step of 16
// columns moves the start by 32 bytes inside the 128-byte row; for an N-major operand
// the leading offset steps 64-column panels and the stride offset 8-row groups of K. The
// accumulator of m64nNk16 gives warp w of the warpgroup rows 16w .. 16w + 15 as the
// m16n8 fragments of mma.sync (lane 4g + c: rows g, g + 8, columns 8j + 2c, + 1, in
// d[j][0..3]), and a register A operand is mma.sync's m16k16 A fragment per warp.
#include <cstdint>

#include "../common/device.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NVFP4KV_HAS_WGMMA 1
#else
#define NVFP4KV_HAS_WGMMA 0
#endif

namespace nvfp4kv::kernels::attention {

// Byte offset of element (row, col) of a swizzled tile of `rows` rows (a multiple of 8).
__host__ __device__ constexpr int swizzled_offset(int rows, int row, int col) {
  return (col / 64) * rows * 128 + row * 128 + ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

// A descriptor of a 128-byte-swizzled operand at `at` (shared memory, 16-byte aligned inside
// a 1024-byte-aligned panel), leading and stride byte offsets as above.
__device__ __forceinline__ uint64_t swizzled_desc(const void* at, uint32_t leading, uint32_t stride) {
  const uint64_t addr = shared_address(at);
  return ((addr & 0x3FFFFu) >> 4) | (uint64_t((leading >> 4) & 0x3FFFu) << 16) |
         (uint64_t((stride >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}

// The descriptor of k-step ks (columns 16 ks .. 16 ks + 15) of a K-major operand: rows row0 ..
// row0 + 63 (row0 a multiple of 8) of a swizzled tile of `rows` rows. Inside a panel a k-step
// moves the start by 32 bytes; 8-row groups are 1024 bytes apart.
__device__ __forceinline__ uint64_t kmajor_desc(const void* tile, int rows, int row0, int ks) {
  return swizzled_desc(static_cast<const char*>(tile) + swizzled_offset(rows, row0, 16 * ks), 16, 1024);
}
// The descriptor of k-step kk (rows 16 kk .. 16 kk + 15) of an N-major operand: a swizzled tile
// of `rows` rows whose columns are N; its 64-column panels are a panel's bytes apart.
__device__ __forceinline__ uint64_t nmajor_desc(const void* tile, int rows, int kk) {
  return swizzled_desc(static_cast<const char*>(tile) + swizzled_offset(rows, 16 * kk, 0), rows * 128, 1024);
}

#if NVFP4KV_HAS_WGMMA
// Orders this warpgroup's register accesses before the wgmma that follow (accumulators
// written by ordinary instructions, register A operands).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
#endif
// Generic-proxy stores to shared memory made visible to the async proxy (wgmma's operand
// reads): each writing thread, after its stores and before the barrier readers wait on.
__device__ __forceinline__ void fence_shared_to_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving reads or writes of an accumulator across this point
// (the registers an asynchronous wgmma writes are not the compiler's to touch until
// wgmma_wait returns).
template <int kN>
__device__ __forceinline__ void fence_accumulators(float (&d)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
    asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

#define NVFP4KV_WG_F4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#if NVFP4KV_HAS_WGMMA
// d (64 x 64) = A (64 x 16, shared) * B (16 x 64, shared) + (accumulate ? d : 0), both K-major.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : NVFP4KV_WG_F4(d, 0), NVFP4KV_WG_F4(d, 1), NVFP4KV_WG_F4(d, 2), NVFP4KV_WG_F4(d, 3), NVFP4KV_WG_F4(d, 4), NVFP4KV_WG_F4(d, 5), NVFP4KV_WG_F4(d, 6), NVFP4KV_WG_F4(d, 7)
      : "l"(a), "l"(b), "r"(accumulate));
}
// d (64 x 64) = A (64 x 16, registers: mma.sync's A fragment per warp) * B (16 x 64, shared, N-major) + (accumulate ? d : 0).
__device__ __forceinline__ void wgmma_m64n64k16_rs_nmajor(float (&d)[8][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : NVFP4KV_WG_F4(d, 0), NVFP4KV_WG_F4(d, 1), NVFP4KV_WG_F4(d, 2), NVFP4KV_WG_F4(d, 3), NVFP4KV_WG_F4(d, 4), NVFP4KV_WG_F4(d, 5), NVFP4KV_WG_F4(d, 6), NVFP4KV_WG_F4(d, 7)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
}
#endif
#if NVFP4KV_HAS_WGMMA
// d (64 x 128) = A (64 x 16, shared) * B (16 x 128, shared) + (accumulate ? d : 0), both K-major.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : NVFP4KV_WG_F4(d, 0), NVFP4KV_WG_F4(d, 1), NVFP4KV_WG_F4(d, 2), NVFP4KV_WG_F4(d, 3), NVFP4KV_WG_F4(d, 4), NVFP4KV_WG_F4(d, 5), NVFP4KV_WG_F4(d, 6), NVFP4KV_WG_F4(d, 7), NVFP4KV_WG_F4(d, 8), NVFP4KV_WG_F4(d, 9), NVFP4KV_WG_F4(d, 10), NVFP4KV_WG_F4(d, 11), NVFP4KV_WG_F4(d, 12), NVFP4KV_WG_F4(d, 13), NVFP4KV_WG_F4(d, 14), NVFP4KV_WG_F4(d, 15)
      : "l"(a), "l"(b), "r"(accumulate));
}
// d (64 x 128) = A (64 x 16, registers: mma.sync's A fragment per warp) * B (16 x 128, shared, N-major) + (accumulate ? d : 0).
__device__ __forceinline__ void wgmma_m64n128k16_rs_nmajor(float (&d)[16][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : NVFP4KV_WG_F4(d, 0), NVFP4KV_WG_F4(d, 1), NVFP4KV_WG_F4(d, 2), NVFP4KV_WG_F4(d, 3), NVFP4KV_WG_F4(d, 4), NVFP4KV_WG_F4(d, 5), NVFP4KV_WG_F4(d, 6), NVFP4KV_WG_F4(d, 7), NVFP4KV_WG_F4(d, 8), NVFP4KV_WG_F4(d, 9), NVFP4KV_WG_F4(d, 10), NVFP4KV_WG_F4(d, 11), NVFP4KV_WG_F4(d, 12), NVFP4KV_WG_F4(d, 13), NVFP4KV_WG_F4(d, 14), NVFP4KV_WG_F4(d, 15)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
}
#endif
#undef NVFP4KV_WG_F4

}  // namespace nvfp4kv::kernels::attention
