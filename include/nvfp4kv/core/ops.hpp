#pragma once
// The operations on a cache, each described once: the GPU API, its kernels and
// the CPU reference take the same argument structs (device pointers for the GPU,
// host pointers for the reference) and are checked by the same rules
// (*_problem below). Built by field name, never by position.
#include <string>

#include "nvfp4kv/core/batch.hpp"
#include "nvfp4kv/core/cache_buffers.hpp"
#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/core/status.hpp"

namespace nvfp4kv {

class ValidLayout;

// K and V rows: (tokens, heads, D) elements with a free token stride (elements
// between consecutive tokens, >= heads * D).
struct KvRows {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t tokens = 0;
  int64_t token_stride = 0;
  NVFP4KV_HD const void* side(Side s) const { return s == Side::kK ? k : v; }
};

// Quantize K and V rows into the cache through a slot mapping (slot = page * N + token).
struct StoreArgs {
  KvRows rows;
  ElementType type = ElementType::kBFloat16;  // bf16 or fp16 (the reference also takes fp32)
  const void* slots = nullptr;                // (tokens) int32 or int64; < 0 = padding
  bool slots_are_int64 = false;
  int64_t layer = 0;
  const float* k_global_scale = nullptr;      // dequant multipliers; device memory for the GPU (graph capture)
  const float* v_global_scale = nullptr;
  ScaleRule rule = ScaleRule::kStandard;
  DeviceStatus* status = nullptr;             // optional counters

  NVFP4KV_HD int64_t slot(int64_t i) const {
    return slots_are_int64 ? static_cast<const int64_t*>(slots)[i] : int64_t(static_cast<const int32_t*>(slots)[i]);
  }
  NVFP4KV_HD const float* global_scale(Side s) const { return s == Side::kK ? k_global_scale : v_global_scale; }
};

// Dequantize the pages of a batch to dense rows: sequence i fills rows
// [cu_seqlens[i], cu_seqlens[i+1]) of (rows, heads, D) outputs.
struct GatherArgs {
  BatchDescriptor batch;  // offsets form
  int64_t layer = 0;
  const float* k_global_scale = nullptr;
  const float* v_global_scale = nullptr;
  ElementType out_type = ElementType::kBFloat16;  // bf16 or fp16 (the reference also writes fp32)
  void* k_out = nullptr;
  void* v_out = nullptr;
  DeviceStatus* status = nullptr;

  NVFP4KV_HD const float* global_scale(Side s) const { return s == Side::kK ? k_global_scale : v_global_scale; }
  NVFP4KV_HD void* out(Side s) const { return s == Side::kK ? k_out : v_out; }
};

// Why the arguments cannot be used with this layout ("" when they can), by the
// rules the GPU and the reference share; each names the argument. The GPU API
// adds its own (alignment, supported element types).
std::string buffers_problem(const ValidLayout& layout, const CacheBuffers& buffers, int64_t layer);
std::string store_problem(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& args);
std::string gather_problem(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& args);

}  // namespace nvfp4kv
