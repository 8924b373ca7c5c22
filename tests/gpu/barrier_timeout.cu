// A pipeline barrier whose phase never completes stops the kernel instead of hanging
// the GPU (src/kernels/common/device.cuh, barrier_wait_bounded): the host sees an error at its
// next synchronisation. Its own program, since the trap ends the process's CUDA
// context; ctest's timeout turns a hang into a failure. Exit 77 (skipped, with the
// reason) without an sm_90+ GPU.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "../../src/kernels/common/device.cuh"

namespace {

using namespace nvfp4kv::kernels;

// Two arrivals expected; `arrivals` of them happen, then every thread waits.
__global__ void wait_for_phase(int arrivals, uint32_t max_polls, int* passed) {
#if NVFP4KV_KERNEL_ARCH_SUPPORTED
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    barrier_init(&bar, 2);
    barrier_init_fence();
  }
  __syncthreads();
  if (int(threadIdx.x) < arrivals) barrier_arrive(&bar);
  barrier_wait_bounded(&bar, 0, max_polls);
  atomicAdd(passed, 1);
#endif
}

int fail(const char* what, cudaError_t e) {
  std::printf("FAILED: %s: %s\n", what, cudaGetErrorString(e));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The bound the kernels use, or a smaller one (argument) to see what one poll costs.
  const uint32_t bound = argc > 1 ? uint32_t(std::strtoul(argv[1], nullptr, 10)) : kBarrierMaxPolls;
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // what was printed survives a timeout's kill
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (the barrier timeout needs an sm_90+ GPU)\n");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major < 9) {
    std::printf("SKIPPED: %s is older than sm_90 (no transaction barriers)\n", prop.name);
    return 77;
  }
  int* passed = nullptr;
  if (const cudaError_t e = cudaMallocManaged(&passed, sizeof(int)); e != cudaSuccess) return fail("cudaMallocManaged", e);
  // Both arrivals: every thread passes the barrier, well inside the timeout.
  *passed = 0;
  wait_for_phase<<<1, 64>>>(2, kBarrierMaxPolls, passed);
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return fail("a completing phase", e);
  if (*passed != 64) {
    std::printf("FAILED: %d of 64 threads passed a completed phase\n", *passed);
    return 1;
  }
  std::printf("a completed phase: 64 threads passed; now one that never completes (bound %u polls)\n", bound);
  // One arrival of two: the phase never completes; the kernels' own bound stops it.
  // How long that takes is printed, not asserted: it is what kBarrierMaxPolls means
  // on this GPU.
  const auto start = std::chrono::steady_clock::now();
  wait_for_phase<<<1, 64>>>(1, bound, passed);
  const cudaError_t e = cudaDeviceSynchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (e == cudaSuccess) {
    std::printf("FAILED: a phase that never completes let the kernel finish\n");
    return 1;
  }
  std::printf("PASSED: a completed phase lets 64 threads through; one that never completes stops the kernel "
              "after %u polls, %.3f s, %.2f us a poll (%s)\n", bound, seconds, 1e6 * seconds / bound, cudaGetErrorString(e));
  return 0;
}
