#pragma once
// Small device helpers shared by the kernel families.
#include <cstdint>

// The kernels run on sm_90 and newer. An engine that builds nvfp4kv for older
// targets as well (CMAKE_CUDA_ARCHITECTURES "80;90a") must still build: for those
// targets every __global__ body compiles to a trap and instantiates none of the
// sm_86+/sm_90 device code, and the launchers refuse such a device before any
// launch (arch.hpp), so the trap is never reached.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define NVFP4KV_KERNEL_ARCH_SUPPORTED 0
#else
#define NVFP4KV_KERNEL_ARCH_SUPPORTED 1
#endif

namespace nvfp4kv::kernels {

// Per-thread asynchronous copies global -> shared (sm_80+) of 4, 8 or 16 bytes
// through L1, of 16 bytes past it (streamed data read once), their group commit
// and wait. A thread's groups complete in order.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(global), "n"(kBytes) : "memory");
}
__device__ __forceinline__ void copy_async_stream(void* shared, const void* global) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(global) : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The quiet NaN of a 16-bit output type, twice: rows that must not pass for data.
template <bool kBFloat16>
__device__ __forceinline__ uint4 nan_chunk() {
  const uint32_t nan2 = kBFloat16 ? 0x7FC07FC0u : 0x7E007E00u;
  return make_uint4(nan2, nan2, nan2, nan2);
}

}  // namespace nvfp4kv::kernels
