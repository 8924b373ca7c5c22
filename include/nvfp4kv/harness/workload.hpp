#pragma once
// Inputs for tests, benchmarks and the CLI: never zeros, reproducible from a
// seed, shaped so that a byte in the wrong place shows.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4kv/core/cache_format.hpp"
#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::harness {

enum class RowPattern {
  kNormal,      // K ~ N(0, 3), V ~ N(0, 1) * lognormal: random magnitudes across blocks
  kStructured,  // group g of every row has magnitude in [0.5, 1) * (g + 1), random signs: a scale
                // read from the wrong group shows as a wrong magnitude
};

// K and V rows (tokens, heads, D) of 16-bit elements with a free token stride.
struct Rows {
  std::vector<uint16_t> k, v;
  int64_t tokens = 0, stride = 0;  // stride in elements, >= heads * D
  ElementType type = ElementType::kBFloat16;
  float k_amax = 0, v_amax = 0;
  // The rows without the stride padding: (tokens, heads, D) contiguous.
  std::vector<uint16_t> dense(bool keys, int64_t row) const;
};

// stride_pad extra elements after each row (a multiple of 8 keeps rows 16-byte aligned).
Rows make_rows(const CacheDims& d, int64_t tokens, ElementType type, RowPattern pattern, uint64_t seed,
               int64_t stride_pad = 0);

// Slots for `tokens` rows that fill whole pages in a shuffled page order, as a
// paged engine does. With edge_cases (and tokens > 3): row 1 is padding (-1),
// row 2 is one past the capacity, and the cache's last slot is stored too.
std::vector<int64_t> paged_slots(const CacheDims& d, int64_t tokens, uint64_t seed, bool edge_cases);

// The pages the valid slots touch, in first-use order: one sequence's block table.
std::vector<int32_t> pages_of(const CacheDims& d, const std::vector<int64_t>& slots);

// Values shaped like one layer of a real model's KV cache (tokens, heads, dim):
// Student-t (heavy tails) times a lognormal per-channel spread; in K, four
// outlier channels per head an order of magnitude larger; optionally the first
// `sink_tokens` tokens carry values in the tens of thousands, as attention-sink
// tokens of some models do.
std::vector<float> realistic_kv(int64_t tokens, int64_t heads, int64_t dim, bool keys, uint64_t seed,
                                int64_t sink_tokens = 0);

// One layer's buffers of a layout, every element filled through the layout
// with random NVFP4: uniform E2M1 codes, and block scales mostly spread over
// 2^-4 .. 2^4 with a few zero and subnormal ones, never NaN; an FP8 side's
// elements like those scales, with either sign. A valid cache of any size
// without running a quantizer; bytes no element owns hold `fill`.
std::vector<std::vector<uint8_t>> random_cache(const ValidLayout& layout, int64_t layer, uint64_t seed,
                                               uint8_t fill = 0);

// Writes E4M3 NaN (0x7F) into every FP8 element byte and every block-scale byte of the token
// slots of `layer` that no sequence reads: slots past a sequence's length on its last page and
// pages no table entry within a length names (sequence b reads tokens [0, lengths[b]) through
// table[b * stride ...]; negative lengths and entries outside the cache read nothing). Engines
// do not clear a page's unwritten slots, so a reader must not let them into its sums (0 x NaN
// is NaN). Returns how many (page, token) slots were poisoned, so a test can insist on some.
int64_t poison_unread_slots(const ValidLayout& layout, int64_t layer, const std::vector<int32_t>& table, int64_t stride,
                            const std::vector<int32_t>& lengths, std::vector<std::vector<uint8_t>>& bytes);

// A one-layer cache format over random stored values: K's and V's rotations (kNoRotation,
// a block size or kRotateWholeHead), with `mean` a K smoothing vector mu ~ N(0, 2) per
// (head, channel), the size of random_cache's K values, and with `channel_scale` a K channel
// scale lambda = 2^e x {1, 1.25, 1.5, 1.75}, e in [-2, 1], per (head, channel) (three significant
// bits: a BF16 query times lambda is exact in FP16). Without rotations the format
// has no per-layer entries: mu and lambda alone (they are the cache's).
CacheFormat random_format(int64_t kv_heads, int64_t head_dim, int64_t k_rotation, int64_t v_rotation, bool mean,
                          uint64_t seed, bool channel_scale = false);

// The same over a layout whose K and V hold `k` and `v` elements: the per-layer entry, where
// there is one, names them (a format agrees with its layout's elements); no format at all
// where nothing is rotated, smoothed or channel-scaled.
std::optional<CacheFormat> random_format_over(ElementFormat k, ElementFormat v, int64_t kv_heads, int64_t head_dim,
                                              int64_t k_rotation, int64_t v_rotation, bool mean, uint64_t seed,
                                              bool channel_scale = false);

// The transforms the benchmarks time beside plain NVFP4 (nvfp4kv bench decode|prefill
// --transform): "plain", or words joined by '+' from "rotate-k", "rotate-v" (a rotation of
// the whole head), "smooth-k" (mu), "scale-k" (lambda), "fp8-k" and "fp8-v" (that side's elements in FP8 E4M3,
// which the layout must then hold: bench_layout makes it so): a random_format. Throws
// ArgumentError naming the word it does not know.
CacheFormat transform_format(const std::string& transforms, int64_t kv_heads, int64_t head_dim, uint64_t seed);

}  // namespace nvfp4kv::harness
