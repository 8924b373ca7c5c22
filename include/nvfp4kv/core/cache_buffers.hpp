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

// K and V rows to store: (tokens, heads, D) elements with a free token stride.
struct KvRows {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t tokens = 0;
  int64_t token_stride = 0;  // elements between consecutive tokens (>= heads * D)
};

// What a store did; also the layout of the optional device status word array.
struct StoreCounts {
  int64_t stored = 0;        // tokens written
  int64_t padding = 0;       // slot < 0: skipped on purpose
  int64_t out_of_range = 0;  // slot >= pages * tokens_per_page: skipped, nothing written
  int64_t non_finite = 0;    // elements that were NaN or +-Inf, stored as +0
};

}  // namespace nvfp4kv
