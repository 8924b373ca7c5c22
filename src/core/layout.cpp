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

std::string mode_text(const Mode& m) {
  std::ostringstream s;
  if (m.is_plain()) s << m.stride;
  else s << "(" << m.inner << ",_):(" << m.inner_stride << "," << m.stride << ")";
  return s.str();
}

std::string provenance_text(const Provenance& p, const std::string& indent, bool full) {
  if (p.empty()) return indent + "provenance: none given\n";
  std::ostringstream s;
  if (!full) {  // two lines: who and where, then the files (each source is "path: what")
    s << indent << p.engine << ", " << p.version << "; " << p.gpu_path << (p.role.empty() ? "" : "; " + p.role) << "\n"
      << indent << "from";
    for (size_t i = 0; i < p.sources.size(); ++i)
      s << (i == 0 ? " " : ", ") << p.sources[i].substr(0, p.sources[i].find(": "));
    s << "\n";
    return s.str();
  }
  const auto rows = [&](const char* label, const std::vector<std::string>& items) {
    for (size_t i = 0; i < items.size(); ++i) s << indent << (i == 0 ? label : "            ") << items[i] << "\n";
  };
  s << indent << "engine      " << p.engine << ", " << p.version << "\n";
  s << indent << "gpu path    " << p.gpu_path << "\n";
  if (!p.role.empty()) s << indent << "role        " << p.role << "\n";
  rows("source      ", p.sources);
  rows("transcribes ", p.expressions);
  if (!p.notes.empty()) s << indent << "notes       " << p.notes << "\n";
  return s.str();
}

std::string head_dim_problem(int64_t d) {
  if (d >= 16 && d % 16 == 0) return "";
  return "head dim must be a positive multiple of 16 (one E4M3 scale per 16 values), got " + std::to_string(d);
}

std::string dims_problem(const CacheDims& d) {
  for (auto [v, what] : {std::pair{d.layers, "layers"}, {d.pages, "pages"}, {d.tokens_per_page, "tokens per page"},
                         {d.heads, "heads"}})
    if (v < 1) return std::string(what) + " must be >= 1, got " + std::to_string(v);
  return head_dim_problem(d.head_dim);
}

int64_t Layout::total_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : buffers) total += b.bytes * (b.per_layer ? dims.layers : 1);
  return total;
}

void interleave_scale_plane(Layout& l, Region r) {
  RegionMap& m = l.regions[size_t(r)];
  const int64_t sd = l.dims.scale_bytes();
  if (!is_scale(r) || !m.token.is_plain() || m.token.stride != sd || !(m.column == Mode(1)))
    throw LayoutError(std::string(region_name(r)) + ": only a linear, contiguous scale plane can be interleaved");
  m.token = Mode(4, 1, 4 * sd);
  m.column = Mode(4);
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
    v.access_[int(r)] = report_.access[size_t(r)];
  }
  return v;
}

ValidLayout validate(const Layout& layout) {
  CheckResult result = check(layout);
  if (!result.valid) throw LayoutError("layout \"" + layout.name + "\" " + result.report.summary());
  return std::move(*result.valid);
}

}  // namespace nvfp4kv
