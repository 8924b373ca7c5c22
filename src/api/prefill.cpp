// Host API of prefill attention and of the mixed-batch call: core's argument
// rules, the GPU's own, the geometry from the shape, then the launches.
#include "nvfp4kv/api/prefill.hpp"

#include <algorithm>
#include <vector>

#include "../kernels/common/arch.hpp"
#include "../kernels/prefill/params.hpp"
#include "launch_checks.hpp"
#include "nvfp4kv/api/decode.hpp"
#include "nvfp4kv/core/prefill_plan.hpp"
#include "attention_runs.hpp"

namespace nvfp4kv {

namespace api {

Result prepare_prefill(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& a,
                       kernels::PrefillParams* out, const char* who) {
  if (std::string p = prefill_problem(layout, buffers, a); !p.empty()) return invalid(who, p);
  if (Result r = gpu_cache_checks(layout, buffers, who); !r.ok()) return r;
  kernels::LayerFormatView format;
  if (Result r = layer_format_view(layout, a.layer, a.k_mean, a.k_channel_scale, who, ScaleRule::kStandard, &format);
      !r.ok())
    return r;
  if (a.q_type != ElementType::kBFloat16 && a.q_type != ElementType::kFloat16)
    return invalid(who, std::string("the query must be bf16 or fp16, got ") + element_type_name(a.q_type));
  *out = kernels::PrefillParams{.layout = layout.view(), .cache = buffers, .args = a, .geometry = {}, .format = format};
  if (a.batch.batch == 0) return {};
  if (!a.out) return invalid(who, "the output (rows, q_heads, D) is required");
  if (!aligned(a.q, 2)) return invalid(who, "the query must be 2-byte aligned");
  if (!aligned(a.out, 16)) return invalid(who, "the output must be 16-byte aligned");
  if (layout.layout().dims.heads > 65535) return {Status::kUnsupported, std::string(who) + ": more than 65535 kv heads"};
  std::string unsupported;
  if (Result r = from_cuda(kernels::plan_prefill_geometry(*out, &unsupported), who); !r.ok()) return r;
  if (!unsupported.empty()) return {Status::kUnsupported, std::string(who) + ": " + unsupported};
  return {};
}

}  // namespace api

Result prefill_attention(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& a,
                         cudaStream_t stream) {
  kernels::PrefillParams p{.layout = layout.view(), .cache = buffers, .args = a, .geometry = {}};
  if (Result r = api::prepare_prefill(layout, buffers, a, &p); !r.ok()) return r;
  if (a.batch.batch == 0) return {};
  return api::from_cuda(kernels::launch_prefill(p, stream), "prefill_attention");
}

namespace {

// Decode's arguments for a run of q length 1 sequences: their rows are
// consecutive from the run's first row, so q, out and lse are read in place.
DecodeArgs decode_run(const ValidLayout& layout, const MixedBatch& m, const AttentionRun& run) {
  const PrefillArgs& a = m.args;
  const int64_t dim = layout.layout().dims.head_dim;
  const int64_t stride = a.q_token_stride ? a.q_token_stride : a.q_heads * dim;
  DecodeArgs d = decode_args_of(a);
  d.q = static_cast<const uint16_t*>(a.q) + run.first_row * stride;
  d.q_token_stride = stride;
  d.batch.block_table = a.batch.block_table + run.first * a.batch.block_table_stride;
  if (a.batch.seq_lens) d.batch.seq_lens = a.batch.seq_lens + run.first;
  if (a.batch.cu_seqlens) d.batch.cu_seqlens = a.batch.cu_seqlens + run.first;
  d.batch.batch = run.count;
  d.out = static_cast<uint16_t*>(a.out) + run.first_row * a.q_heads * dim;
  d.lse = a.lse ? a.lse + run.first_row * a.q_heads : nullptr;
  d.workspace = m.workspace;
  d.workspace_bytes = m.workspace_bytes;
  return d;
}

// Prefill's (and the short-query route's) arguments for a run: the sequences'
// cu_seqlens_q entries hold absolute rows, so q, out and lse stay as they are.
PrefillArgs prefill_run(const MixedBatch& m, const AttentionRun& run) {
  PrefillArgs p = m.args;
  p.cu_seqlens_q = m.args.cu_seqlens_q + run.first;
  p.max_q_len = run.max_q_len;
  p.batch.block_table = m.args.batch.block_table + run.first * m.args.batch.block_table_stride;
  if (p.batch.seq_lens) p.batch.seq_lens += run.first;
  if (p.batch.cu_seqlens) p.batch.cu_seqlens += run.first;
  p.batch.batch = run.count;
  return p;
}

}  // namespace

namespace {

// The split workspace of one decode or short-query run (0 for prefill runs), rounded up to
// the 256 bytes the next run's region must start on.
Result run_workspace_bytes(const ValidLayout& layout, const AttentionRun& run, int64_t q_heads, int64_t block_table_stride,
                           size_t* bytes) {
  DecodePlan plan;
  *bytes = 0;
  if (run.route == AttentionRoute::kDecode) {
    if (Result r = plan_decode(layout, run.count, q_heads, block_table_stride, &plan); !r.ok()) return r;
  } else if (run.route == AttentionRoute::kShortQuery) {
    if (Result r = api::plan_short_query(layout, run.count, q_heads, block_table_stride, run.max_q_len, &plan); !r.ok())
      return r;
  } else {
    return {};
  }
  *bytes = (plan.workspace_bytes + 255) / 256 * 256;
  return {};
}

}  // namespace

Result mixed_workspace_bytes(const ValidLayout& layout, const int32_t* q_lens, int64_t batch, int64_t q_heads,
                             int64_t block_table_stride, size_t* bytes) {
  const char* who = "mixed_workspace_bytes";
  if (Result r = api::q_heads_checks(layout, q_heads, who); !r.ok()) return r;
  std::vector<AttentionRun> runs;
  if (std::string p = plan_mixed_runs(q_lens, batch, q_heads / layout.layout().dims.heads, &runs); !p.empty())
    return api::invalid(who, p);
  // Every split run its own region, in run order: one run's partials never land on
  // another's tickets, so each ticket stays tagged from call to call (a clobbered one
  // costs its next call the compare-and-swap path).
  *bytes = 0;
  for (const AttentionRun& run : runs) {
    size_t run_bytes = 0;
    if (Result r = run_workspace_bytes(layout, run, q_heads, block_table_stride, &run_bytes); !r.ok()) return r;
    *bytes += run_bytes;
  }
  return {};
}

Result mixed_attention(const ValidLayout& layout, const CacheBuffers& buffers, const MixedBatch& m, cudaStream_t stream) {
  const char* who = "mixed_attention";
  // The GQA group routes the runs; an unusable q_heads is reported by prefill_problem below.
  const int64_t kv_heads = layout.layout().dims.heads, q_heads = m.args.q_heads;
  const int64_t group = q_heads >= kv_heads && q_heads % kv_heads == 0 && q_heads / kv_heads <= 16 ? q_heads / kv_heads : 1;
  std::vector<AttentionRun> runs;
  if (std::string p = plan_mixed_runs(m.q_lens, m.args.batch.batch, group, &runs); !p.empty()) return api::invalid(who, p);
  PrefillArgs whole = m.args;
  whole.max_q_len = 0;
  for (const AttentionRun& run : runs) whole.max_q_len = std::max(whole.max_q_len, run.max_q_len);
  // Every argument checked once for the whole batch before any launch.
  if (std::string p = prefill_problem(layout, buffers, whole); !p.empty()) return api::invalid(who, p);
  // The format checked once for the whole batch (each run's own preparation builds its view).
  [[maybe_unused]] kernels::LayerFormatView format;
  if (Result r = api::layer_format_view(layout, whole.layer, whole.k_mean, whole.k_channel_scale, who,
                                        ScaleRule::kStandard, &format);
      !r.ok())
    return r;
  // Decode and short-query runs go to the decode kernel, which reads the standard and fp16-split orders.
  if (std::any_of(runs.begin(), runs.end(), [](const AttentionRun& run) { return run.route != AttentionRoute::kPrefill; }))
    if (Result r = api::code_order_checks(layout, who); !r.ok()) return r;
  // Every run prepared (its own checks and plan) before the first launches: a call
  // refused for any run writes nothing.
  struct Prepared {
    AttentionRoute route;
    kernels::DecodeParams decode;
    kernels::PrefillParams prefill;
  };
  std::vector<Prepared> prepared;
  prepared.reserve(runs.size());
  size_t workspace_at = 0;  // each split run's region of the workspace, in run order (mixed_workspace_bytes)
  for (const AttentionRun& run : runs) {
    size_t run_bytes = 0;
    if (Result r = run_workspace_bytes(layout, run, q_heads, m.args.batch.block_table_stride, &run_bytes); !r.ok())
      return r;
    MixedBatch own = m;
    own.workspace = m.workspace && workspace_at < m.workspace_bytes ? static_cast<char*>(m.workspace) + workspace_at : nullptr;
    own.workspace_bytes = workspace_at < m.workspace_bytes ? m.workspace_bytes - workspace_at : 0;
    workspace_at += run_bytes;
    Prepared& p = prepared.emplace_back(Prepared{
        run.route, kernels::DecodeParams{.layout = layout.view(), .cache = buffers, .args = {}, .geometry = {}},
        kernels::PrefillParams{.layout = layout.view(), .cache = buffers, .args = {}, .geometry = {}}});
    Result r;
    switch (run.route) {
      case AttentionRoute::kDecode: r = api::prepare_decode(layout, buffers, decode_run(layout, own, run), &p.decode, who); break;
      case AttentionRoute::kShortQuery:
        r = api::prepare_short_query(layout, buffers, prefill_run(own, run), own.workspace, own.workspace_bytes, &p.decode,
                                     who);
        break;
      case AttentionRoute::kPrefill: r = api::prepare_prefill(layout, buffers, prefill_run(m, run), &p.prefill, who); break;
    }
    if (!r.ok()) return r;
  }
  for (const Prepared& p : prepared) {
    const cudaError_t e = p.route == AttentionRoute::kPrefill
                              ? (p.prefill.args.batch.batch == 0 ? cudaSuccess : kernels::launch_prefill(p.prefill, stream))
                              : kernels::launch_decode(p.decode, stream);
    if (Result r = api::from_cuda(e, who); !r.ok()) return r;
  }
  return {};
}

}  // namespace nvfp4kv
