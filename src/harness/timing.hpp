#pragma once
// The one event-timed median of the benchmarks: `launch` once to warm up, then
// `reps` times between two events on `stream`.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "nvfp4kv/harness/cuda_check.hpp"

namespace nvfp4kv::harness {

template <typename F>
float median_ms(F&& launch, int reps, cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  NVFP4KV_CUDA_CHECK(cudaEventCreate(&a));
  NVFP4KV_CUDA_CHECK(cudaEventCreate(&b));
  launch();
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    NVFP4KV_CUDA_CHECK(cudaEventRecord(a, stream));
    launch();
    NVFP4KV_CUDA_CHECK(cudaEventRecord(b, stream));
    NVFP4KV_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    NVFP4KV_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace nvfp4kv::harness
