#pragma once
// Host API for the store and gather kernels: a validated layout, the cache's
// buffers, the operation's arguments (core/ops.hpp: the same structs the CPU
// reference takes) and a stream in; a Result out. No framework headers.
#include <cuda_runtime_api.h>

#include <string>

#include "nvfp4kv/api/result.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv {

// Quantize K and V rows into the cache: one launch, no host synchronisation,
// graph-capturable. Device pointers; rows 16-byte aligned, bf16 or fp16.
Result store(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& args, cudaStream_t stream);

// Dequantize the pages of a batch to dense BF16/FP16 rows; one launch.
Result gather(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& args, cudaStream_t stream);

// Whether a CUDA device that runs the kernels is here; `why` says why not.
bool cuda_device_available(std::string* why = nullptr);

}  // namespace nvfp4kv
