#include "nvfp4kv/core/layout.hpp"

#include <algorithm>
#include <sstream>

namespace nvfp4kv {

__extension__ typedef __int128 i128;

std::string quote_text(std::string_view text) {
  constexpr size_t kShown = 48;
  size_t cut = std::min(text.size(), kShown);
  while (cut < text.size() && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8 characters
  std::string out = "\"";
  for (const char c : text.substr(0, cut)) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
  if (cut < text.size()) out += "... (" + std::to_string(text.size()) + " characters)";
  return out;
}

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

namespace {

std::string decimal(i128 v) {  // v >= 0
  std::string digits;
  do {
    digits += char('0' + int(v % 10));
    v /= 10;
  } while (v > 0);
  return {digits.rbegin(), digits.rend()};
}

i128 magnitude(int64_t v) { return v < 0 ? -i128(v) : i128(v); }

// One term of a region's offset at its largest magnitude over the domain, and what it is.
struct Term {
  i128 reach;
  std::string what;
};

Term affine_term(int64_t stride, int64_t extent, const char* dim) {
  return {i128(extent - 1) * magnitude(stride),
          std::string(dim) + " " + std::to_string(extent - 1) + " x stride " + std::to_string(stride)};
}

Term mode_term(const Mode& m, int64_t extent, const char* dim) {
  const i128 last = extent - 1;
  const i128 reach = m.is_plain() ? last * magnitude(m.stride)
                                  : std::min<i128>(last, m.inner - 1) * magnitude(m.inner_stride) +
                                        (last / m.inner) * magnitude(m.stride);
  return {reach, std::string(dim) + " " + std::to_string(extent - 1) + " through mode " + mode_text(m)};
}

}  // namespace

namespace {
struct NamedOrder {
  const char* name;
  CodeOrder order;
};
constexpr NamedOrder kNamedOrders[] = {
    {"standard", {{0, 1, 2, 3, 4, 5, 6, 7}}},
    {"high-first", {{4, 5, 6, 7, 0, 1, 2, 3}}},
    {"fp16-split", CodeOrder::fp16_split()},
};
}  // namespace

std::optional<CodeOrder> code_order_named(std::string_view name) {
  for (const NamedOrder& n : kNamedOrders)
    if (name == n.name) return n.order;
  return std::nullopt;
}

std::string code_order_name(const CodeOrder& order) {
  for (const NamedOrder& n : kNamedOrders)
    if (n.order == order) return n.name;
  return "";
}

std::string code_order_text(const CodeOrder& order) {
  if (std::string name = code_order_name(order); !name.empty()) return name;
  std::string out;
  for (int e = 0; e < 2; ++e) {
    out += e ? " odd [" : "even [";
    for (int c = 0; c < 4; ++c) out += (c ? "," : "") + std::to_string(order.bit[4 * e + c]);
    out += "]";
  }
  return out;
}

std::string code_order_problem(const CodeOrder& order) {
  static const char* const kBits[4] = {"mantissa", "exponent bit 0", "exponent bit 1", "sign"};
  int owner[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  for (int i = 0; i < 8; ++i) {
    const int b = order.bit[i];
    const std::string what = std::string(i < 4 ? "the even element's " : "the odd element's ") + kBits[i % 4];
    if (b > 7) return "codes: " + what + " is at bit " + std::to_string(b) + "; a byte has bits 0 to 7";
    if (owner[b] >= 0)
      return "codes: bit " + std::to_string(b) + " holds both " +
             (owner[b] < 4 ? "the even element's " : "the odd element's ") + kBits[owner[b] % 4] + " and " + what +
             "; each of a byte's 8 bits holds one code bit";
    owner[b] = i;
  }
  return "";
}

std::string evaluation_problem(const Layout& l) {
  if (std::string p = dims_problem(l.dims); !p.empty()) return p;
  if (std::string p = code_order_problem(l.codes); !p.empty()) return p;
  const CacheDims& d = l.dims;
  const std::string bound = std::to_string(kOffsetLimit) + " (2^62)";
  if (l.buffers.empty()) return "the layout names no buffer";
  if (l.buffers.size() > size_t(kMaxBuffers))
    return std::to_string(l.buffers.size()) + " buffers; a layout has at most " + std::to_string(kMaxBuffers) +
           " (a cache hands kernels " + std::to_string(kMaxBuffers) + " base pointers)";
  for (Side side : {Side::kK, Side::kV})
    if (d.element(side) != ElementFormat::kNvfp4 && d.element(side) != ElementFormat::kFp8E4M3)
      return std::string(side == Side::kK ? "K" : "V") + " has an unknown element format " +
             std::to_string(int(d.element(side)));
  // Elements of the whole cache: K and V, their data and scale columns per token and head.
  i128 count = 1;
  std::string factors;
  for (auto [v, what] : {std::pair{i128(d.layers), "layers "}, {i128(d.pages), "pages "}, {i128(d.heads), "heads "},
                         {i128(d.tokens_per_page), "tokens per page "},
                         {i128(d.row_bytes()), "elements per token and head "}}) {
    factors += std::string(factors.empty() ? "" : " x ") + what + decimal(v);
    count = std::min<i128>(count * v, i128(kOffsetLimit) + 1);  // both factors <= 2^64: no overflow
  }
  if (count > kOffsetLimit)
    return factors + " is more than " + bound + " elements, the bound on any count; lower the sizes";
  for (Region r : kAllRegions) {
    if (!d.holds(r)) continue;  // an FP8 side's scale region: no element, no offset to compute
    const RegionMap& m = l.region(r);
    const std::string rn = region_name(r);
    if (m.buffer < 0 || size_t(m.buffer) >= l.buffers.size())
      return rn + " names buffer #" + std::to_string(m.buffer) + ", which does not exist";
    for (auto [mode, dim] : {std::pair{&m.token, "token"}, {&m.column, "column"}})
      if (mode->inner < 1) return rn + ": the " + dim + " mode's inner extent must be >= 1, got " + std::to_string(mode->inner);
    for (auto [v, what] : {std::pair{m.offset, "offset"}, {m.layer, "layer stride"}, {m.page, "page stride"},
                           {m.head, "head stride"}, {m.token.inner_stride, "inner token stride"},
                           {m.token.stride, "token stride"}, {m.column.inner_stride, "inner column stride"},
                           {m.column.stride, "column stride"}})
      if (magnitude(v) > kOffsetLimit) return rn + ": " + what + " " + std::to_string(v) + " is beyond +-" + bound + ", the bound on any offset";
    // Every partial sum of an offset is at most the sum of its terms' magnitudes.
    const Term terms[] = {{magnitude(m.offset), "offset " + std::to_string(m.offset)},
                          affine_term(m.layer, d.layers, "layer"),
                          affine_term(m.page, d.pages, "page"),
                          affine_term(m.head, d.heads, "head"),
                          mode_term(m.token, d.tokens_per_page, "token"),
                          mode_term(m.column, d.columns(r), is_scale(r) ? "group" : "byte")};
    i128 reach = 0;  // each term < 2^126 and the sum stops past the bound: no overflow
    const Term* largest = &terms[0];
    for (const Term& t : terms) {
      if (t.reach > largest->reach) largest = &t;
      if (reach <= kOffsetLimit) reach += t.reach;
    }
    if (reach > kOffsetLimit)
      return rn + ": offsets reach beyond " + bound + " bytes, the bound on any offset (largest term: " + largest->what +
             "); lower the sizes";
  }
  i128 total = 0;
  for (const Buffer& b : l.buffers) {
    if (b.bytes < 0 || b.bytes > kOffsetLimit)
      return "buffer " + quote_text(b.name) + " has size " + std::to_string(b.bytes) + "; a size lies in [0, " + bound + "]";
    if (total <= kOffsetLimit) total += i128(b.bytes) * (b.per_layer ? d.layers : 1);  // < 2^125: no overflow
  }
  if (total > kOffsetLimit)
    return "the allocations over " + std::to_string(d.layers) + " layer(s) total more than " + bound +
           " bytes, the bound on any size; lower the sizes";
  return "";
}

void require_evaluable(const Layout& l) {
  if (const std::string p = evaluation_problem(l); !p.empty()) throw LayoutError("layout " + quote_text(l.name) + ": " + p);
}

int64_t Layout::total_bytes() const {
  require_evaluable(*this);  // the total is within 2^62
  int64_t total = 0;
  for (const Buffer& b : buffers) total += b.bytes * (b.per_layer ? dims.layers : 1);
  return total;
}

void interleave_scale_plane(Layout& l, Region r) {
  RegionMap& m = l.regions[size_t(r)];
  const int64_t sd = l.dims.scale_bytes();
  if (is_scale(r) && !l.dims.holds(r))
    throw LayoutError(std::string(region_name(r)) + ": its side holds fp8_e4m3 elements, which have no block scales to interleave");
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
         std::to_string(byte) + " of buffer " + quote_text(buffer);
}

std::string CheckReport::summary() const {
  std::ostringstream s;
  if (ok) {
    s << "sound: " << elements << " elements over all layers and pages are in bounds and own distinct bytes"
      << " (proved from " << elements_enumerated << " enumerated elements in " << seconds * 1e3 << " ms)";
  } else {
    s << (undecided ? "UNDECIDED: " : "REJECTED: ") << (problems.empty() ? std::string("unknown") : problems.front());
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
  v.codes_ = layout_.codes;
  return v;
}

ValidLayout validate(const Layout& layout) {
  CheckResult result = check(layout);
  if (!result.valid) throw LayoutError("layout \"" + layout.name + "\" " + result.report.summary());
  return std::move(*result.valid);
}

}  // namespace nvfp4kv
