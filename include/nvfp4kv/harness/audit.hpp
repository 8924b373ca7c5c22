#pragma once
// The byte-ownership audit of a store: every byte a stored row owns (by the
// layout) must hold that row's dense reference quantization, and every byte no
// stored row owns must still hold the poison it was filled with. Used on the
// CPU reference's cache and on caches copied back from the GPU alike.
#include <array>
#include <vector>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/reference/quantize.hpp"

namespace nvfp4kv::harness {

struct RegionTally {
  int64_t bytes_ok = 0, bytes_bad = 0;
};

struct StoreAudit {
  std::array<RegionTally, kRegionCount> regions{};
  int64_t untouched_changed = 0;  // bytes no stored row owns that are not poison any more
  int64_t first_bad_byte = -1;    // of a region, for the message
  bool ok() const;
};

// k, v: the dense quantization of the stored rows (tokens = slots.size());
// cache: the layer's buffers after the store, indexed like the layout's.
StoreAudit audit_store(const ValidLayout& layout, int64_t layer, const std::vector<int64_t>& slots,
                       const reference::QuantizedTensor& k, const reference::QuantizedTensor& v,
                       const std::vector<std::vector<uint8_t>>& cache, uint8_t poison);

}  // namespace nvfp4kv::harness
