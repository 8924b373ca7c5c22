// Writer vs reader: count, exactly and over every layer, page and head, the
// elements two layouts place at different (buffer, byte). Offsets are affine in
// (layer, page, head), so each (token, column) contributes a difference
// delta + layer * dLayer + page * dPage + head * dHead, and the (layer, page, head)
// where that vanishes are counted per distinct delta in closed form (a linear
// Diophantine equation in a box), without visiting every page or head.
#include <algorithm>
#include <array>
#include <utility>
#include <sstream>
#include <vector>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/layout_diff.hpp"

namespace nvfp4kv {
namespace {

__extension__ typedef __int128 i128;

void require_same_dims(const Layout& w, const Layout& r) {
  const CacheDims &a = w.dims, &b = r.dims;
  std::ostringstream diff;
  if (a.layers != b.layers) diff << " layers " << a.layers << " vs " << b.layers << ";";
  if (a.pages != b.pages) diff << " pages " << a.pages << " vs " << b.pages << ";";
  if (a.tokens_per_page != b.tokens_per_page) diff << " tokens per page " << a.tokens_per_page << " vs " << b.tokens_per_page << ";";
  if (a.heads != b.heads) diff << " heads " << a.heads << " vs " << b.heads << ";";
  if (a.head_dim != b.head_dim) diff << " head dim " << a.head_dim << " vs " << b.head_dim << ";";
  if (a.k_element != b.k_element)
    diff << " K elements " << element_format_name(a.k_element) << " vs " << element_format_name(b.k_element) << ";";
  if (a.v_element != b.v_element)
    diff << " V elements " << element_format_name(a.v_element) << " vs " << element_format_name(b.v_element) << ";";
  if (!diff.str().empty())
    throw LayoutError(quote_text(w.name) + " and " + quote_text(r.name) + " describe different caches:" + diff.str());
}

const std::string& buffer_name(const Layout& l, Region r) { return l.buffers.at(size_t(l.region(r).buffer)).name; }

i128 floor_div(i128 a, i128 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }  // b > 0
i128 ceil_div(i128 a, i128 b) { return -floor_div(-a, b); }                     // b > 0
i128 mod(i128 a, i128 m) { return a - floor_div(a, m) * m; }                    // m > 0, result in [0, m)
i128 gcd(i128 a, i128 b) {
  a = a < 0 ? -a : a;
  b = b < 0 ? -b : b;
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

// x in [0, m) with a * x == 1 (mod m), for gcd(a, m) == 1 (extended Euclid; |s| <= m).
i128 inverse_mod(i128 a, i128 m) {
  i128 r0 = m, r1 = mod(a, m), s0 = 0, s1 = 1;
  while (r1 != 0) {
    const i128 q = r0 / r1;
    r0 = std::exchange(r1, r0 - q * r1);
    s0 = std::exchange(s1, s0 - q * s1);
  }
  return mod(s0, m);
}

// Pairs (x, y) in [0, X) x [0, Y) with a * x + b * y == t. Coefficients within
// 2^63 and |t| within 2^64, so every product below stays inside 128 bits.
i128 count_pairs(i128 t, i128 a, i128 X, i128 b, i128 Y) {
  if (a == 0 && b == 0) return t == 0 ? X * Y : 0;
  if (a == 0) {
    std::swap(a, b);
    std::swap(X, Y);
  }
  if (b == 0) return (t % a == 0 && t / a >= 0 && t / a < X) ? Y : 0;
  const i128 g = gcd(a, b);
  if (t % g != 0) return 0;
  a /= g, b /= g, t /= g;
  // x = x0 + k*m solves a*x == t (mod b); then y = y0 - k*s.
  const i128 m = b < 0 ? -b : b;
  const i128 x0 = mod(mod(t, m) * inverse_mod(a, m), m);
  const i128 y0 = (t - a * x0) / b;
  const i128 s = b < 0 ? -a : a;
  i128 lo = ceil_div(-x0, m), hi = floor_div(X - 1 - x0, m);
  if (s > 0) {
    lo = std::max(lo, ceil_div(y0 - (Y - 1), s));
    hi = std::min(hi, floor_div(y0, s));
  } else {
    lo = std::max(lo, ceil_div(-y0, -s));
    hi = std::min(hi, floor_div(Y - 1 - y0, -s));
  }
  return hi >= lo ? hi - lo + 1 : 0;
}

// (l, p, h) in the box `extent` with l*c[0] + p*c[1] + h*c[2] == t. A dimension
// whose coefficient is 0 multiplies the count; of three moving ones the shortest
// is walked and the other two counted in closed form.
struct Box {
  i128 coef[3];
  int64_t extent[3];
};

// Steps count_in_box takes per call: 1, or the walked extent.
int64_t walk_steps(const Box& b) {
  int moving = 0;
  int64_t shortest = INT64_MAX;
  for (int i = 0; i < 3; ++i)
    if (b.coef[i] != 0 && b.extent[i] > 1) ++moving, shortest = std::min(shortest, b.extent[i]);
  return moving == 3 ? shortest : 1;
}

i128 count_in_box(i128 t, const Box& b) {
  i128 factor = 1;
  std::vector<int> moving;
  for (int i = 0; i < 3; ++i) {
    if (b.coef[i] == 0 || b.extent[i] == 1) factor *= b.extent[i];
    else moving.push_back(i);
  }
  if (moving.empty()) return t == 0 ? factor : 0;
  if (moving.size() == 1) return factor * count_pairs(t, b.coef[moving[0]], b.extent[moving[0]], 0, 1);
  if (moving.size() == 2)
    return factor * count_pairs(t, b.coef[moving[0]], b.extent[moving[0]], b.coef[moving[1]], b.extent[moving[1]]);
  const int w = int(std::min_element(b.extent, b.extent + 3) - b.extent);
  const int u = (w + 1) % 3, v = (w + 2) % 3;
  i128 n = 0;
  for (int64_t x = 0; x < b.extent[w]; ++x)
    n += count_pairs(t - b.coef[w] * x, b.coef[u], b.extent[u], b.coef[v], b.extent[v]);
  return n;
}

std::string too_large(const std::string& what, i128 steps) {
  return "compare would take " + what + " = " + std::to_string(int64_t(steps)) + " steps, more than " +
         std::to_string(kMaxEnumerated) + " (2^23), the bound on any enumeration";
}

}  // namespace

CompareReport compare(const Layout& writer, const Layout& reader, int max_examples) {
  require_evaluable(writer);
  require_evaluable(reader);
  require_same_dims(writer, reader);
  const CacheDims& d = writer.dims;
  // The work, bounded up front: each region's (token, column) plane is enumerated,
  // then each distinct difference counted.
  for (Region r : kAllRegions)
    if (d.tokens_per_page * d.columns(r) > kMaxEnumerated)
      throw LayoutError(too_large("tokens per page " + std::to_string(d.tokens_per_page) + " x " +
                                      std::to_string(d.columns(r)) + " columns of " + region_name(r),
                                  i128(d.tokens_per_page) * d.columns(r)) +
                        "; compare fewer tokens per page");
  CompareReport rep;
  for (Region r : kAllRegions) {
    if (!d.holds(r)) continue;  // an FP8 side's scale region: nothing placed by either
    const int64_t total = d.layers * d.pages * d.heads * d.tokens_per_page * d.columns(r);
    rep.elements += total;
    if (buffer_name(writer, r) != buffer_name(reader, r)) {
      rep.misplaced_per_region[size_t(r)] = total;
      continue;
    }
    const RegionMap &mw = writer.region(r), &mr = reader.region(r);
    std::vector<int64_t> deltas;  // (tokens, columns): writer byte - reader byte at layer, page, head 0
    deltas.reserve(size_t(d.tokens_per_page * d.columns(r)));
    for (Coord c; c.token < d.tokens_per_page; ++c.token)
      for (c.column = 0; c.column < d.columns(r); ++c.column) deltas.push_back(writer.offset(r, c) - reader.offset(r, c));
    std::sort(deltas.begin(), deltas.end());
    // One allocation for all layers vs one per layer: only layer 0 can land in the same place.
    const bool w_layers = !writer.buffers[size_t(mw.buffer)].per_layer;
    const bool r_layers = !reader.buffers[size_t(mr.buffer)].per_layer;
    const Box box{{i128(mw.layer) - mr.layer, i128(mw.page) - mr.page, i128(mw.head) - mr.head},
                  {w_layers != r_layers ? 1 : d.layers, d.pages, d.heads}};
    i128 distinct = 1;
    for (size_t i = 1; i < deltas.size(); ++i) distinct += deltas[i] != deltas[i - 1];
    if (distinct * walk_steps(box) > kMaxEnumerated)
      throw LayoutError(too_large(std::to_string(int64_t(distinct)) + " distinct offset differences of " +
                                      region_name(r) + " x " + std::to_string(walk_steps(box)) +
                                      " (the fewest of its layers, pages and heads)",
                                  distinct * walk_steps(box)) +
                        "; compare fewer layers, pages or heads");
    i128 agree = 0;
    for (auto it = deltas.begin(); it != deltas.end();) {
      const auto run = std::upper_bound(it, deltas.end(), *it);
      agree += i128(run - it) * count_in_box(-i128(*it), box);
      it = run;
    }
    rep.misplaced_per_region[size_t(r)] = total - int64_t(agree);
  }
  for (int64_t m : rep.misplaced_per_region) rep.misplaced += m;
  rep.writer_codes = code_order_text(writer.codes);
  rep.reader_codes = code_order_text(reader.codes);
  // The code order says where an NVFP4 byte keeps its two codes; FP8 bytes are whole E4M3 codes.
  rep.codes_agree = writer.codes == reader.codes || (d.fp8(Side::kK) && d.fp8(Side::kV));
  rep.agree = rep.misplaced == 0 && rep.codes_agree;
  // A few, spread over the regions that differ and over their rows; bounded work.
  if (rep.misplaced > 0) rep.examples = spread_examples(writer, reader, max_examples);
  return rep;
}

std::string CompareReport::summary(const std::string& w, const std::string& r) const {
  std::ostringstream s;
  if (agree) {
    s << "agree: " << quote_text(w) << " and " << quote_text(r) << " place all " << elements << " elements at the same bytes";
    return s.str();
  }
  if (misplaced == 0) {
    s << "DISAGREE: " << quote_text(w) << " (writer) and " << quote_text(r) << " (reader) place all " << elements
      << " elements at the same bytes but keep a data byte's two codes at different bits (writer " << writer_codes
      << ", reader " << reader_codes << "): every K and V value is misread";
    return s.str();
  }
  s << "DISAGREE: " << quote_text(w) << " (writer) and " << quote_text(r) << " (reader) place " << misplaced << " of " << elements
    << " elements differently (";
  for (Region reg : kAllRegions)
    s << region_name(reg) << " " << misplaced_per_region[size_t(reg)] << (reg == Region::kVScale ? ")" : ", ");
  if (!codes_agree)
    s << "; and they keep a data byte's two codes at different bits (writer " << writer_codes << ", reader " << reader_codes
      << ")";
  for (const Misplacement& m : examples)
    s << "\n  " << describe_element(m.region, m.coord) << ": writer byte " << m.writer_byte << " of "
      << quote_text(m.writer_buffer) << ", reader byte " << m.reader_byte << " of " << quote_text(m.reader_buffer);
  return s.str();
}

}  // namespace nvfp4kv
