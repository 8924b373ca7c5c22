#pragma once
// Host API for the CUDA kernels: raw device pointers, a stream and a validated
// layout in; a Result out. Every argument is checked before anything is
// launched; a failed check launches nothing. No framework headers.
#include <cuda_runtime_api.h>

#include <string>

#include "nvfp4kv/core/cache_buffers.hpp"
#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {

enum class Status { kOk, kInvalidArgument, kUnsupported, kCudaError };

struct Result {
  Status status = Status::kOk;
  std::string message;
  bool ok() const { return status == Status::kOk; }
};

// Device counters a store or gather adds to (optional; zero it before the call).
struct DeviceStatus {
  unsigned long long stored = 0;
  unsigned long long padding = 0;
  unsigned long long out_of_range = 0;  // slots >= capacity: skipped, nothing written
  unsigned long long non_finite = 0;    // NaN / Inf inputs stored as +0
  unsigned long long bad_pages = 0;     // gather: tokens of block-table entries outside [0, pages); rows filled with NaN
  unsigned long long bad_global_scale = 0;  // store: rows not written because the K or V global scale
                                            // was not finite and > 0 with a finite reciprocal
};

struct StoreArgs {
  KvRows rows;                          // device pointers, (tokens, heads, D), 16-byte aligned rows
  ElementType type = ElementType::kBFloat16;  // kBFloat16 or kFloat16
  const void* slots = nullptr;          // device, (tokens) int32 or int64; < 0 = padding
  bool slots_are_int64 = false;
  int64_t layer = 0;
  const float* k_global_scale = nullptr;  // device: read in the kernel, so the call is graph-capturable
  const float* v_global_scale = nullptr;
  ScaleRule rule = ScaleRule::kStandard;
  DeviceStatus* status = nullptr;       // device, optional
};

// Quantize K and V rows into the cache: one launch, no host synchronisation.
Result store(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& args, cudaStream_t stream);

struct GatherArgs {
  const int32_t* block_table = nullptr;  // device, (batch, block_table_stride) page ids
  int64_t block_table_stride = 0;        // entries per sequence (max pages per sequence)
  const int32_t* cu_seqlens = nullptr;   // device, (batch + 1) token offsets into the output
  int64_t batch = 0;
  int64_t layer = 0;
  const float* k_global_scale = nullptr;  // device
  const float* v_global_scale = nullptr;
  ElementType out_type = ElementType::kBFloat16;
  void* k_out = nullptr;  // device, (cu_seqlens[batch], heads, D), 16-byte aligned
  void* v_out = nullptr;
  DeviceStatus* status = nullptr;  // device, optional
};

// Dequantize the pages of a block table to dense BF16/FP16 rows.
Result gather(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& args, cudaStream_t stream);

// Whether a CUDA device can run the kernels here; `why` says why not.
bool cuda_device_available(std::string* why = nullptr);

}  // namespace nvfp4kv
