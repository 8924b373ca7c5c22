#pragma once
// Exhaustive byte-ownership map of a small layout: the oracle the validator is
// tested (and fuzzed) against. Walks every element of every layer and page.
#include <vector>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::testing {

struct BruteForce {
  bool out_of_bounds = false;
  bool overlap = false;
  int64_t elements = 0;
};

inline BruteForce brute_force(const Layout& l, int64_t max_elements = int64_t(1) << 24) {
  BruteForce r;
  const CacheDims& d = l.dims;
  std::vector<std::vector<uint8_t>> owned;
  for (const Buffer& b : l.buffers) owned.emplace_back(size_t(b.per_layer ? b.bytes * d.layers : b.bytes), 0);
  for (Region reg : kAllRegions) {
    const RegionMap& m = l.region(reg);
    const Buffer& b = l.buffers[size_t(m.buffer)];
    for (Coord c; c.layer < d.layers; ++c.layer)
      for (c.page = 0; c.page < d.pages; ++c.page)
        for (c.head = 0; c.head < d.heads; ++c.head)
          for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
            for (c.column = 0; c.column < d.columns(reg); ++c.column) {
              if (++r.elements > max_elements) return r;
              const int64_t off = l.offset(reg, c);
              if (off < 0 || off >= b.bytes) {
                r.out_of_bounds = true;
                continue;
              }
              // per-layer buffers: each layer is its own allocation
              const int64_t slot = b.per_layer ? c.layer * b.bytes + off : off;
              uint8_t& o = owned[size_t(m.buffer)][size_t(slot)];
              if (o) r.overlap = true;
              o = 1;
            }
  }
  return r;
}

}  // namespace nvfp4kv::testing
