#pragma once
// How a prefill / extend attention call runs, chosen on the host from its shape
// (never from the lengths, which live on the device), and how a mixed batch is
// routed: plain C++, tested on the CPU (tests/cpu/test_prefill_plan.cpp).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4kv/core/attention.hpp"
#include "nvfp4kv/core/decode_plan.hpp"
#include "nvfp4kv/core/layout_view.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv {

// The prefill kernel's fixed shape.
namespace prefill_limits {
constexpr int kConsumerWarps = 8;      // each consumer warp owns 16 query rows
constexpr int kProducerWarps = 8;      // two warpgroups dequantize kv tiles into the stage ring
constexpr int kWarps = kConsumerWarps + kProducerWarps;
constexpr int kRows = 16 * kConsumerWarps;  // query rows of a block: (token, head of the GQA group) pairs
constexpr int kKvTile = 64;            // kv tokens dequantized and consumed per stage
constexpr int kPad = 8;                // FP16 elements after each shared-memory row (bank spread)
constexpr int kMinStages = 1, kMaxStages = 4;  // stages in the ring: as many as fit, up to kMaxStages
}  // namespace prefill_limits

struct PrefillGeometry {
  int head_dim = 0;         // the instance's D: 64, 128 or 256 (a smaller D is zero-padded up to it)
  int group = 1;            // query heads per kv head
  int tokens_per_tile = 0;  // query tokens of one block; its rows are tokens_per_tile * group <= kRows
  int64_t q_tiles = 0;      // blocks per (sequence, kv head): enough for max_q_len, at least one
  int kv_tile = 0;          // kv tokens per stage
  int stages = 0;           // stages in the ring of dequantized kv tiles
  int smem_bytes = 0;       // dynamic shared memory of one block
};

// A block's shared memory, in the order the kernel carves it (each part a
// multiple of 16 bytes): up to 1024 bytes of alignment (the carve starts on a
// 1024-byte boundary, the swizzled tiles' atom); Q (kRows, D + kPad) FP16; per stage
// K and V (kv_tile, D + kPad) FP16 each; the rows' logit multipliers and K smoothing terms (2 kRows) float;
// 16 bytes of flags; a full and an empty barrier (8 bytes each) per stage. The
// warpgroup-MMA tiles (sm_90a, D <= 128) keep Q, K and V as 128-byte-swizzled panels
// without the padding, inside the same parts (each part a multiple of 1024 bytes).
NVFP4KV_HD constexpr size_t prefill_smem_bytes(int head_dim, int kv_tile, int stages) {
  using namespace prefill_limits;
  return 1024 + size_t(kRows) * (head_dim + kPad) * 2 + size_t(stages) * 2 * size_t(kv_tile) * (head_dim + kPad) * 2 +
         size_t(kRows) * 8 + 16 + size_t(stages) * 16;
}

// Fills *out from the layout and the call's shape (args: q_heads, max_q_len).
// Returns "" or why this shape is unsupported.
std::string plan_prefill_geometry(const LayoutView& layout, const PrefillArgs& args, int max_smem_per_block,
                                  PrefillGeometry* out);

// A mixed batch as runs of consecutive sequences of one route, each one launch:
// q length 1 to decode; q lengths 2 and up whose rows fit one decode block
// (short_query_fits: q length x group <= 16, speculative verification and the like)
// to the short-query route, the decode kernel with (token, head) rows, which reads
// each page once per kv head as decode does; the rest (q length 0 included) to
// prefill. first_row is the run's first query row (the prefix sum of q_lens).
enum class AttentionRoute { kDecode, kShortQuery, kPrefill };
const char* attention_route_name(AttentionRoute route);

struct AttentionRun {
  int64_t first = 0, count = 0;
  AttentionRoute route = AttentionRoute::kPrefill;
  int64_t first_row = 0;
  int64_t max_q_len = 0;
};

// The route of one sequence of q length q_len (>= 0) in a batch of GQA group `group`.
AttentionRoute attention_route(int64_t q_len, int64_t group);

// Runs of a batch from the host's q lengths (the scheduler's copy of
// cu_seqlens_q's differences) and the GQA group. "" or why they cannot be used
// (negative, too many rows).
std::string plan_mixed_runs(const int32_t* q_lens, int64_t batch, int64_t group, std::vector<AttentionRun>* runs);

}  // namespace nvfp4kv
