// The architecture probe: an empty kernel compiled with the same architecture
// list as every other kernel of the library, so the image the CUDA runtime picks
// for it on a device is the kind of image it picks for all of them.
#include <cuda_runtime_api.h>

#include <atomic>

#include "arch.hpp"

namespace nvfp4kv::kernels {
namespace {

__global__ void arch_probe_kernel() {}

constexpr int kSupportedPtx = 90;  // the kernels' oldest architecture (device.cuh)
constexpr int kCachedDevices = 64;
// Per device: 0 not asked yet, 1 supported, 2 not (then the message is rebuilt on each call).
std::atomic<int> g_verdict[kCachedDevices];

std::string ask(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cannot query CUDA device " + std::to_string(device);
  }
  const std::string gpu = std::string(prop.name) + " (sm_" + std::to_string(prop.major * 10 + prop.minor) + ")";
  cudaFuncAttributes attr{};
  if (const cudaError_t e = cudaFuncGetAttributes(&attr, arch_probe_kernel); e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so the caller's next error check is its own
    return "nvfp4kv's kernels were not compiled for the " + gpu +
           "; build them for sm_90a, sm_100a or sm_120a (CMAKE_CUDA_ARCHITECTURES) on a GPU of compute capability 9.0 or newer (" +
           cudaGetErrorString(e) + ")";
  }
  if (attr.ptxVersion < kSupportedPtx)
    return "the " + gpu + " would run nvfp4kv's kernels as compiled for sm_" + std::to_string(attr.ptxVersion) +
           ", which they do not support: they need a GPU of compute capability 9.0 or newer and a build that "
           "includes its architecture (CMAKE_CUDA_ARCHITECTURES 90a, 100a or 120a)";
  return "";
}

}  // namespace

std::string device_arch_problem() {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no current CUDA device: ") + cudaGetErrorString(e);
  }
  if (device >= 0 && device < kCachedDevices) {
    const int v = g_verdict[device].load(std::memory_order_relaxed);
    if (v == 1) return "";
    std::string why = ask(device);
    g_verdict[device].store(why.empty() ? 1 : 2, std::memory_order_relaxed);
    return why;
  }
  return ask(device);
}

}  // namespace nvfp4kv::kernels
