#pragma once
// Tracing bytes and inferring maps: where a byte sequence occurs in buffers, which
// element of a layout owns a byte, and the region map that explains where a writer
// put (or a reader took) the elements found. check-write and check-read use these.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::conformance {

struct Location {
  int32_t buffer = 0;
  int64_t byte = 0;
  friend bool operator==(const Location&, const Location&) = default;
};

// Up to 8 bytes to look for, bytes[i] at byte + i * stride.
struct Pattern {
  std::array<uint8_t, 8> bytes{};
  int length = 0;
  int64_t stride = 1;
};

// Every occurrence of each pattern (up to max_hits each), bytes compared after
// mapping both sides through `normalize` (256 entries; null: as they are). Offsets
// whose first byte `first` (256 entries) does not allow are skipped. Work: one pass
// over the buffers per distinct (length, stride).
std::vector<std::vector<Location>> find_patterns(const std::vector<std::vector<uint8_t>>& buffers,
                                                 const std::vector<Pattern>& patterns, const uint8_t* normalize = nullptr,
                                                 const bool* first = nullptr, size_t max_hits = 4);

// One element of a layout: a data byte (column j) or a scale (column g).
struct Element {
  Region region;
  Coord coord;
};

// Which element owns each byte of a layout's buffers, over every layer and page
// (per-layer buffers: the allocation of `layer`).
class ByteOwners {
 public:
  // Throws ArgumentError past 2^32 - 1 elements.
  explicit ByteOwners(const Layout& layout, int64_t layer = 0);
  std::optional<Element> owner(const Location& at) const;
  // "k_scale[layer 0, page 3, token 0, head 0, group 2]", or "no element" / "outside the buffer".
  std::string describe(const Location& at) const;
  // A run of `length` bytes `stride` apart: one row's bytes as "k_scale[layer 0, page 3,
  // token 0, head 0, groups 0..7]", anything else as its first and last byte's owners.
  std::string describe_run(const Location& at, int64_t length, int64_t stride = 1) const;
  const Layout& layout() const { return *layout_; }

 private:
  const Layout* layout_;
  int64_t width_ = 1;  // columns numbered per row: the widest region's (D / 2 for NVFP4, D for an FP8 side)
  std::vector<std::vector<uint32_t>> index_;  // per buffer byte: element number, or kNone
  static constexpr uint32_t kNone = 0xFFFFFFFFu;
  Element element(uint32_t n) const;
};

// Where one element of a region was found.
struct Observation {
  int64_t page = 0, token = 0, head = 0, column = 0;
  Location at;
};

// The region map that places the observations, in the layout model's terms
// (docs/layouts.md): affine in (layer, page, head), a mode in token and column.
struct RegionFit {
  bool fitted = false;      // some map was found (possibly explaining only some observations)
  RegionMap map;            // where a field was not observed, the prior's value
  int64_t observations = 0, explained = 0;
  std::vector<std::string> unobserved;  // fields the observations do not determine: "head stride", ...
};

// Fits region r of `prior` (the layout the engine claims) to the observations of
// layer `layer`: votes over the observations for each field (buffer, column mode,
// token mode, head and page strides, offset), then counts what the map explains.
RegionFit fit_region(const std::vector<Observation>& observations, const Layout& prior, Region r, int64_t layer);

// The mode (smallest inner extent, plain first) with y = c + mode(x) at every
// point, for an unknown constant c; nullopt when none fits or the points do not
// determine one. x in [0, extent).
std::optional<Mode> fit_mode(const std::vector<std::pair<int64_t, int64_t>>& points, int64_t extent);

}  // namespace nvfp4kv::conformance
