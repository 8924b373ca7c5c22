#include "nvfp4kv/core/layout.hpp"

#include <sstream>

namespace nvfp4kv {

const char* region_name(Region r) {
  switch (r) {
    case Region::kKData: return "k_data";
    case Region::kKScale: return "k_scale";
    case Region::kVData: return "v_data";
    default: return "v_scale";
  }
}

std::optional<Region> region_from_name(std::string_view name) {
  for (Region r : kAllRegions)
    if (name == region_name(r)) return r;
  return std::nullopt;
}

const char* permutation_name(ScalePermutation p) {
  return p == ScalePermutation::kInterleave4 ? "interleave4" : "linear";
}

int64_t Layout::total_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : buffers) total += b.bytes * (b.per_layer ? dims.layers : 1);
  return total;
}

std::string describe_element(Region r, const Coord& c) {
  std::ostringstream s;
  s << region_name(r) << "[layer " << c.layer << ", page " << c.page << ", token " << c.token << ", head "
    << c.head << (is_scale(r) ? ", group " : ", byte ") << c.column << "]";
  return s.str();
}

std::string Collision::message() const {
  return describe_element(a, coord_a) + " and " + describe_element(b, coord_b) + " share byte " +
         std::to_string(byte) + " of buffer \"" + buffer + "\"";
}

std::string CheckReport::summary() const {
  std::ostringstream s;
  if (ok) {
    s << "sound: " << elements << " elements over all layers and pages are in bounds and own distinct bytes"
      << " (proved from " << elements_enumerated << " enumerated elements in " << seconds * 1e3 << " ms)";
  } else {
    s << "REJECTED: " << (problems.empty() ? std::string("unknown") : problems.front());
    for (size_t i = 1; i < problems.size(); ++i) s << "\n  also: " << problems[i];
  }
  return s.str();
}

LayoutView ValidLayout::view() const {
  LayoutView v;
  v.dims_ = layout_.dims;
  for (Region r : kAllRegions) {
    v.regions_[int(r)] = layout_.region(r);
    v.vector_bytes_[int(r)] = report_.alignment[size_t(r)].vector_bytes;
  }
  return v;
}

ValidLayout validate(const Layout& layout) {
  CheckResult result = check(layout);
  if (!result.valid) throw LayoutError("layout \"" + layout.name + "\" " + result.report.summary());
  return std::move(*result.valid);
}

}  // namespace nvfp4kv
