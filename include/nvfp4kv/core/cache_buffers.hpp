#pragma once
// Base pointers of a cache's buffers for one layer, indexed like Layout::buffers.
// For a per-layer buffer pass that layer's allocation; for a buffer that holds
// all layers pass the allocation itself (the layer stride does the rest).
#include "nvfp4kv/core/layout_view.hpp"

namespace nvfp4kv {

inline constexpr int kMaxBuffers = 8;

struct CacheBuffers {
  uint8_t* ptr[kMaxBuffers] = {};
  int count = 0;
};

// The byte of region r at coordinate c: the one place that pairs a region's
// buffer with its offset. L is a Layout (host) or a LayoutView (device).
template <class L>
NVFP4KV_HD uint8_t* element_address(const L& layout, const CacheBuffers& buffers, Region r, const Coord& c) {
  return buffers.ptr[layout.region(r).buffer] + layout.offset(r, c);
}

}  // namespace nvfp4kv
