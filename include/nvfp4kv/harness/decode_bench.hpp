#pragma once
// Timing of decode attention on the GPU, as `nvfp4kv bench decode` runs it: the
// cache in a page pool larger than the L2 (several rotated copies of the batch's
// pages when one is small), one CUDA graph of several calls replayed, the median
// per call, and the streaming-read ceiling measured in the same process.
#include <string>
#include <vector>

#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::harness {

struct DecodeBenchShape {
  int64_t batch = 1, context = 2048, q_heads = 32, kv_heads = 8, head_dim = 128, tokens_per_page = 16;
  std::string layout = "nvfp4kv-native";
  ElementType type = ElementType::kBFloat16;
  // The cache's transforms (transform_format in workload.hpp): "plain", or rotate-k,
  // rotate-v, smooth-k joined by '+'.
  std::string transform = "plain";
};

struct DecodeBenchResult {
  DecodeBenchShape shape;
  double ms = 0;            // per call
  double cache_bytes = 0;   // NVFP4 data + scales read per call
  double tbs = 0;           // cache_bytes / time
  int splits = 1;
  bool dense = false;
  bool tensor_rows = false;
  double checked_rel_l2 = 0;  // of a small instance of the same shape against the fp64 reference
};

// The relative L2 error decode attention's output may have against the fp64
// reference on the same dequantized cache: the worst case measured on the H200
// over the GPU test suite (bf16 1.92e-3, fp16 2.70e-4; bench/results/
// 2026-12-02-h200-decode.md) with a 30 % margin. It is the output's own rounding
// (bf16 keeps 8 bits, fp16 11) plus P in FP16; a dropped scale or a wrong layout
// gives 0.1 and more. The GPU tests and the benchmark's check use this.
inline double decode_error_bound(ElementType output) { return output == ElementType::kBFloat16 ? 2.5e-3 : 3.5e-4; }
inline constexpr double kDecodeLseBound = 5e-5;  // natural-log units; measured worst 2.9e-5
// Where the cache's format rotates K, the kernels rotate the query and round it to FP16 for
// the tensor cores (a BF16 query is exact in FP16, a rotated one is not): the logits carry
// that rounding. Measured worst 1.39e-2 (prefill, D 96, run 63, H100) on the tests' random
// caches, whose logits reach tens; a reader that skips the format is off by 0.4 and more.
inline constexpr double kRotatedQueryLseBound = 3e-2;

// n random bytes at device pointer p, none of them a NaN E4M3 code (byte & 0x77):
// a valid NVFP4 cache of any layout, made on the GPU (the prefill benchmark uses it too).
void fill_random_device_bytes(void* p, size_t n, uint64_t seed);

// The benchmarks' cache: the layout (load_spec: a preset's name or a file) at these sizes in
// one layer, with the format `transform` names (transform_format in workload.hpp).
ValidLayout bench_layout(const std::string& layout, const std::string& transform, int64_t pages,
                         int64_t tokens_per_page, int64_t kv_heads, int64_t head_dim);

// Streaming read of 2 GiB with 16-byte loads: TB/s.
double read_ceiling_tbs();

// Throws Error when the shape does not fit in memory or the check fails.
DecodeBenchResult bench_decode(const DecodeBenchShape& shape);

}  // namespace nvfp4kv::harness
