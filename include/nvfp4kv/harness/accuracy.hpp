#pragma once
// What 4 bits cost in attention: decode attention (fp64) over one sequence of
// model-like keys and values stored as BF16, FP8 and NVFP4 (both scale rules),
// compared with attention over the unquantized values. The demo prints it; the
// committed table in bench/results comes from `nvfp4kv demo`.
#include <cstdint>
#include <string>
#include <vector>

namespace nvfp4kv::harness {

struct AccuracyRow {
  std::string cache;   // which K/V: "heavy tails", "heavy tails + sink tokens"
  std::string format;  // "BF16", "FP8 E4M3 per-tensor", "NVFP4 amax/6", "NVFP4 4over6"
  double rel_l2_vs_exact = 0;  // ||out - out_exact|| / ||out_exact|| over all heads
  double rel_l2_vs_bf16 = 0;   // against attention on the BF16 cache (0 for BF16 itself)
  double bytes_per_token = 0;  // K + V per token and layer, 8 kv heads x D 128
};

// tokens of one sequence, 32 query heads over 8 kv heads, head dim 128; the
// errors are pooled over 8 random query vectors (decode steps).
std::vector<AccuracyRow> attention_accuracy(int64_t tokens, uint64_t seed);

}  // namespace nvfp4kv::harness
