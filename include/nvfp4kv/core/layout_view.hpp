#pragma once
// The one place where a logical cache coordinate becomes a byte offset. Host
// code (validator, CLI, reference store, tests) and device code (store, gather,
// attention) all call LayoutView::offset; nothing else computes cache offsets.
#include "nvfp4kv/core/config.hpp"

namespace nvfp4kv {

// The four regions of a paged NVFP4 KV cache, in the order collisions are reported.
enum class Region : uint8_t { kKData = 0, kKScale = 1, kVData = 2, kVScale = 3 };
inline constexpr int kRegionCount = 4;

NVFP4KV_HD bool is_scale(Region r) { return r == Region::kKScale || r == Region::kVScale; }

// How (token, group) are placed inside one (layer, page, head) scale plane.
enum class ScalePermutation : uint8_t {
  kLinear,      // token * token_stride + group * column_stride
  kInterleave4  // TensorRT-LLM / FlashInfer trtllm-gen: (N/4, sd, 4) order; N % 4 == 0, sd % 4 == 0
};

struct CacheDims {
  int64_t layers = 1;
  int64_t pages = 0;
  int64_t tokens_per_page = 0;  // N
  int64_t heads = 0;            // kv heads held by this layout (per tensor-parallel rank)
  int64_t head_dim = 0;         // D, a multiple of 16
  NVFP4KV_HD int64_t data_bytes() const { return head_dim / 2; }    // dd: bytes per data row
  NVFP4KV_HD int64_t scale_bytes() const { return head_dim / 16; }  // sd: bytes per scale row
  NVFP4KV_HD int64_t columns(Region r) const { return is_scale(r) ? scale_bytes() : data_bytes(); }
};

// One region as an affine map with strides in bytes. column is the byte j of a
// data row (elements 2j, 2j+1) or the group g of a scale row.
struct RegionMap {
  int32_t buffer = 0;
  int64_t offset = 0;
  int64_t layer = 0, page = 0, token = 0, head = 0, column = 1;
  ScalePermutation permutation = ScalePermutation::kLinear;
};

struct Coord {
  int64_t layer = 0, page = 0, token = 0, head = 0, column = 0;
};

// Int is int64_t everywhere except in the validator, which evaluates the same
// map in 128 bits to prove that no offset overflows before anything uses int64_t.
template <typename Int>
NVFP4KV_HD Int region_offset_as(const RegionMap& m, int64_t scale_bytes, const Coord& c) {
  const Int outer = Int(m.offset) + Int(c.layer) * m.layer + Int(c.page) * m.page + Int(c.head) * m.head;
  if (m.permutation == ScalePermutation::kInterleave4) {
    const int64_t q = scale_bytes / 4;  // groups per 4-byte column of the interleave
    const int64_t pos = ((c.token / 4) * 4 + c.column / q) * scale_bytes + (c.column % q) * 4 + c.token % 4;
    return outer + Int(pos) * m.column;
  }
  return outer + Int(c.token) * m.token + Int(c.column) * m.column;
}

NVFP4KV_HD int64_t region_offset(const RegionMap& m, int64_t scale_bytes, const Coord& c) {
  return region_offset_as<int64_t>(m, scale_bytes, c);
}

class ValidLayout;

// Trivially copyable, so kernels take it by value in a __grid_constant__ params
// struct. Only ValidLayout::view() makes one: a kernel never sees an unchecked
// layout and never takes loose strides.
class LayoutView {
 public:
  NVFP4KV_HD const CacheDims& dims() const { return dims_; }
  NVFP4KV_HD const RegionMap& region(Region r) const { return regions_[int(r)]; }
  NVFP4KV_HD int64_t offset(Region r, const Coord& c) const {
    return region_offset(regions_[int(r)], dims_.scale_bytes(), c);
  }
  // Bytes between heads: offset(r, c) for head h is offset(r, c) for head 0 plus
  // h * head_step(r). The head enters region_offset_as only through its outer,
  // linear term, for every permutation (tests/cpu/test_layout_presets.cpp checks
  // the identity on every preset). Kernels walking a token's heads use it.
  NVFP4KV_HD int64_t head_step(Region r) const { return regions_[int(r)].head; }
  // Widest power-of-two access (bytes, <= 16) that every row start of a region
  // allows; from the validator's alignment report.
  NVFP4KV_HD int vector_bytes(Region r) const { return vector_bytes_[int(r)]; }

 private:
  friend class ValidLayout;
  LayoutView() = default;
  CacheDims dims_;
  RegionMap regions_[kRegionCount];
  int vector_bytes_[kRegionCount] = {1, 1, 1, 1};
};

}  // namespace nvfp4kv
