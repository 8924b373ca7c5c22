// The decode planner: stage shape, stages in flight and the split of each block
// table, from the shape and what the kernel side reports (core/decode_plan.hpp).
#include "nvfp4kv/core/decode_plan.hpp"

#include <algorithm>

namespace nvfp4kv {

std::string plan_decode_geometry(const LayoutView& layout, const DecodeArgs& args, const DecodeDeviceFacts& device,
                                 const DecodeKernelFacts& kernel, DecodeGeometry* out, int64_t max_q_len) {
  using namespace decode_limits;
  const CacheDims& d = layout.dims();
  DecodeGeometry g;
  if (attention_instance_dim(d.head_dim) == 0)
    return "decode attention supports head dims up to " + std::to_string(kMaxAttentionHeadDim) + ", got " +
           std::to_string(d.head_dim);
  if (d.tokens_per_page > kMaxStageTokens)
    return "decode attention supports up to " + std::to_string(kMaxStageTokens) + " tokens per page, got " +
           std::to_string(d.tokens_per_page);
  g.head_dim = attention_instance_dim(d.head_dim);
  g.group = int(args.q_heads / d.heads);
  if (!short_query_fits(max_q_len, g.group))
    return "the short-query route takes max q length x group <= " + std::to_string(kShortQueryRows) +
           " rows per kv head, got " + std::to_string(max_q_len) + " x " + std::to_string(g.group);
  g.queries = int(max_q_len);
  g.rows = g.queries * g.group;
  // Dense planes: every region's (page, head) tile one contiguous, 16-byte aligned
  // plane whose size is a multiple of 16, data rows 16-byte aligned inside it.
  // An FP8 side's scale region holds nothing and takes no part (d.holds).
  g.dense = d.head_dim == g.head_dim;
  for (int ri = 0; ri < kRegionCount; ++ri) {
    const Region r = Region(ri);
    if (!d.holds(r)) continue;
    const RegionAccess& acc = layout.access(r);
    g.dense = g.dense && acc.dense_plane && acc.plane_align >= 16 && (d.tokens_per_page * d.columns(r)) % 16 == 0;
    if (!is_scale(r)) g.dense = g.dense && acc.vector_bytes >= 16;
  }
  // Row mode by tensor copies: the copy engine takes a (page, head) tile of region
  // r as a box of N rows of the instance's row bytes (its rules: the box's row a
  // multiple of 16 bytes, strides multiples of 16, the base 16-byte aligned, which
  // the API asks of every buffer). So: token and column modes plain, columns
  // contiguous, and the head either a stride the copy engine takes or the next
  // columns of the same row (then the box starts at head x columns and reads the
  // next head's bytes, or zeros past the row's end, into columns never used).
  // The copy engine reads from 16-byte-aligned addresses only (run 41: a box that started
  // on head x 8 bytes of a shared scale row stopped the kernel with an illegal
  // instruction), so where heads share a row a box starts at the 16 bytes holding the
  // head's first column and the consumers read the head's columns at
  // tensor_row_shift. An instance wider than the layout's D (a padded head) is left to
  // the row copies: there a shared row's next head would land in the padded columns.
  g.tensor_rows = !g.dense && d.head_dim == g.head_dim;
  for (int ri = 0; ri < kRegionCount; ++ri) {
    const Region r = Region(ri);
    if (!d.holds(r)) continue;
    const RegionMap& m = layout.region(r);
    const int64_t cols = d.columns(r);
    g.tensor_rows = g.tensor_rows && m.token.is_plain() && m.column.is_plain() && (cols == 1 || m.column.stride == 1) &&
                    m.offset % 16 == 0 && tensor_stride_ok(m.token.stride, d.tokens_per_page) &&
                    tensor_stride_ok(m.page, d.pages) && tensor_stride_ok(m.layer, d.layers) &&
                    (!tensor_rows_flat(m.head, d.heads) || m.head == cols) && m.token.stride < (int64_t(1) << 40) &&
                    m.page < (int64_t(1) << 40) && m.head < (int64_t(1) << 40);
  }
  // The page slot: the four canonical planes in region order (K data, K scales, V data,
  // V scales), each row as the side's element format has it at the instance's D (an FP8
  // row D bytes, an NVFP4 one D / 2 and D / 16 of scales; an FP8 side has no scale
  // plane), scale planes padded to 16 bytes (a tensor copy's rows are at least 16 bytes,
  // and its planes start on 128 bytes).
  const int n = int(d.tokens_per_page);
  const int align = g.tensor_rows ? 128 : 16;
  const auto up = [align](int bytes) { return (bytes + align - 1) / align * align; };
  // A row's columns as the layout's dims count them, at the instance's head dim.
  CacheDims instance = d;
  instance.head_dim = g.head_dim;
  int at = 0;
  for (int ri = 0; ri < kRegionCount; ++ri) {
    const int row = int(instance.columns(Region(ri)));
    g.row_pitch[ri] = g.tensor_rows && row > 0 ? tensor_row_pitch(row) : row;
    g.plane_offset[ri] = at;
    at += up(n * g.row_pitch[ri]);
  }
  g.slot_bytes = at;
  // One span per (page, head): every region on the same page and head strides, at
  // its plane's offset from K's data.
  g.span = g.dense;
  for (int ri = 0; ri < kRegionCount; ++ri) {
    if (!d.holds(Region(ri))) continue;
    const RegionMap& m = layout.region(Region(ri)), &k = layout.region(Region::kKData);
    g.span = g.span && m.buffer == k.buffer && m.layer == k.layer && m.page == k.page && m.head == k.head &&
             m.offset - k.offset == g.plane_offset[ri];
  }
  // A stage is two tiles per consumer warp up to D 128 (the per-stage wait and
  // bookkeeping spread over more tokens: run 31, -4 % at 16 x 32K and 128 x 32K
  // against one tile), one at D 256; at most 64 pages (one token per page makes
  // 64-token stages).
  const int stage_target = kTile * kConsumerWarps * (g.head_dim <= 128 ? 2 : 1);
  g.pages_per_stage = int(std::clamp<int64_t>(stage_target / d.tokens_per_page, 1, kMaxStagePages));
  // Shared memory holds the page ids of one split: size it for the largest split possible.
  const int64_t stride = args.batch.block_table_stride;
  g.entries_per_split =
      std::min<int64_t>(kMaxSplitEntries, (stride + g.pages_per_stage - 1) / g.pages_per_stage * g.pages_per_stage);
  // As many stages in flight as fit beside the instance's other blocks on an SM
  // (each block's shared memory also costs 1 KB of the SM's), at least two.
  const int budget = std::min(device.max_smem_per_block,
                              device.smem_per_sm / decode_blocks_per_sm(g.head_dim, decode_instance_rows(g)) - 1024);
  g.stages = 2;
  for (DecodeGeometry more = g; more.stages < kMaxStages; g.stages = more.stages) {
    ++more.stages;
    if (kernel.smem_bytes(more) > budget) break;
  }
  g.smem_bytes = kernel.smem_bytes(g);
  if (g.smem_bytes > device.max_smem_per_block)
    return "decode attention needs " + std::to_string(g.smem_bytes) + " bytes of shared memory at " +
           std::to_string(d.tokens_per_page) + " tokens per page and head dim " + std::to_string(d.head_dim) +
           "; this GPU offers " + std::to_string(device.max_smem_per_block);

  // Split each sequence's block table so that batch x kv heads x splits blocks fill
  // the GPU in few waves: the cost model is waves x entries per block (the lengths
  // are not known here, the stride bounds them).
  const int per_sm = kernel.blocks_per_sm(g);
  if (per_sm < 0) return "blocks_per_sm failed";
  const int64_t slots = int64_t(device.sms) * std::max(per_sm, 1);
  const int64_t blocks = args.batch.batch * d.heads;
  const int64_t stage_entries = (stride + g.pages_per_stage - 1) / g.pages_per_stage;
  // Cost in stage times: each block pays about kFill stages to start its pipeline
  // and finish (tables, query, first loads, combine), a split call about one more
  // for the merge (the split that finishes last merges its group's heads).
  constexpr double kFill = 4.0, kMerge = 1.0;
  const int64_t min_splits = (stride + kMaxSplitEntries - 1) / kMaxSplitEntries;
  int64_t best_splits = 0;
  double best = 1e300;
  for (int64_t sp = 1; sp <= std::min<int64_t>(stage_entries, kMaxSplits); ++sp) {
    const int64_t per = (stage_entries + sp - 1) / sp;  // stages per block
    const int64_t used = (stage_entries + per - 1) / per;
    if (used != sp || sp < min_splits || per * g.pages_per_stage > kMaxSplitEntries) continue;
    const int64_t waves = (blocks * sp + slots - 1) / slots;
    const double cost = double(waves) * (double(per) + kFill) + (sp > 1 ? kMerge : 0.0);
    if (cost < best - 1e-9) best = cost, best_splits = sp;
  }
  if (best_splits == 0)
    return "a block table of " + std::to_string(stride) + " entries needs more than " + std::to_string(kMaxSplits) +
           " splits of at most " + std::to_string(kMaxSplitEntries) + " entries";
  g.splits = int(best_splits);
  g.entries_per_split = ((stage_entries + best_splits - 1) / best_splits) * g.pages_per_stage;
  if (g.splits > 1)
    g.workspace_bytes =
        decode_split_workspace_bytes(args.batch.batch, g.splits, args.q_heads, d.heads, g.head_dim, nullptr, g.queries);
  *out = g;
  return "";
}

}  // namespace nvfp4kv
