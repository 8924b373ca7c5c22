// A picture of one page: each character stands for a run of bytes and shows
// which region owns them, so interleaving and overlap are visible at a glance.
#include <algorithm>
#include <iomanip>
#include <sstream>
#include <tuple>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {

namespace {
constexpr char kGlyph[kRegionCount] = {'K', 'k', 'V', 'v'};
constexpr uint8_t kNone = 0, kClash = 255;
constexpr int kWidth = 64;
}  // namespace

std::string byte_map(const Layout& layout, int64_t layer, int64_t page, int max_lines) {
  require_evaluable(layout);
  const CacheDims& d = layout.dims;
  for (auto [v, extent, what] : {std::tuple{layer, d.layers, "layer"}, {page, d.pages, "page"}})
    if (v < 0 || v >= extent)
      throw LayoutError(std::string(what) + " " + std::to_string(v) + " is outside the cache's [0, " + std::to_string(extent) + ")");
  // One page, every region: the elements drawn (no overflow: the whole cache is within 2^62).
  const int64_t drawn = d.heads * d.tokens_per_page * d.row_bytes();
  if (drawn > kMaxEnumerated)
    throw LayoutError("the byte map of one page draws heads " + std::to_string(d.heads) + " x tokens per page " +
                      std::to_string(d.tokens_per_page) + " x " + std::to_string(d.row_bytes()) +
                      " elements = " + std::to_string(drawn) + ", more than " + std::to_string(kMaxEnumerated) +
                      " (2^23), the bound on any enumeration; draw fewer heads or tokens per page");
  std::ostringstream out;
  out << "page " << page << " of layer " << layer << ": K = k_data, k = k_scale, V = v_data, v = v_scale, "
      << ". = not this page's, ! = owned twice, + = several owners in one character\n";
  for (int32_t buf = 0; buf < int32_t(layout.buffers.size()); ++buf) {
    const Buffer& b = layout.buffers[size_t(buf)];
    int64_t lo = INT64_MAX, hi = -1;
    for (Region r : kAllRegions) {
      if (layout.region(r).buffer != buf) continue;
      for (Coord c{b.per_layer ? 0 : layer, page, 0, 0, 0}; c.head < d.heads; ++c.head)
        for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
          for (c.column = 0; c.column < d.columns(r); ++c.column) {
            const int64_t o = layout.offset(r, c);
            lo = std::min(lo, o);
            hi = std::max(hi, o);
          }
    }
    if (hi < 0) continue;
    const int64_t shown = std::min<int64_t>(hi - lo + 1, int64_t(1) << 22);
    std::vector<uint8_t> owner(size_t(shown), kNone);
    for (Region r : kAllRegions) {
      if (layout.region(r).buffer != buf) continue;
      for (Coord c{b.per_layer ? 0 : layer, page, 0, 0, 0}; c.head < d.heads; ++c.head)
        for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
          for (c.column = 0; c.column < d.columns(r); ++c.column) {
            const int64_t o = layout.offset(r, c) - lo;
            if (o >= shown) continue;
            uint8_t& w = owner[size_t(o)];
            w = (w == kNone) ? uint8_t(int(r) + 1) : kClash;
          }
    }
    int64_t per_char = 1;
    while ((shown + per_char * kWidth - 1) / (per_char * kWidth) > max_lines) per_char *= 2;
    out << "buffer " << quote_text(b.name) << ", bytes " << lo << ".." << hi << (shown < hi - lo + 1 ? " (first 4 MiB shown)" : "")
        << ", one character = " << per_char << (per_char == 1 ? " byte" : " bytes") << "\n";
    for (int64_t line = 0; line * per_char * kWidth < shown; ++line) {
      out << "  " << std::setw(10) << lo + line * per_char * kWidth << " ";
      for (int col = 0; col < kWidth; ++col) {
        const int64_t start = (line * kWidth + col) * per_char;
        if (start >= shown) break;
        uint8_t first = owner[size_t(start)];
        bool mixed = false, clash = false;
        for (int64_t i = start; i < std::min(shown, start + per_char); ++i) {
          clash |= owner[size_t(i)] == kClash;
          mixed |= owner[size_t(i)] != first;
        }
        out << (clash ? '!' : mixed ? '+' : first == kNone ? '.' : kGlyph[first - 1]);
      }
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace nvfp4kv
