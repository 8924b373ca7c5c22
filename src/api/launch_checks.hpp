#pragma once
// The checks every GPU launcher adds to core's argument rules, and the one
// translation of a CUDA error into a Result.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "nvfp4kv/api/result.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"
#include "../kernels/common/arch.hpp"

namespace nvfp4kv::api {

inline Result invalid(const char* who, const std::string& why) {
  return {Status::kInvalidArgument, std::string(who) + ": " + why};
}

inline bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// Buffers 16-byte aligned (the validator's vector widths assume it); head dims the kernels size for;
// a device whose kernel image is built for sm_90 or newer (kernels/common/arch.hpp).
inline Result gpu_cache_checks(const ValidLayout& layout, const CacheBuffers& buffers, const char* who) {
  if (std::string why = kernels::device_arch_problem(); !why.empty())
    return {Status::kUnsupported, std::string(who) + ": " + why};
  const Layout& l = layout.layout();
  for (int b = 0; b < buffers.count; ++b)
    if (!aligned(buffers.ptr[b], 16))
      return invalid(who, "buffer \"" + l.buffers[size_t(b)].name + "\" is not 16-byte aligned");
  if (l.dims.tokens_per_page > INT32_MAX)
    return {Status::kUnsupported, std::string(who) + ": more than 2^31 - 1 tokens per page"};
  if (l.dims.head_dim > 1024)
    return {Status::kUnsupported, std::string(who) + ": head dim " + std::to_string(l.dims.head_dim) + " is above 1024"};
  return {};
}

inline Result from_cuda(cudaError_t e, const char* who) {
  if (e == cudaSuccess) return {};
  return {Status::kCudaError, std::string(who) + ": " + cudaGetErrorString(e)};
}

}  // namespace nvfp4kv::api
