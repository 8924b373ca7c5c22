#pragma once
// What the CPU and GPU paths of the round trip share (internal to the harness).
#include <algorithm>
#include <vector>

#include "nvfp4kv/harness/roundtrip.hpp"
#include "nvfp4kv/harness/workload.hpp"

namespace nvfp4kv::harness {

inline constexpr uint8_t kRoundtripPoison = 0xA5;

struct RoundtripWorkload {
  Rows rows;
  std::vector<int64_t> slots;
  std::vector<int32_t> block_table;  // the used pages in slot order: one sequence, for gather
  float k_gs = 1, v_gs = 1;
  reference::QuantizedTensor qk, qv;  // dense quantization of the rows
  std::vector<float> dk, dv;          // and its dequantization: what a gather must return
};

// The row of the one-sequence gather (the block table in order) that holds
// stored row i, or -1 for a row that was skipped.
inline int64_t gathered_row(const RoundtripWorkload& w, const CacheDims& d, int64_t i) {
  const int64_t slot = w.slots[size_t(i)];
  if (slot < 0 || slot >= d.pages * d.tokens_per_page) return -1;
  const auto page = std::find(w.block_table.begin(), w.block_table.end(), int32_t(slot / d.tokens_per_page));
  return int64_t(page - w.block_table.begin()) * d.tokens_per_page + slot % d.tokens_per_page;
}

// The GPU path; without CUDA it reports that it did not run.
RoundtripPath gpu_roundtrip(const ValidLayout& layout, const RoundtripWorkload& w);

}  // namespace nvfp4kv::harness
