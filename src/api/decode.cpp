// Host API of decode attention: core's argument rules, the GPU's own, the
// geometry from the shape, then one launch (a split call merges inside it).
#include "nvfp4kv/api/decode.hpp"

#include "../kernels/decode/params.hpp"
#include "../kernels/common/arch.hpp"
#include "launch_checks.hpp"
#include "attention_runs.hpp"

namespace nvfp4kv {
namespace {

// Checks and the geometry: what plan_decode and decode_attention share (and the
// short-query route, with p.max_q_len set).
Result prepare(const ValidLayout& layout, const DecodeArgs& a, kernels::DecodeParams& p,
               const char* who = "decode_attention") {
  const CacheDims& d = layout.layout().dims;
  if (a.q_type != ElementType::kBFloat16 && a.q_type != ElementType::kFloat16)
    return api::invalid(who, std::string("the query must be bf16 or fp16, got ") + element_type_name(a.q_type));
  if (d.tokens_per_page > INT32_MAX) return {Status::kUnsupported, "decode_attention: more than 2^31 - 1 tokens per page"};
  if (std::string why = kernels::device_arch_problem(); !why.empty())  // cached per device
    return {Status::kUnsupported, std::string(who) + ": " + why};
  // FP8 beside NVFP4: the kernel has instances for an NVFP4 side in the fp16-split code
  // order only (the native layouts').
  if (d.fp8(Side::kK) != d.fp8(Side::kV) && !layout.view().codes().is_fp16_split())
    return {Status::kUnsupported, std::string(who) + ": layout " + quote_text(layout.layout().name) + " holds " +
                                      (d.fp8(Side::kK) ? "K as fp8_e4m3 and V" : "V as fp8_e4m3 and K") +
                                      " as nvfp4 in the standard code order; decode reads NVFP4 beside FP8 in the "
                                      "fp16-split order only (the native layout's)"};
  p.args = a;
  // (The layer's view comes from the same format, so the second term only makes sure that no
  // instance without the steps ever reads a layer that has them.) A layout that holds FP8
  // runs the instances with the steps (their only ones: an FP8 side is rare enough not to
  // double its instances for the few percent the steps cost where blocks are short).
  p.format_steps = layout.format().transforms() || p.format.transformed() || d.fp8(Side::kK) || d.fp8(Side::kV);
  std::string unsupported;
  if (Result r = api::from_cuda(kernels::plan_decode_geometry(p, &unsupported), who); !r.ok()) return r;
  if (!unsupported.empty()) return {Status::kUnsupported, std::string(who) + ": " + unsupported};
  return {};
}

}  // namespace

namespace {

Result plan_rows(const ValidLayout& layout, int64_t batch, int64_t q_heads, int64_t block_table_stride,
                 int64_t max_q_len, const char* who, DecodePlan* plan) {
  DecodeArgs a;
  a.q_heads = q_heads;
  a.batch.batch = batch;
  a.batch.block_table_stride = block_table_stride;
  if (Result r = api::q_heads_checks(layout, q_heads, who); !r.ok()) return r;
  if (batch < 0 || batch > 65535 || block_table_stride < 1)
    return api::invalid(who, "batch must be in [0, 65535] and the block-table stride >= 1");
  kernels::DecodeParams p{.layout = layout.view(), .cache = {}, .args = {}, .geometry = {}};
  p.max_q_len = max_q_len;
  if (Result r = prepare(layout, a, p, who); !r.ok()) return r;
  *plan = {.splits = p.geometry.splits, .entries_per_split = p.geometry.entries_per_split,
           .workspace_bytes = p.geometry.workspace_bytes, .dense_planes = p.geometry.dense, .tensor_rows = p.geometry.tensor_rows};
  return {};
}

}  // namespace

Result plan_decode(const ValidLayout& layout, int64_t batch, int64_t q_heads, int64_t block_table_stride,
                   DecodePlan* plan) {
  return plan_rows(layout, batch, q_heads, block_table_stride, 1, "plan_decode", plan);
}

namespace api {

Result plan_short_query(const ValidLayout& layout, int64_t batch, int64_t q_heads, int64_t block_table_stride,
                        int64_t max_q_len, DecodePlan* plan) {
  return plan_rows(layout, batch, q_heads, block_table_stride, max_q_len, "mixed_attention (short-query route)", plan);
}

// What a split launch needs of its workspace.
Result workspace_checks(const kernels::DecodeParams& p, const void* workspace, size_t bytes, const char* who,
                        const char* sizer) {
  if (p.geometry.workspace_bytes == 0) return {};
  if (!workspace || bytes < p.geometry.workspace_bytes)
    return invalid(who, "this shape splits each sequence over " + std::to_string(p.geometry.splits) +
                            " blocks and needs a workspace of " + std::to_string(p.geometry.workspace_bytes) + " bytes (" +
                            sizer + "), got " + std::to_string(bytes));
  if (!aligned(workspace, 256)) return invalid(who, "the workspace must be 256-byte aligned");
  return {};
}

Result prepare_decode(const ValidLayout& layout, const CacheBuffers& buffers, const DecodeArgs& a,
                      kernels::DecodeParams* out, const char* who) {
  if (std::string p = decode_problem(layout, buffers, a); !p.empty()) return invalid(who, p);
  if (Result r = gpu_cache_checks(layout, buffers, who); !r.ok()) return r;
  kernels::LayerFormatView format;
  if (Result r = layer_format_view(layout, a.layer, a.k_mean, a.k_channel_scale, who, ScaleRule::kStandard, &format); !r.ok())
    return r;
  if (Result r = code_order_checks(layout, who); !r.ok()) return r;
  *out = kernels::DecodeParams{.layout = layout.view(), .cache = buffers, .args = a, .geometry = {}, .format = format};
  if (a.batch.batch == 0) return {};
  if (!a.out) return invalid(who, "the output (batch, q_heads, D) is required");
  if (!aligned(a.q, 16) || !aligned(a.out, 16)) return invalid(who, "query and output must be 16-byte aligned");
  if (a.q_token_stride % 8 != 0)
    return invalid(who, "q_token_stride must be a multiple of 8 elements, got " + std::to_string(a.q_token_stride));
  if (Result r = prepare(layout, a, *out, who); !r.ok()) return r;
  return workspace_checks(*out, a.workspace, a.workspace_bytes, who, "plan_decode");
}

Result prepare_short_query(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& a,
                           void* workspace, size_t workspace_bytes, kernels::DecodeParams* out, const char* who) {
  // mixed_attention checked the batch's arguments (prefill_problem, formats, code order);
  // what the route adds: the GPU's checks, the query and output, the plan and its workspace.
  if (Result r = gpu_cache_checks(layout, buffers, who); !r.ok()) return r;
  if (a.q_type != ElementType::kBFloat16 && a.q_type != ElementType::kFloat16)
    return invalid(who, std::string("the query must be bf16 or fp16, got ") + element_type_name(a.q_type));
  DecodeArgs d = decode_args_of(a);
  d.workspace = workspace;
  d.workspace_bytes = workspace_bytes;
  kernels::LayerFormatView format;
  if (Result r = layer_format_view(layout, a.layer, a.k_mean, a.k_channel_scale, who, ScaleRule::kStandard, &format); !r.ok())
    return r;
  *out = kernels::DecodeParams{.layout = layout.view(), .cache = buffers, .args = d, .geometry = {}, .format = format};
  out->cu_q = a.cu_seqlens_q;
  out->max_q_len = a.max_q_len;
  if (a.batch.batch == 0) return {};
  if (!a.out || !aligned(a.out, 16)) return invalid(who, "the output must be given and 16-byte aligned");
  if (!aligned(a.q, 2)) return invalid(who, "the query must be 2-byte aligned");
  if (Result r = prepare(layout, d, *out, who); !r.ok()) return r;
  return workspace_checks(*out, workspace, workspace_bytes, who, "mixed_workspace_bytes");
}

}  // namespace api

Result decode_attention(const ValidLayout& layout, const CacheBuffers& buffers, const DecodeArgs& a,
                        cudaStream_t stream) {
  kernels::DecodeParams p{.layout = layout.view(), .cache = buffers, .args = {}, .geometry = {}};
  if (Result r = api::prepare_decode(layout, buffers, a, &p); !r.ok()) return r;
  return api::from_cuda(kernels::launch_decode(p, stream), "decode_attention");
}

}  // namespace nvfp4kv
