#pragma once
// The one place where a logical cache coordinate becomes a byte offset. Host
// code (validator, CLI, reference, tests) and device code (store, gather,
// attention) all ask a region map; nothing else computes cache offsets.
//
// A region is affine in (layer, page, head); inside one (layer, page, head) tile
// its (token, column) plane is a sum of two modes. A mode is CuTe's nested
// shape:stride on one coordinate: x -> (x % inner) * inner_stride + (x / inner) * stride,
// written "(inner,_):(inner_stride,stride)". A plain stride is the mode with
// inner = 1. Scale interleaves are modes, not special cases: TensorRT-LLM's
// 4-token interleave of a (page, head) plane of N x sd bytes is
//   token (4,_):(1, 4*sd), column 4              -> (t/4)*4*sd + 4g + t%4
// and FlashInfer/vLLM's spelling of it is
//   token (4,_):(1, 4*sd), column (sd/4,_):(4, sd) -> ((t/4)*4 + g/(sd/4))*sd + (g%(sd/4))*4 + t%4
// (equal when sd % 4 == 0; where not, check() proves which of them stays sound).
#include "nvfp4kv/core/config.hpp"

namespace nvfp4kv {

// The four regions of a paged NVFP4 KV cache, in the order collisions are reported.
enum class Region : uint8_t { kKData = 0, kKScale = 1, kVData = 2, kVScale = 3 };
inline constexpr int kRegionCount = 4;

NVFP4KV_HD bool is_scale(Region r) { return r == Region::kKScale || r == Region::kVScale; }

// The two sides of the cache and where each keeps its bytes: the one mapping of
// K/V to (data region, scale region) that the store, the gather, the attention
// kernels and the reference all use.
enum class Side : uint8_t { kK = 0, kV = 1 };
struct SideRegions {
  Region data, scale;
};
NVFP4KV_HD SideRegions side_regions(Side s) {
  return s == Side::kK ? SideRegions{Region::kKData, Region::kKScale} : SideRegions{Region::kVData, Region::kVScale};
}

// Where a data byte keeps its two E2M1 codes: bit[4e + c] is the byte's bit that holds
// bit c (0 the mantissa, 1 and 2 the exponent, 3 the sign) of element 2j + e. The
// standard order puts element 2j in the low nibble and 2j + 1 in the high one, each
// as s e1 e0 m; other engines or a decoder's own arrangement may differ, and a
// layout says which (docs/layouts.md, "codes"). Writers encode a standard byte into
// the layout's order; readers decode it back: the same eight bits, moved.
struct CodeOrder {
  uint8_t bit[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  NVFP4KV_HD bool is_standard() const {
    for (int i = 0; i < 8; ++i)
      if (bit[i] != i) return false;
    return true;
  }
  // The fp16-split order (element 2j: sign at bit 7, e1 e0 m at bits 3..1; element 2j + 1:
  // sign at bit 0, e1 e0 m at bits 6..4), the native layout's: the one statement of its bits.
  NVFP4KV_HD static constexpr CodeOrder fp16_split() { return CodeOrder{{1, 2, 3, 7, 4, 5, 6, 0}}; }
  NVFP4KV_HD bool is_fp16_split() const {
    const CodeOrder s = fp16_split();
    for (int i = 0; i < 8; ++i)
      if (bit[i] != s.bit[i]) return false;
    return true;
  }
  // The same moves as encode_word / decode_word for fp16-split in a closed form (four masks,
  // three shifts, three ors) instead of a loop over the eight bits (the native layout's
  // store and gather take them).
  NVFP4KV_HD static uint32_t split_from_standard(uint32_t w) {
    return ((w & 0x07070707u) << 1) | ((w & 0x08080808u) << 4) | (w & 0x70707070u) | ((w >> 7) & 0x01010101u);
  }
  NVFP4KV_HD static uint32_t standard_from_split(uint32_t w) {
    return ((w >> 1) & 0x07070707u) | ((w >> 4) & 0x08080808u) | (w & 0x70707070u) | ((w << 7) & 0x80808080u);
  }
  // Four data bytes at once (a little-endian word), each moved alike: a standard
  // word (element 2j in bits 0..3 of each byte) into this order, and back.
  NVFP4KV_HD uint32_t encode_word(uint32_t standard) const {
    if (is_fp16_split()) return split_from_standard(standard);
    uint32_t out = 0;
    for (int i = 0; i < 8; ++i) out |= ((standard >> i) & 0x01010101u) << bit[i];
    return out;
  }
  NVFP4KV_HD uint32_t decode_word(uint32_t stored) const {
    if (is_fp16_split()) return standard_from_split(stored);
    uint32_t out = 0;
    for (int i = 0; i < 8; ++i) out |= ((stored >> bit[i]) & 0x01010101u) << i;
    return out;
  }
  NVFP4KV_HD uint8_t encode(uint8_t standard) const { return uint8_t(encode_word(standard)); }
  NVFP4KV_HD uint8_t decode(uint8_t stored) const { return uint8_t(decode_word(stored)); }
  friend bool operator==(const CodeOrder& a, const CodeOrder& b) {
    for (int i = 0; i < 8; ++i)
      if (a.bit[i] != b.bit[i]) return false;
    return true;
  }
};

// What one side's data bytes hold. NVFP4: E2M1 codes two to a byte, an E4M3 scale per 16
// values in the side's scale region, times the side's global scale (4.5 bits per value).
// FP8: one E4M3 byte per value times the side's global scale, its per-tensor scale; no
// block scales, so the side's scale region holds nothing (8 bits per value).
enum class ElementFormat : uint8_t {
  kNvfp4,
  kFp8E4M3,
};

NVFP4KV_HD Side side_of(Region r) { return (r == Region::kKData || r == Region::kKScale) ? Side::kK : Side::kV; }

struct CacheDims {
  int64_t layers = 1;
  int64_t pages = 0;
  int64_t tokens_per_page = 0;  // N
  int64_t heads = 0;            // kv heads held by this layout (per tensor-parallel rank)
  int64_t head_dim = 0;         // D, a multiple of 16
  // The element format of each side's bytes: part of what a layout describes, since it sets
  // how many bytes a row has (docs/layouts.md, "elements").
  ElementFormat k_element = ElementFormat::kNvfp4, v_element = ElementFormat::kNvfp4;
  NVFP4KV_HD int64_t data_bytes() const { return head_dim / 2; }    // dd: bytes per NVFP4 data row
  NVFP4KV_HD int64_t scale_bytes() const { return head_dim / 16; }  // sd: bytes per NVFP4 scale row
  NVFP4KV_HD ElementFormat element(Side s) const { return s == Side::kK ? k_element : v_element; }
  NVFP4KV_HD bool fp8(Side s) const { return element(s) == ElementFormat::kFp8E4M3; }
  // The columns of one row of a region: an NVFP4 data row D/2 bytes, its scale row D/16
  // groups; an FP8 data row D bytes (column = element), its scale row none.
  NVFP4KV_HD int64_t columns(Region r) const {
    const bool f = fp8(side_of(r));
    return is_scale(r) ? (f ? 0 : scale_bytes()) : (f ? head_dim : data_bytes());
  }
  // Whether a region holds any element (an FP8 side's scale region holds none).
  NVFP4KV_HD bool holds(Region r) const { return columns(r) > 0; }
  // Bytes of one token and head over both sides, data and scales: 2 * (D/2 + D/16) for NVFP4.
  NVFP4KV_HD int64_t row_bytes() const {
    return columns(Region::kKData) + columns(Region::kKScale) + columns(Region::kVData) + columns(Region::kVScale);
  }
};

// One coordinate's share of an offset (see the top of this file). Once
// validated: 1 <= inner <= the coordinate's extent, strides >= 0.
struct Mode {
  int64_t inner = 1;
  int64_t inner_stride = 0;
  int64_t stride = 0;
  Mode() = default;
  // A plain stride.
  NVFP4KV_HD constexpr Mode(int64_t s) : inner(1), inner_stride(0), stride(s) {}  // NOLINT: implicit on purpose
  NVFP4KV_HD constexpr Mode(int64_t in, int64_t in_stride, int64_t out_stride)
      : inner(in), inner_stride(in_stride), stride(out_stride) {}
  NVFP4KV_HD bool is_plain() const { return inner == 1; }
  template <typename Int>
  NVFP4KV_HD Int at_as(int64_t x) const {
    if (inner == 1) return Int(x) * stride;
#if defined(__CUDA_ARCH__)
    // On the device coordinates and inner extents are below 2^31 (the validator
    // bounds inner by the coordinate's extent, the API bounds the extents): a
    // 32-bit division instead of a 64-bit subroutine.
    const uint32_t q = uint32_t(x) / uint32_t(inner), r = uint32_t(x) - q * uint32_t(inner);
    return Int(r) * inner_stride + Int(q) * stride;
#else
    return Int(x % inner) * inner_stride + Int(x / inner) * stride;
#endif
  }
  NVFP4KV_HD int64_t operator()(int64_t x) const { return at_as<int64_t>(x); }
  // The coordinate in [0, n) with the largest offset (strides >= 0): the last
  // one, or the last of the previous inner run when that reaches further.
  NVFP4KV_HD int64_t argmax(int64_t n) const {
    const int64_t last = n - 1;
    if (inner == 1 || last < inner) return last;
    const int64_t prev = (last / inner) * inner - 1;
    return at_as<int64_t>(prev) > at_as<int64_t>(last) ? prev : last;
  }
  friend bool operator==(const Mode& a, const Mode& b) {
    return a.inner == b.inner && a.inner_stride == b.inner_stride && a.stride == b.stride;
  }
};

// One region: affine in (layer, page, head), modes in (token, column). column
// is the byte j of an NVFP4 data row (elements 2j, 2j+1), the element e of an FP8
// data row, or the group g of a scale row.
struct RegionMap {
  int32_t buffer = 0;
  int64_t offset = 0;
  int64_t layer = 0, page = 0, head = 0;
  Mode token, column = Mode(1);
};

struct Coord {
  int64_t layer = 0, page = 0, token = 0, head = 0, column = 0;
};

// Int is int64_t everywhere except in the validator, which evaluates the same
// map in 128 bits to prove that no offset overflows before anything uses int64_t.
template <typename Int>
NVFP4KV_HD Int region_offset_as(const RegionMap& m, const Coord& c) {
  return Int(m.offset) + Int(c.layer) * m.layer + Int(c.page) * m.page + Int(c.head) * m.head +
         m.token.at_as<Int>(c.token) + m.column.at_as<Int>(c.column);
}

NVFP4KV_HD int64_t region_offset(const RegionMap& m, const Coord& c) { return region_offset_as<int64_t>(m, c); }

// One region of one (layer, page, head): its (token, column) plane as data a
// kernel iterates. offset(t, c) equals region_offset for that coordinate
// (tests/cpu/test_layout_presets.cpp checks it on every preset).
struct TileMap {
  int64_t base = 0;  // byte of (token 0, column 0)
  Mode token, column;
  NVFP4KV_HD int64_t offset(int64_t t, int64_t c) const { return base + token(t) + column(c); }
};

NVFP4KV_HD TileMap tile_of(const RegionMap& m, int64_t layer, int64_t page, int64_t head) {
  return {m.offset + layer * m.layer + page * m.page + head * m.head, m.token, m.column};
}

// What the validator proved about how a region may be accessed, beyond soundness.
struct RegionAccess {
  int vector_bytes = 1;  // widest power-of-two access (<= 16) every row start allows
  bool dense_plane = false;  // each (layer, page, head) tile is exactly N x columns contiguous bytes
  int plane_align = 1;   // power of two (<= 16) dividing every tile's base
  bool holds = true;     // false: the region holds nothing (an FP8 side's scales), nothing to access
};

class ValidLayout;

// Trivially copyable, so kernels take it by value in a __grid_constant__ params
// struct. Only ValidLayout::view() makes one: a kernel never sees an unchecked
// layout and never takes loose strides.
class LayoutView {
 public:
  NVFP4KV_HD const CacheDims& dims() const { return dims_; }
  NVFP4KV_HD const RegionMap& region(Region r) const { return regions_[int(r)]; }
  NVFP4KV_HD int64_t offset(Region r, const Coord& c) const { return region_offset(regions_[int(r)], c); }
  NVFP4KV_HD TileMap tile(Region r, int64_t layer, int64_t page, int64_t head) const {
    return tile_of(regions_[int(r)], layer, page, head);
  }
  // Bytes between heads: the head enters an offset only through its affine
  // term, so head h's offset is head 0's plus h * head_step(r), for any mode.
  NVFP4KV_HD int64_t head_step(Region r) const { return regions_[int(r)].head; }
  NVFP4KV_HD const RegionAccess& access(Region r) const { return access_[int(r)]; }
  NVFP4KV_HD int vector_bytes(Region r) const { return access_[int(r)].vector_bytes; }
  // Where a data byte keeps its two codes (the same for K and V).
  NVFP4KV_HD const CodeOrder& codes() const { return codes_; }

 private:
  friend class ValidLayout;
  LayoutView() = default;
  CacheDims dims_;
  RegionMap regions_[kRegionCount];
  RegionAccess access_[kRegionCount];
  CodeOrder codes_;
};

}  // namespace nvfp4kv
