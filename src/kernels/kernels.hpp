#pragma once
// Launch parameters of the device kernels. Shared by the .cu files and the host
// API; plain C++ so the API can be compiled by the host compiler.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/core/cache_buffers.hpp"
#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/core/layout_view.hpp"
#include "nvfp4kv/core/packed_block.hpp"

namespace nvfp4kv::kernels {

struct StoreParams {
  LayoutView layout;
  CacheBuffers buffers;
  KvRows rows;
  const void* slots;
  bool slots_are_int64;
  int64_t layer;
  const float* k_global_scale;
  const float* v_global_scale;
  DeviceStatus* status;
};

struct GatherParams {
  LayoutView layout;
  CacheBuffers buffers;
  const int32_t* block_table;
  int64_t block_table_stride;
  const int32_t* cu_seqlens;
  int64_t batch;
  int64_t layer;
  const float* k_global_scale;
  const float* v_global_scale;
  void* k_out;
  void* v_out;
  DeviceStatus* status;
};

// Thread block of the store and gather: x = group (D / 16), y = side (K, V),
// z = tokens, as many as fit in about `threads` threads (at least one; at most
// `max_tokens`). Each thread walks the heads of its token.
inline dim3 token_block(const CacheDims& d, int64_t threads, int64_t max_tokens = 1 << 30) {
  const int64_t groups = d.scale_bytes();
  const int64_t tokens = std::min<int64_t>(max_tokens, std::max<int64_t>(1, threads / (2 * groups)));
  return dim3(unsigned(groups), 2u, unsigned(tokens));
}

// One place maps runtime types and rules to template instances.
cudaError_t launch_store(const StoreParams& p, ElementType type, ScaleRule rule, cudaStream_t stream);
cudaError_t launch_gather(const GatherParams& p, ElementType out_type, cudaStream_t stream);

}  // namespace nvfp4kv::kernels
