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

// The kernels read and write plain NVFP4 only so far: a layer whose format holds FP8, a
// rotation or K smoothing is refused (never read as if it were plain), and the store
// kernel takes one scale rule for K and V. On success *rule (store only) is the rule the
// kernel must use: the format's, or the call's where the layout has no format.
inline Result format_checks(const ValidLayout& layout, int64_t layer, const char* who, ScaleRule* rule = nullptr) {
  const CacheDims& d = layout.layout().dims;
  for (Side s : {Side::kK, Side::kV})
    if (d.fp8(s))
      return {Status::kUnsupported, std::string(who) + ": layout " + quote_text(layout.layout().name) + " holds " +
                                        (s == Side::kK ? "K" : "V") +
                                        " as fp8_e4m3; the GPU kernels read and write NVFP4 pages only so far (the "
                                        "CPU reference implements FP8 pages)"};
  const CacheFormat& f = layout.format();
  if (f.implicit()) return {};
  const auto unsupported = [&](const std::string& why) {
    return Result{Status::kUnsupported, std::string(who) + ": layer " + std::to_string(layer) + " of the layout's format " +
                                            why + "; the GPU kernels implement plain NVFP4 only so far (the CPU "
                                            "reference implements every format)"};
  };
  if (f.has_k_mean()) return unsupported("smooths K (format.k_mean)");
  const LayerFormat l = f.layer(layer);
  for (Side s : {Side::kK, Side::kV}) {
    const char* name = s == Side::kK ? "K" : "V";
    if (l.side(s).element != ElementFormat::kNvfp4)
      return unsupported(std::string("stores ") + name + " as " + element_format_name(l.side(s).element));
    if (l.side(s).rotation != kNoRotation) return unsupported(std::string("rotates ") + name);
  }
  if (rule) {
    if (l.k.rule != l.v.rule)
      return unsupported(std::string("uses scale rule ") + scale_rule_name(l.k.rule) + " for K and " +
                         scale_rule_name(l.v.rule) + " for V (the store kernel takes one rule)");
    *rule = l.k.rule;
  }
  return {};
}

// Decode attention places E2M1 codes by their bits, with a placement for the standard
// order and one for fp16-split (the native layout's; kernels/decode/kernel.cuh): another
// order is refused. Store, gather and prefill move each data word's bits to or from the
// standard order and take any.
inline Result code_order_checks(const ValidLayout& layout, const char* who) {
  const CodeOrder& codes = layout.layout().codes;
  if (codes.is_standard() || codes.is_fp16_split()) return {};
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
