#pragma once
// Timing of prefill / extend attention on the GPU, as `nvfp4kv bench prefill`
// runs it: `batch` sequences of `cached` tokens already in the cache plus
// `prompt` new ones (through prefill_attention, or mixed_attention's routes), the
// median of several launches, TFLOP/s counted as causal
// attention's FLOPs (4 D per attended (query head, token) pair).
#include <string>

#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv::harness {

struct PrefillBenchShape {
  int64_t batch = 1, prompt = 2048, cached = 0, q_heads = 32, kv_heads = 8, head_dim = 128, tokens_per_page = 16;
  std::string layout = "nvfp4kv-native";
  ElementType type = ElementType::kBFloat16;
  bool mixed = false;  // through mixed_attention (q length 1: decode; short q lengths: the short-query route)
  std::string transform = "plain";  // the cache's transforms (harness::transform_format)
};

struct PrefillBenchResult {
  PrefillBenchShape shape;
  double ms = 0;      // per call
  double flops = 0;   // causal: 4 D q_heads sum over queries of the tokens each attends to
  double tflops = 0;  // flops / time
};

// Throws Error when the shape does not fit in memory or a launch is refused.
PrefillBenchResult bench_prefill(const PrefillBenchShape& shape);

}  // namespace nvfp4kv::harness
