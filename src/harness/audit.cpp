#include "nvfp4kv/harness/audit.hpp"

namespace nvfp4kv::harness {

bool StoreAudit::ok() const {
  for (const RegionTally& t : regions)
    if (t.bytes_bad) return false;
  return untouched_changed == 0;
}

StoreAudit audit_store(const ValidLayout& valid, int64_t layer, const std::vector<int64_t>& slots,
                       const reference::QuantizedTensor& k, const reference::QuantizedTensor& v,
                       const std::vector<std::vector<uint8_t>>& cache, uint8_t poison) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  if (cache.size() != l.buffers.size()) throw ArgumentError("audit_store: one byte vector per buffer is required");
  StoreAudit a;
  std::vector<std::vector<uint8_t>> owned;
  for (const auto& b : cache) owned.emplace_back(b.size(), 0);
  for (int64_t i = 0; i < int64_t(slots.size()); ++i) {
    const int64_t slot = slots[size_t(i)];
    if (slot < 0 || slot >= d.pages * d.tokens_per_page) continue;
    for (Region r : kAllRegions) {
      const reference::QuantizedTensor& q = (r == Region::kKData || r == Region::kKScale) ? k : v;
      const std::vector<uint8_t>& want = is_scale(r) ? q.scales : q.data;
      const int32_t b = l.region(r).buffer;
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t c = 0; c < d.columns(r); ++c) {
          const int64_t off = l.offset(r, {layer, slot / d.tokens_per_page, slot % d.tokens_per_page, h, c});
          owned[size_t(b)][size_t(off)] = 1;
          // The quantized rows hold standard-order data bytes; the cache keeps the layout's order.
          const uint8_t stored = want[size_t((i * d.heads + h) * d.columns(r) + c)];
          const bool same = cache[size_t(b)][size_t(off)] == (is_scale(r) ? stored : l.codes.encode(stored));
          (same ? a.regions[size_t(r)].bytes_ok : a.regions[size_t(r)].bytes_bad)++;
          if (!same && a.first_bad_byte < 0) a.first_bad_byte = off;
        }
    }
  }
  for (size_t b = 0; b < owned.size(); ++b)
    for (size_t i = 0; i < owned[b].size(); ++i) a.untouched_changed += (!owned[b][i] && cache[b][i] != poison);
  return a;
}

}  // namespace nvfp4kv::harness
