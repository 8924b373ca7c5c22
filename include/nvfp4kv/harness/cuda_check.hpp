#pragma once
// The one CUDA error check of the harness, the GPU tests, the benchmarks and the
// CLI: a failed call throws CudaError naming the call and where it was made.
#include <cuda_runtime_api.h>

#include <string>

#include "nvfp4kv/core/error.hpp"

namespace nvfp4kv::harness {

class CudaError : public Error {
 public:
  using Error::Error;
};

inline void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw CudaError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorString(e));
}

}  // namespace nvfp4kv::harness

#define NVFP4KV_CUDA_CHECK(call) ::nvfp4kv::harness::cuda_check((call), #call, __FILE__, __LINE__)
