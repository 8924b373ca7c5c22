#include "nvfp4kv/core/layout_diff.hpp"

#include <algorithm>
#include <sstream>
#include <vector>

namespace nvfp4kv {
namespace {

const std::string& buffer_of(const Layout& l, Region r) { return l.buffers.at(size_t(l.region(r).buffer)).name; }

int64_t extent(const CacheDims& d, Region r, bool token) { return token ? d.tokens_per_page : d.columns(r); }

// Whether two modes place every coordinate in [0, n) alike.
bool same_on(const Mode& a, const Mode& b, int64_t n) {
  if (a == b) return true;
  for (int64_t x = 0; x < n; ++x)
    if (a(x) != b(x)) return false;
  return true;
}

std::string mode_value(const CacheDims& d, const Mode& m, Region r) {
  if (m.is_plain()) return stride_text(d, m.stride, r);
  return mode_text(m);
}

}  // namespace

std::string stride_text(const CacheDims& d, int64_t stride, std::optional<Region> r) {
  const int64_t H = d.heads, N = d.tokens_per_page, dd = d.data_bytes(), sd = d.scale_bytes(), F = dd + sd;
  // The products engines' index arithmetic is made of; a data region's strides are
  // spelled in dd and F, a scale region's in sd and F.
  struct Form {
    const char* name;
    int64_t value;
    bool data, scale;
  };
  const Form forms[] = {
      {"dd", dd, true, false},          {"sd", sd, false, true},          {"F", F, true, true},
      {"4*sd", 4 * sd, false, true},    {"H*dd", H * dd, true, false},    {"H*sd", H * sd, false, true},
      {"H*F", H * F, true, true},       {"2*H*dd", 2 * H * dd, true, false}, {"2*H*sd", 2 * H * sd, false, true},
      {"2*H*F", 2 * H * F, true, true}, {"4*H*sd", 4 * H * sd, false, true}, {"N*dd", N * dd, true, false},
      {"N*sd", N * sd, false, true},    {"N*F", N * F, true, true},       {"2*N*F", 2 * N * F, true, true},
      {"H*N*dd", H * N * dd, true, false}, {"H*N*sd", H * N * sd, false, true}, {"H*N*F", H * N * F, true, true},
      {"2*H*N*F", 2 * H * N * F, true, true}};
  // An FP8 side's data rows are D bytes: its strides are spelled in D.
  const int64_t D = d.head_dim;
  const Form fp8_forms[] = {{"D", D, true, false},         {"2*D", 2 * D, true, false},   {"H*D", H * D, true, false},
                            {"2*H*D", 2 * H * D, true, false}, {"N*D", N * D, true, false}, {"H*N*D", H * N * D, true, false}};
  const bool fp8_data = r && !is_scale(*r) && d.fp8(side_of(*r));
  std::string found;
  for (const Form& f : fp8_data ? std::vector<Form>(std::begin(fp8_forms), std::end(fp8_forms))
                                : std::vector<Form>(std::begin(forms), std::end(forms))) {
    if (f.value != stride || (r && !(is_scale(*r) ? f.scale : f.data))) continue;
    if (!found.empty()) return std::to_string(stride);  // two spellings at these sizes: say neither
    found = f.name;
  }
  if (found.empty() || stride <= 1) return std::to_string(stride);
  return std::to_string(stride) + " (" + found + ")";
}

std::string scale_pattern(const Layout& l, Region r) {
  if (!is_scale(r)) return "";
  const RegionMap& m = l.region(r);
  const int64_t sd = l.dims.scale_bytes();
  if (m.token.inner != 4 || m.token.inner_stride != 1 || m.token.stride != 4 * sd) return "";
  const int64_t N = l.dims.tokens_per_page;
  if (same_on(m.column, Mode(4), sd))
    return "the 4-token interleave of each (page, head) plane, (t/4)*4*sd + 4g + t%4 (TensorRT-LLM's; FlashInfer's and "
           "vLLM's swizzle places the same bytes when sd % 4 == 0)";
  if (sd >= 4 && same_on(m.column, Mode(sd / 4, 4, sd), sd))
    return "FlashInfer's and vLLM's 4-token swizzle of each (page, head) plane, ((t/4)*4 + g/(sd/4))*sd + (g%(sd/4))*4 + t%4";
  (void)N;
  return "";
}

std::string MapDifference::text(std::string_view b_says) const {
  std::ostringstream s;
  s << region_name(region) << " " << field << " is " << a;
  if (starts_at) s << " (where " << b_says << " starts " << region_name(*starts_at) << ")";
  s << ", " << b_says << " says " << b;
  if (!note.empty()) s << ": " << note;
  return s.str();
}

std::vector<MapDifference> map_differences(const Layout& a, const Layout& b) {
  std::vector<MapDifference> out;
  const CacheDims& d = a.dims;
  for (Region r : kAllRegions) {
    if (!d.holds(r) || !b.dims.holds(r)) continue;
    const RegionMap &ma = a.region(r), &mb = b.region(r);
    const auto add = [&](const char* field, std::string va, std::string vb, std::string note = "") {
      out.push_back({r, field, std::move(va), std::move(vb), std::move(note), std::nullopt});
    };
    if (buffer_of(a, r) != buffer_of(b, r))
      add("buffer", "\"" + buffer_of(a, r) + "\"", "\"" + buffer_of(b, r) + "\"");
    if (ma.offset != mb.offset) {
      add("offset", stride_text(d, ma.offset), stride_text(d, mb.offset));
      for (Region o : kAllRegions)  // starts where the other layout puts a different region
        if (o != r && b.dims.holds(o) && b.region(o).offset == ma.offset && buffer_of(b, o) == buffer_of(a, r))
          out.back().starts_at = o;
    }
    const bool shared = !a.buffers.at(size_t(ma.buffer)).per_layer || !b.buffers.at(size_t(mb.buffer)).per_layer;
    if (d.layers > 1 && shared && ma.layer != mb.layer)
      add("layer stride", std::to_string(ma.layer), std::to_string(mb.layer));
    if (d.pages > 1 && ma.page != mb.page) add("page stride", stride_text(d, ma.page, r), stride_text(d, mb.page, r));
    const auto head = [&] {
      if (d.heads > 1 && ma.head != mb.head) add("head stride", stride_text(d, ma.head, r), stride_text(d, mb.head, r));
    };
    bool noted = false;  // the pattern is named once, on the first line it explains
    for (bool token : {true, false}) {
      if (!token) head();  // in the order token, head, column
      const Mode &x = token ? ma.token : ma.column, &y = token ? mb.token : mb.column;
      if (same_on(x, y, extent(d, r, token))) continue;
      const bool plain = x.is_plain() && y.is_plain();
      std::string note;
      if (is_scale(r) && !noted) {
        noted = true;
        const std::string pa = scale_pattern(a, r), pb = scale_pattern(b, r);
        const std::string side = (r == Region::kKScale ? "K" : "V");
        if (!pa.empty() && pb.empty()) note = side + " scales are in " + pa;
        else if (pa.empty() && !pb.empty()) note = side + " scales are linear, not in " + pb;
      }
      add(token ? (plain ? "token stride" : "token") : (plain ? "column stride" : "column"), mode_value(d, x, r),
          mode_value(d, y, r), note);
    }
  }
  return out;
}

std::vector<Misplacement> spread_examples(const Layout& w, const Layout& rd, int n) {
  const CacheDims& d = w.dims;
  constexpr int64_t kBudget = int64_t(1) << 16;
  // Per region: rows (head, token) where it differs, each with its first few differing
  // columns, from the (layer, page) cells in turn until n elements are in hand. Offsets
  // are affine in (layer, page) with one stride per region, so if a region differs
  // anywhere it differs at (0, 0), (0, 1) or (1, 0): those cells come first.
  std::vector<std::vector<std::vector<Misplacement>>> rows(kRegionCount);
  for (Region r : kAllRegions) {
    if (!d.holds(r)) continue;
    // One buffer name in both, and the same kind of allocation (per layer or all layers) or layer 0,
    // where the two kinds coincide: otherwise every element is elsewhere.
    const bool same_buffer = buffer_of(w, r) == buffer_of(rd, r);
    const bool same_kind = w.buffers[size_t(w.region(r).buffer)].per_layer == rd.buffers[size_t(rd.region(r).buffer)].per_layer;
    int64_t budget = kBudget, found = 0;
    const auto visit = [&](int64_t layer, int64_t page) {
      // Every row of the cell (to spread over them), up to n columns of each.
      for (Coord c{layer, page, 0, 0, 0}; c.head < d.heads && budget > 0; ++c.head)
        for (c.token = 0; c.token < d.tokens_per_page && budget > 0; ++c.token) {
          std::vector<Misplacement> row;
          for (c.column = 0; c.column < d.columns(r) && budget-- > 0 && int64_t(row.size()) < n; ++c.column) {
            const int64_t wb = w.offset(r, c), rb = rd.offset(r, c);
            if (wb == rb && same_buffer && (same_kind || c.layer == 0)) continue;
            row.push_back({r, c, buffer_of(w, r), buffer_of(rd, r), wb, rb});
            ++found;
          }
          if (!row.empty()) rows[size_t(r)].push_back(std::move(row));
        }
    };
    const auto first = [](int64_t l, int64_t p) { return (l == 0 && p <= 1) || (l == 1 && p == 0); };
    for (auto [l, p] : {std::pair<int64_t, int64_t>{0, 0}, {0, 1}, {1, 0}})
      if (l < d.layers && p < d.pages && found < n) visit(l, p);
    for (int64_t l = 0; l < d.layers && budget > 0 && found < n; ++l)
      for (int64_t p = 0; p < d.pages && budget > 0 && found < n; ++p)
        if (!first(l, p)) visit(l, p);
  }
  // Share n over the regions that differ, in turn; within one, over its rows evenly and,
  // when it has fewer rows than its share, further columns of them.
  std::vector<int64_t> have(kRegionCount, 0), take(kRegionCount, 0);
  for (int r = 0; r < kRegionCount; ++r)
    for (const auto& row : rows[size_t(r)]) have[size_t(r)] += int64_t(row.size());
  for (int given = 0, progress = 1; given < n && progress;) {
    progress = 0;
    for (int r = 0; r < kRegionCount && given < n; ++r)
      if (take[size_t(r)] < have[size_t(r)]) ++take[size_t(r)], ++given, progress = 1;
  }
  std::vector<Misplacement> out;
  for (int r = 0; r < kRegionCount; ++r) {
    const auto& list = rows[size_t(r)];
    const int64_t k = take[size_t(r)], m = int64_t(list.size());
    if (k <= m) {
      for (int64_t i = 0; i < k; ++i) out.push_back(list[size_t(i * m / k)].front());
      continue;
    }
    for (size_t col = 0, left = size_t(k); left > 0; ++col)
      for (const auto& row : list)
        if (col < row.size() && left > 0) out.push_back(row[col]), --left;
  }
  return out;
}

}  // namespace nvfp4kv
