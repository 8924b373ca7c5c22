// The prefill planner and the mixed-batch routing (core/prefill_plan.hpp).
#include "nvfp4kv/core/prefill_plan.hpp"

#include <algorithm>

namespace nvfp4kv {

std::string plan_prefill_geometry(const LayoutView& layout, const PrefillArgs& args, int max_smem_per_block,
                                  PrefillGeometry* out) {
  using namespace prefill_limits;
  const CacheDims& d = layout.dims();
  if (attention_instance_dim(d.head_dim) == 0)
    return "prefill attention supports head dims up to " + std::to_string(kMaxAttentionHeadDim) + ", got " +
           std::to_string(d.head_dim);
  if (args.q_heads < d.heads || args.q_heads % d.heads != 0 || args.q_heads / d.heads > 16)
    return "q_heads must be a multiple of the " + std::to_string(d.heads) + " kv heads, at most 16 per kv head";
  PrefillGeometry g;
  g.head_dim = attention_instance_dim(d.head_dim);
  g.group = int(args.q_heads / d.heads);
  // The group's heads share every dequantized K/V element: a block's 128 rows are
  // 128 / group query tokens times the group (a group of 3 uses 126 rows).
  g.tokens_per_tile = kRows / g.group;
  g.q_tiles = std::max<int64_t>(1, (args.max_q_len + g.tokens_per_tile - 1) / g.tokens_per_tile);
  g.kv_tile = kKvTile;
  // As many stages as fit, up to kMaxStages: the producers run that far ahead of the MMAs.
  g.stages = kMaxStages;
  while (g.stages > kMinStages && prefill_smem_bytes(g.head_dim, g.kv_tile, g.stages) > size_t(max_smem_per_block))
    --g.stages;
  g.smem_bytes = int(prefill_smem_bytes(g.head_dim, g.kv_tile, g.stages));
  if (g.smem_bytes > max_smem_per_block)
    return "prefill attention needs " + std::to_string(g.smem_bytes) + " bytes of shared memory at head dim " +
           std::to_string(d.head_dim) + "; this GPU offers " + std::to_string(max_smem_per_block);
  if (g.q_tiles > INT32_MAX) return "max_q_len " + std::to_string(args.max_q_len) + " needs too many blocks";
  *out = g;
  return "";
}

const char* attention_route_name(AttentionRoute route) {
  switch (route) {
    case AttentionRoute::kDecode: return "decode";
    case AttentionRoute::kShortQuery: return "short-query";
    case AttentionRoute::kPrefill: return "prefill";
  }
  return "?";
}

AttentionRoute attention_route(int64_t q_len, int64_t group) {
  if (q_len == 1) return AttentionRoute::kDecode;
  if (q_len >= 2 && short_query_fits(q_len, group)) return AttentionRoute::kShortQuery;
  return AttentionRoute::kPrefill;
}

std::string plan_mixed_runs(const int32_t* q_lens, int64_t batch, int64_t group, std::vector<AttentionRun>* runs) {
  runs->clear();
  if (batch < 0 || batch > 65535) return "batch must be in [0, 65535], got " + std::to_string(batch);
  if (batch > 0 && !q_lens) return "the host's q lengths are required";
  if (group < 1 || group > 16) return "the GQA group must be in [1, 16], got " + std::to_string(group);
  int64_t row = 0;
  for (int64_t s = 0; s < batch; ++s) {
    if (q_lens[s] < 0) return "q length of sequence " + std::to_string(s) + " is negative: " + std::to_string(q_lens[s]);
    const AttentionRoute route = attention_route(q_lens[s], group);
    if (runs->empty() || runs->back().route != route) runs->push_back({s, 0, route, row, 0});
    AttentionRun& r = runs->back();
    ++r.count;
    r.max_q_len = std::max<int64_t>(r.max_q_len, q_lens[s]);
    row += q_lens[s];
    if (row > INT32_MAX) return "more than 2^31 - 1 query rows";
  }
  return "";
}

}  // namespace nvfp4kv
