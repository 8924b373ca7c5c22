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
// One poll of a barrier's phase: true once it has completed. The hardware may hold
// the thread a while inside the poll before answering false.
__device__ __forceinline__ bool barrier_try_wait(uint64_t* bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(shared_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) {
  while (!barrier_try_wait(bar, parity)) {
  }
}

// A wait that cannot poll forever: after kBarrierMaxPolls failed polls the kernel
// stops with a trap, which the host sees as a launch failure at its next
// synchronisation, instead of a GPU that hangs (run 40: a copy expecting more bytes
// than arrived left a phase incomplete for good). A failed poll holds the thread up
// to a hardware time limit (2^24 polls outlasted a 60 s test on the H200, run 42: so
// each takes microseconds; tests/gpu/barrier_timeout.cu prints how long); every
// legitimate wait is one stage's copies or tile math, microseconds. A pipeline puts
// it in its producer, which then waits for the consumers to release every stage it
// issued before leaving: consumers stuck on a stage leave the producer stuck on the
// release, and the producer's bound stops the kernel. The consumers' own waits stay
// plain: bounding them (a poll count or a %globaltimer deadline alike) made ptxas
// recompute values inside decode's tile loop, 563 -> 608 instructions per tile.
inline constexpr uint32_t kBarrierMaxPolls = 1u << 20;
__device__ __forceinline__ void barrier_wait_bounded(uint64_t* bar, unsigned parity,
                                                     uint32_t max_polls = kBarrierMaxPolls) {
  for (uint32_t polls = 0; !barrier_try_wait(bar, parity);)
    if (++polls == max_polls) __trap();
}

// A tensor copy (sm_90+): the box at (c0, c1, c2, c3) of the tensor `map`
// describes (a __grid_constant__ parameter) into shared memory, completed on a
// transaction-counting barrier like copy_bulk; elements outside the tensor arrive
// as zeros and are never read. The destination is 128-byte aligned.
__device__ __forceinline__ void copy_tensor_4d(void* shared, const void* map, int c0, int c1, int c2, int c3,
                                               uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(shared_address(shared)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(bar))
      : "memory");
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
// Registers moved between warpgroups (setmaxnreg): a warpgroup gives its registers back
// down to kRegs a thread, or takes them up to kRegs (multiples of 8 in [24, 256]; every
// warp of the warpgroup executes it). The instruction exists on the arch- and
// family-specific targets (sm_90a, sm_100a/f, sm_120a/f); a build for a plain target
// (sm_90 and its PTX) leaves every warp at the launch's registers: the same results, with
// whatever spills that costs.
template <int kRegs>
__device__ __forceinline__ void warpgroup_release_registers() {
#if defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_take_registers() {
#if defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
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
