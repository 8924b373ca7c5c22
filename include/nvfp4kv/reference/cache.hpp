#pragma once
// Scalar reference for the paged cache: store rows through a slot mapping and
// gather pages back, every byte placed by the validated layout. Same arguments
// (core/ops.hpp) and the same handling of bad entries as the GPU kernels, with
// host pointers; tests compare the two byte for byte and counter for counter.
#include <vector>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv::reference {

// Throws ArgumentError where the GPU API would refuse (store_problem).
void store(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& args);

// out_type may also be kFloat32 here. Throws ArgumentError as gather_problem says.
void gather(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& args);

// One (token, head) row of a side as the cache holds it, dequantized to D doubles (each
// exactly the float the stored bytes mean): NVFP4 codes times their block scale times
// the global scale, or FP8 codes times the global scale (the side's per-tensor scale),
// whichever the layout's elements say. at.column is ignored. Transforms are not undone.
void read_row(const Layout& layout, const CacheBuffers& buffers, Side side, const Coord& at, float global_scale,
              double* out);

// Host allocations for one layer of a layout, filled with `fill`.
struct HostCache {
  std::vector<std::vector<uint8_t>> storage;
  CacheBuffers buffers;
  HostCache(const Layout& layout, uint8_t fill);
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;
};

// One sequence's pages in order, gathered to fp32 (tokens, heads, D): the
// common case of the tests and the demo, through gather().
struct GatheredKv {
  std::vector<float> k, v;
};
GatheredKv gather_sequence(const ValidLayout& layout, const CacheBuffers& buffers, const std::vector<int32_t>& pages,
                           int64_t tokens, int64_t layer, float k_global_scale, float v_global_scale);

}  // namespace nvfp4kv::reference
