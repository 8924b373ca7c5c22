#pragma once
// What differs between two descriptions of the same cache, said in the layouts'
// own terms: "v_scale token stride is 64, the layout says 8". compare prints it
// beside its counts; the conformance kit says it of the map it inferred from an
// engine's writes against the layout the engine claims to follow.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {

// One field of one region that places bytes differently in two layouts. Fields
// whose difference moves no byte at these sizes are not differences (a head
// stride with one head, a token mode spelled two ways that agree on [0, N)).
struct MapDifference {
  Region region;
  std::string field;  // "buffer", "offset", "layer stride", "page stride", "head stride", "token", "column"
  std::string a, b;   // each layout's value: "64 (H*dd)", "(4,_):(1,32)", "\"kv\""
  std::string note;   // what the difference is, where recognised ("V scales are in the 4-token interleave ...")
  std::optional<Region> starts_at;  // an offset: the region b starts at a's offset, if any
  // "v_scale token stride is 64 (H*dd), the layout says 144 (2*H*F)" and the note;
  // b_says names the second layout ("the layout", "the reader").
  std::string text(std::string_view b_says) const;
};

std::vector<MapDifference> map_differences(const Layout& a, const Layout& b);

// A stride as the layout sizes spell it where that is unambiguous at these sizes:
// "64 (H*dd)"; the bare number otherwise. For region r, in its own terms (dd and F
// for data, sd and F for scales).
std::string stride_text(const CacheDims& d, int64_t stride, std::optional<Region> r = std::nullopt);

// When region r's (token, column) plane is a recognised scale pattern, its name:
// "the 4-token interleave of each (page, head) plane ((t/4)*4*sd + 4g + t%4)". "" otherwise.
std::string scale_pattern(const Layout& l, Region r);

// Up to n elements the two layouts place differently, spread over the regions
// that differ (in turn) and over the rows (head, token) of each, evenly, from one
// (layer, page) where the region differs; fewer rows than a region's share give
// further columns of them. Bounded work: at most 2^16 elements examined per region.
std::vector<Misplacement> spread_examples(const Layout& writer, const Layout& reader, int n);

}  // namespace nvfp4kv
