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
#include "../kernels/common/format_view.hpp"

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

// The layer's format as the kernels take it (kernels/common/format_view.hpp). Every family
// takes every format (store by its row kernel where a layer rotates, smooths or gives its NVFP4
// sides two rules, gather where a layer is not plain NVFP4;
// decode and prefill with rotations, K smoothing and K's channel scale folded into their query and output
// steps and FP8 sides through their dequantize parts), so nothing is refused here; what is
// checked is mu's and lambda's device copies. k_mean is the caller's device copy of
// format.k_mean, required exactly when the format smooths K; k_channel_scale the same for
// format.k_channel_scale. implicit_rule is the rule of a layout without a format
// (the store call's; readers ignore rules).
inline Result layer_format_view(const ValidLayout& layout, int64_t layer, const float* k_mean,
                                const float* k_channel_scale, const char* who, ScaleRule implicit_rule,
                                kernels::LayerFormatView* out) {
  const CacheDims& d = layout.layout().dims;
  const CacheFormat& f = layout.format();
  kernels::LayerFormatView v;
  v.k.element = d.k_element, v.v.element = d.v_element;
  // A per-channel vector of the format: the caller's device copy exactly when the format has it.
  const auto vector_check = [&](bool has, const float* copy, const std::string& field, const char* does,
                                const char* does_not) -> Result {
    if (has && !copy)
      return invalid(who, std::string("the layout's format ") + does + " (format." + field + "): pass a device copy of its " +
                              field + " (layers x kv heads x head_dim floats) as args." + field);
    if (!has && copy) return invalid(who, "args." + field + " is given but the layout's format " + does_not);
    if (copy && !aligned(copy, 4)) return invalid(who, "args." + field + " is misaligned");
    return {};
  };
  if (Result r = vector_check(f.has_k_mean(), k_mean, "k_mean", "smooths K", "smooths no K"); !r.ok()) return r;
  if (Result r = vector_check(f.has_k_channel_scale(), k_channel_scale, "k_channel_scale", "scales K's channels",
                              "scales no K channels");
      !r.ok())
    return r;
  if (f.implicit()) {
    v.k.rule = v.v.rule = implicit_rule;
  } else {
    const LayerFormat l = f.layer(layer);
    for (Side s : {Side::kK, Side::kV}) {
      kernels::SideFormatView& sv = s == Side::kK ? v.k : v.v;
      sv.rule = l.side(s).rule;
      sv.rotation = int32_t(rotation_block(l.side(s).rotation, d.head_dim));
    }
  }
  // K smoothing belongs to the whole cache: also a format without per-layer entries has it.
  if (k_mean) v.k.mean = k_mean + layer * d.heads * d.head_dim;
  if (k_channel_scale) v.k.channel_scale = k_channel_scale + layer * d.heads * d.head_dim;
  *out = v;
  return {};
}

// Decode attention places E2M1 codes by their bits, with a placement for the standard
// order and one for fp16-split (the native layout's; kernels/decode/kernel.cuh): another
// order is refused. Store, gather and prefill move each data word's bits to or from the
// standard order and take any.
inline Result code_order_checks(const ValidLayout& layout, const char* who) {
  const CodeOrder& codes = layout.layout().codes;
  const CacheDims& d = layout.layout().dims;
  if (codes.is_standard() || codes.is_fp16_split() || (d.fp8(Side::kK) && d.fp8(Side::kV))) return {};  // FP8 only: no codes
  return {Status::kUnsupported, std::string(who) + ": layout " + quote_text(layout.layout().name) +
                                    " keeps a data byte's codes in the " + code_order_text(codes) +
                                    " order; decode attention reads the standard and fp16-split orders only so far "
                                    "(store, gather, prefill and the CPU reference take any)"};
}

// q_heads over the layout's kv heads: a whole GQA group of 1 to 16 heads.
inline Result q_heads_checks(const ValidLayout& layout, int64_t q_heads, const char* who) {
  const int64_t kv_heads = layout.layout().dims.heads;
  if (q_heads < 1 || q_heads % kv_heads != 0 || q_heads / kv_heads > 16)
    return invalid(who, "q_heads must be a multiple of the " + std::to_string(kv_heads) +
                            " kv heads, at most 16 per kv head, got " + std::to_string(q_heads));
  return {};
}

inline Result from_cuda(cudaError_t e, const char* who) {
  if (e == cudaSuccess) return {};
  return {Status::kCudaError, std::string(who) + ": " + cudaGetErrorString(e)};
}

}  // namespace nvfp4kv::api
