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

// A shared-memory address as the 32-bit operand the PTX below takes.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Per-thread asynchronous copies global -> shared (sm_80+) of 4, 8 or 16 bytes
// through L1, their group commit and wait. A thread's groups complete in order.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(shared_address(shared)), "l"(global), "n"(kBytes)
               : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Bulk copies global -> shared by the copy engine (sm_90+), completed on a
// transaction-counting barrier in shared memory: one thread announces a phase's
// bytes (arrive_expect_bytes), any threads issue copies against it, and readers
// wait for the phase's parity. Sizes and both addresses must be multiples of 16.
__device__ __forceinline__ void barrier_init(uint64_t* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the copy engine (before a block barrier).
__device__ __forceinline__ void barrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void copy_bulk(void* shared, const void* global, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(shared)),
               "l"(global), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}
// The waiting thread is suspended until the phase completes (or the hint, 1 ms,
// passes), so warps that wait do not take issue slots from the ones working
// (run 38: the consumers' spinning on a row-mode stage was 75 % of the samples
// while the producer warp, the one that fills it, got an issue slot in four).
__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// A plain arrival on a barrier (release: the arriving thread's earlier writes are
// visible to whoever waits for the phase).
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// An arrival on a barrier once every cp.async this thread issued before has
// landed; it counts as one of the phase's expected arrivals (.noinc).
__device__ __forceinline__ void barrier_arrive_after_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// A block barrier (hardware barrier `id`) that `threads` threads (a multiple of
// 32) reach from different places in the code, e.g. a warp-specialized kernel's
// producer and consumer branches: the non-aligned form, which PTX defines for
// threads at different barrier instructions (bar.sync / __syncthreads are the
// aligned form, defined only when every thread runs the same instruction).
__device__ __forceinline__ void sync_threads(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The quiet NaN of a 16-bit output type, twice: rows that must not pass for data.
template <bool kBFloat16>
__device__ __forceinline__ uint4 nan_chunk() {
  const uint32_t nan2 = kBFloat16 ? 0x7FC07FC0u : 0x7E007E00u;
  return make_uint4(nan2, nan2, nan2, nan2);
}

}  // namespace nvfp4kv::kernels
