#pragma once
// How a decode-attention call runs, chosen on the host from its shape alone
// (never from the lengths, which live on the device): the same inputs give the
// same geometry, so a captured graph stays valid. Plain C++, so the choices
// (stage shape, stages in flight, the split of each block table, the split
// workspace) are tested on the CPU; the kernel side supplies only what it alone
// knows (a block's shared memory, blocks per SM) and the device's sizes.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "nvfp4kv/core/attention.hpp"
#include "nvfp4kv/core/config.hpp"
#include "nvfp4kv/core/layout_view.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv {

// The decode kernel's fixed shape, which the planner sizes stages and splits by.
namespace decode_limits {
constexpr int kTile = 16;               // tokens a consumer warp takes at a time
constexpr int kConsumerWarps = 8;       // warps that take tiles; one more warp fills the stages
constexpr int kMaxStageTokens = 256;    // tokens of one stage (and of one page)
constexpr int kMaxStagePages = 64;      // pages of one stage (its loaded-page mask is 64 bits)
constexpr int kMaxStages = 8;           // stages in flight
constexpr int kMaxSplits = 256;         // thread blocks per (sequence, kv head)
constexpr int64_t kMaxSplitEntries = 4096;  // block-table entries one block reads (page ids kept in shared memory)
}  // namespace decode_limits

// Blocks per SM the kernel's register budget aims at: two (16 consumer warps per
// SM) where the O^T accumulators are small, one at D 256 or with two n-tiles of
// query heads (groups above 8).
NVFP4KV_HD constexpr int decode_blocks_per_sm(int head_dim, int group_rows) {
  return head_dim <= 128 && group_rows <= 8 ? 2 : 1;
}

// Tensor rows: a stride the copy engine takes (a multiple of 16 bytes, or any for
// an extent of one).
NVFP4KV_HD constexpr bool tensor_stride_ok(int64_t stride, int64_t extent) {
  return extent == 1 || (stride > 0 && stride % 16 == 0);
}
// Tensor rows: whether a region's heads are not a stride of their own for the copy
// engine but the next columns of the same row (the planner then requires the head
// stride to equal the row's columns), so its box starts at head x columns.
NVFP4KV_HD constexpr bool tensor_rows_flat(int64_t head_stride, int64_t heads) {
  return !tensor_stride_ok(head_stride, heads);
}

// Tensor rows: where a region's heads share a row, the 16-byte-aligned box holding
// head h's columns starts tensor_row_shift bytes before them (the copy engine reads
// from 16-byte-aligned addresses only); a row of `columns` bytes then needs a box
// tensor_row_pitch wide, enough for every shift a head can have.
NVFP4KV_HD constexpr int tensor_row_shift(int64_t head, int64_t columns) { return int(head * columns % 16); }
NVFP4KV_HD constexpr int tensor_row_pitch(int columns) {
  const int g = columns % 16 == 0 ? 16 : columns % 8 == 0 ? 8 : columns % 4 == 0 ? 4 : columns % 2 == 0 ? 2 : 1;
  return (columns + 16 - g + 15) / 16 * 16;  // the largest shift is 16 - gcd(columns, 16)
}

struct DecodeGeometry {
  int head_dim = 0;         // the instance's D: 64, 128 or 256 (a smaller D is zero-padded up to it)
  int group = 1;            // query heads per kv head
  int queries = 1;          // query tokens per sequence at most: 1 (decode), or a short-query call's max q length
  int rows = 1;             // query rows of a block: queries x group, (token, head) pairs, token-major
  int splits = 1;           // thread blocks per (sequence, kv head)
  int64_t entries_per_split = 0;  // block-table entries each reads (a multiple of pages_per_stage)
  int pages_per_stage = 1;  // pages copied into one shared-memory stage
  int stages = 2;           // stages in flight
  bool dense = false;       // pages copied as whole planes by bulk copies (else row by row)
  bool span = false;        // dense, and a (page, head)'s four planes lie back to back as in a page slot:
                            // one contiguous copy per page
  bool tensor_rows = false;  // not dense: each region's (page, head) rows come by one tensor copy (TMA)
                            // per page instead of row copies by the producer's lanes
  int row_pitch[kRegionCount] = {};     // bytes from one token's row to the next in a region's plane
  int plane_offset[kRegionCount] = {};  // bytes of each region's plane inside a page slot
  int slot_bytes = 0;       // one page's four planes
  int smem_bytes = 0;       // dynamic shared memory of one thread block
  size_t workspace_bytes = 0;  // split partials and tickets (0 when splits == 1)
};

// The kernel instance's query rows (its MMA's N: one or two n-tiles of 8): 8 for
// groups up to 8, else 16; the short-query route always takes 16 (one instance set
// for every q length x group that fits).
NVFP4KV_HD constexpr int decode_instance_rows(const DecodeGeometry& g) {
  return g.queries == 1 && g.group <= 8 ? 8 : 16;
}

// The workspace of a split decode call (core/attention.hpp): a partial per
// (sequence, split, kv head, block row), in that order (with one query token per
// sequence the block rows are the group's heads, so this is (sequence, split, query
// head)), and a ticket per (sequence, kv head).
NVFP4KV_HD constexpr size_t decode_split_workspace_bytes(int64_t batch, int64_t splits, int64_t q_heads,
                                                         int64_t kv_heads, int head_dim, size_t* tickets_at = nullptr,
                                                         int64_t queries = 1) {
  return attention_split_workspace_bytes(batch * q_heads * queries, splits, batch * kv_heads, head_dim, tickets_at);
}

struct DecodeDeviceFacts {
  int sms = 0;
  int max_smem_per_block = 0;  // opt-in limit of one block
  int smem_per_sm = 0;
};

// What only the kernel side knows: a block's dynamic shared memory at a geometry,
// and how many such blocks fit on one SM (< 0: the query failed; planning stops).
struct DecodeKernelFacts {
  std::function<int(const DecodeGeometry&)> smem_bytes;
  std::function<int(const DecodeGeometry&)> blocks_per_sm;
};

// The short-query route of a mixed batch (speculative verification, a few new
// tokens per sequence): the decode kernel with a block's rows taken as (query
// token, head) pairs, as long as max q length x group fits one block's 16 rows.
constexpr int kShortQueryRows = 16;
NVFP4KV_HD constexpr bool short_query_fits(int64_t q_len, int64_t group) {
  return q_len >= 1 && group >= 1 && q_len * group <= kShortQueryRows;
}

// Fills *out from the layout and the call's shape (args: q_heads, batch.batch,
// batch.block_table_stride; max_q_len > 1 for the short-query route, whose rows
// must fit: short_query_fits). Returns "" or why this shape is unsupported; a
// failed blocks_per_sm query returns "blocks_per_sm failed".
std::string plan_decode_geometry(const LayoutView& layout, const DecodeArgs& args, const DecodeDeviceFacts& device,
                                 const DecodeKernelFacts& kernel, DecodeGeometry* out, int64_t max_q_len = 1);

}  // namespace nvfp4kv
