// The validator. Exact over the whole allocation, without enumerating it:
//  1. structure and preconditions;
//  2. bounds: strides are >= 0, so each region's extreme bytes are at its
//     all-zero and all-maximum coordinates;
//  3. overlap, per buffer: the dimensions among (layer, page, head) whose stride
//     every region of the buffer shares are "peeled". One cell (those
//     coordinates at 0) is enumerated exactly, every region and every other
//     coordinate; duplicates there are collisions. Every other element is a cell
//     element translated by v = sum y_d * stride_d for the peeled dims, so two
//     elements of different cells collide iff some nonzero y with |y_d| < extent_d
//     has v in (U - U), U the cell's offsets. Only |v| <= span(U) can matter; the
//     candidate y are enumerated with interval pruning and each is tested exactly
//     against U. For real layouts there are a handful of candidates.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>
#include <tuple>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace {

__extension__ typedef __int128 i128;

enum Outer { kLayer = 0, kPage = 1, kHead = 2, kOuterCount = 3 };

int64_t outer_stride(const RegionMap& m, int d) { return d == kLayer ? m.layer : d == kPage ? m.page : m.head; }
int64_t& outer_coord(Coord& c, int d) { return d == kLayer ? c.layer : d == kPage ? c.page : c.head; }

struct Entry {
  int64_t offset;
  Coord coord;
  Region region;
};

bool entry_less(const Entry& x, const Entry& y) {
  if (x.offset != y.offset) return x.offset < y.offset;
  if (x.region != y.region) return x.region < y.region;
  const auto key = [](const Coord& c) { return std::tuple(c.layer, c.page, c.head, c.token, c.column); };
  return key(x.coord) < key(y.coord);
}

// Steps of the lattice search, over all buffers: about a second at most.
constexpr double kMaxLatticeWork = double(int64_t(1) << 25);

struct OverlapProof {
  std::optional<Collision> collision;
  std::vector<std::string> pairs;
  std::optional<std::string> cannot_prove;
  int64_t enumerated = 0;
  double lattice_work = 0;
};

class BufferProver {
 public:
  BufferProver(const Layout& layout, int32_t buffer, std::vector<Region> group)
      : layout_(layout), buffer_(buffer), group_(std::move(group)) {
    const Buffer& b = layout.buffers[size_t(buffer)];
    extent_[kLayer] = layout.layers_in(b);
    extent_[kPage] = layout.dims.pages;
    extent_[kHead] = layout.dims.heads;
    for (int d = 0; d < kOuterCount; ++d) {
      common_[d] = true;
      for (Region r : group_)
        if (outer_stride(layout.region(r), d) != outer_stride(layout.region(group_[0]), d)) common_[d] = false;
    }
  }

  // Elements one cell holds (what prove() enumerates).
  int64_t cell_elements() const {
    i128 n = 0;
    for (Region r : group_) {
      i128 e = i128(layout_.dims.tokens_per_page) * layout_.dims.columns(r);
      for (int d = 0; d < kOuterCount; ++d)
        if (!common_[d]) e *= extent_[d];
      n += e;
    }
    return n > kMaxEnumerated ? kMaxEnumerated + 1 : int64_t(n);
  }

  // lattice_budget: the lattice-search steps still allowed to the whole check.
  OverlapProof prove(double lattice_budget) {
    OverlapProof proof;
    enumerate_cell();
    proof.enumerated = int64_t(cell_.size());
    if (find_cell_duplicates(proof)) return proof;
    budget_ = lattice_budget;
    search_lattice(proof);
    proof.lattice_work = work_;
    return proof;
  }

 private:
  void enumerate_cell() {
    const CacheDims& dims = layout_.dims;
    cell_.reserve(size_t(cell_elements()));
    for (Region r : group_) {
      const int64_t lmax = common_[kLayer] ? 1 : extent_[kLayer];
      const int64_t pmax = common_[kPage] ? 1 : extent_[kPage];
      const int64_t hmax = common_[kHead] ? 1 : extent_[kHead];
      for (Coord c; c.layer < lmax; ++c.layer)
        for (c.page = 0; c.page < pmax; ++c.page)
          for (c.head = 0; c.head < hmax; ++c.head)
            for (c.token = 0; c.token < dims.tokens_per_page; ++c.token)
              for (c.column = 0; c.column < dims.columns(r); ++c.column)
                cell_.push_back({layout_.offset(r, c), c, r});
    }
    std::sort(cell_.begin(), cell_.end(), entry_less);
  }

  Collision make_collision(const Entry& x, const Entry& y, int64_t byte) const {
    return {x.region, y.region, x.coord, y.coord, layout_.buffers[size_t(buffer_)].name, byte};
  }

  bool find_cell_duplicates(OverlapProof& proof) {
    std::set<std::pair<int, int>> pairs;
    std::optional<std::tuple<int, int, int64_t>> best_key;
    for (size_t i = 0; i + 1 < cell_.size(); ++i) {
      if (cell_[i].offset != cell_[i + 1].offset) continue;
      // entries are sorted by region within one offset, so x.region <= y.region
      const Entry& x = cell_[i];
      const Entry& y = cell_[i + 1];
      pairs.insert({int(x.region), int(y.region)});
      const auto key = std::tuple(int(x.region), int(y.region), x.offset);
      if (!best_key || key < *best_key) {
        best_key = key;
        proof.collision = make_collision(x, y, x.offset);
      }
    }
    for (auto [a, b] : pairs)
      proof.pairs.push_back(std::string(region_name(Region(a))) + "/" + region_name(Region(b)));
    return proof.collision.has_value();
  }

  void search_lattice(OverlapProof& proof) {
    if (cell_.empty()) return;
    dims_.clear();
    for (int d = 0; d < kOuterCount; ++d)
      if (common_[d] && extent_[d] > 1) dims_.push_back(d);
    const RegionMap& m0 = layout_.region(group_[0]);
    for (int d : dims_) {
      if (outer_stride(m0, d) != 0) continue;
      // Two cells one apart along a zero-stride dimension are the same bytes.
      Entry a = cell_.front(), b = cell_.front();
      outer_coord(b.coord, d) = 1;
      proof.collision = make_collision(a, b, a.offset);
      return;
    }
    std::sort(dims_.begin(), dims_.end(),
              [&](int x, int y) { return outer_stride(m0, x) > outer_stride(m0, y); });
    span_ = cell_.back().offset - cell_.front().offset;
    reach_.assign(dims_.size() + 1, 0);
    for (size_t k = dims_.size(); k-- > 0;)
      reach_[k] = reach_[k + 1] + i128(extent_[dims_[k]] - 1) * outer_stride(m0, dims_[k]);
    build_membership();
    y_.assign(dims_.size(), 0);
    work_ = 0;
    visit(0, 0, proof);
  }

  void build_membership() {
    const int64_t lo = cell_.front().offset;
    use_bitmap_ = span_ < (int64_t(1) << 28);
    if (use_bitmap_) {
      bitmap_.assign(size_t(span_ / 64 + 1), 0);
      for (const Entry& e : cell_) bitmap_[size_t((e.offset - lo) / 64)] |= uint64_t(1) << ((e.offset - lo) % 64);
    }
  }

  bool member(int64_t off) const {
    const int64_t lo = cell_.front().offset;
    if (off < lo || off > lo + span_) return false;
    if (use_bitmap_) return (bitmap_[size_t((off - lo) / 64)] >> ((off - lo) % 64)) & 1;
    return std::binary_search(cell_.begin(), cell_.end(), Entry{off, {}, Region::kKData},
                              [](const Entry& x, const Entry& y) { return x.offset < y.offset; });
  }

  // Depth-first over the peeled dims (largest stride first); y_k is limited to the
  // values for which |p + y_k s_k| can still come within span of 0.
  void visit(size_t k, i128 p, OverlapProof& proof) {
    if (proof.collision || proof.cannot_prove) return;
    if (!spend(1, proof)) return;  // every node of the search counts, tested or not
    if (k == dims_.size()) {
      test_translation(p, proof);
      return;
    }
    const int64_t s = outer_stride(layout_.region(group_[0]), dims_[k]);
    const i128 slack = i128(span_) + reach_[k + 1];
    // y in [ceil((-slack - p) / s), floor((slack - p) / s)] intersected with (-e, e)
    const auto floor_div = [](i128 a, i128 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
    const i128 lo = std::max<i128>(-(extent_[dims_[k]] - 1), -floor_div(slack + p, s));
    const i128 hi = std::min<i128>(extent_[dims_[k]] - 1, floor_div(slack - p, s));
    for (i128 y = lo; y <= hi; ++y) {
      y_[k] = int64_t(y);
      visit(k + 1, p + y * s, proof);
      if (proof.collision || proof.cannot_prove) return;
    }
    y_[k] = 0;
  }

  // Charges `steps` to the search; past its budget the proof gives up, undecided.
  bool spend(double steps, OverlapProof& proof) {
    work_ += steps;
    if (work_ <= budget_) return true;
    proof.cannot_prove = "buffer " + quote_text(layout_.buffers[size_t(buffer_)].name) +
                         ": the regions interleave across pages or heads in a way that needs more than " +
                         std::to_string(int64_t(kMaxLatticeWork)) +
                         " (2^25) steps to prove disjoint, the bound on the search; check it with fewer pages or heads";
    return false;
  }

  void test_translation(i128 v, OverlapProof& proof) {
    bool nonzero = false, positive_first = false;
    for (int64_t y : y_) {
      if (y != 0) {
        nonzero = true;
        positive_first = y > 0;
        break;
      }
    }
    // v and -v are the same pair of cells seen from either side: test v >= 0 only.
    if (!nonzero || v < 0 || (v == 0 && !positive_first)) return;
    // A membership test is a bit lookup, or a binary search over the cell.
    if (!spend(double(cell_.size()) * (use_bitmap_ ? 1 : 8), proof)) return;
    for (const Entry& u : cell_) {
      const int64_t target = u.offset + int64_t(v);
      if (!member(target)) continue;
      // Element `hit` in cell c1 and `u` in cell c2 = c1 + y share a byte.
      const Entry& hit = *std::lower_bound(cell_.begin(), cell_.end(), Entry{target, {}, Region::kKData},
                                           [](const Entry& x, const Entry& y) { return x.offset < y.offset; });
      Entry a = hit, b = u;
      for (size_t k = 0; k < dims_.size(); ++k) {
        outer_coord(a.coord, dims_[k]) += std::max<int64_t>(0, -y_[k]);
        outer_coord(b.coord, dims_[k]) += std::max<int64_t>(0, y_[k]);
      }
      const int64_t byte = layout_.offset(a.region, a.coord);
      proof.collision = (a.region <= b.region) ? make_collision(a, b, byte) : make_collision(b, a, byte);
      return;
    }
  }

  const Layout& layout_;
  int32_t buffer_;
  std::vector<Region> group_;
  int64_t extent_[kOuterCount];
  bool common_[kOuterCount];
  std::vector<Entry> cell_;
  std::vector<int> dims_;
  std::vector<i128> reach_;
  std::vector<int64_t> y_;
  std::vector<uint64_t> bitmap_;
  bool use_bitmap_ = false;
  int64_t span_ = 0;
  double work_ = 0, budget_ = 0;
};

// The coordinate of a region's last byte (strides >= 0: each coordinate at the
// argmax of its own term).
Coord last_coord(const Layout& layout, Region r) {
  const CacheDims& d = layout.dims;
  const RegionMap& m = layout.region(r);
  const Buffer& b = layout.buffers[size_t(m.buffer)];
  return {layout.layers_in(b) - 1, d.pages - 1, m.token.argmax(d.tokens_per_page), d.heads - 1,
          m.column.argmax(d.columns(r))};
}

void check_structure(const Layout& layout, CheckReport& rep) {
  if (std::string p = evaluation_problem(layout); !p.empty()) {
    rep.problems.push_back(p);  // nothing below may evaluate an offset
    return;
  }
  const CacheDims& d = layout.dims;
  auto need = [&](bool ok, const std::string& msg) {
    if (!ok) rep.problems.push_back(msg);
  };
  std::set<std::string> names;
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    const Buffer& b = layout.buffers[i];
    need(!b.name.empty(), "a buffer has an empty name");
    need(names.insert(b.name).second, "buffer " + quote_text(b.name) + " is named twice");
    // Size 0 only for a buffer no region places anything in (an FP8 side's scale buffer).
    bool used = false;
    for (Region r : kAllRegions) used = used || (d.holds(r) && layout.region(r).buffer == int(i));
    need(b.bytes > 0 || (b.bytes == 0 && !used), "buffer " + quote_text(b.name) + " has size " + std::to_string(b.bytes));
  }
  for (Region r : kAllRegions) {
    if (!d.holds(r)) continue;
    const RegionMap& m = layout.region(r);
    const std::string rn = region_name(r);
    const Buffer& b = layout.buffers[size_t(m.buffer)];
    need(m.offset >= 0, rn + " has a negative offset " + std::to_string(m.offset));
    for (auto [stride, dim] : {std::pair{m.layer, "layer"}, {m.page, "page"}, {m.token.stride, "token"},
                               {m.token.inner_stride, "inner token"}, {m.head, "head"}, {m.column.stride, "column"},
                               {m.column.inner_stride, "inner column"}})
      need(stride >= 0, rn + " has a negative " + dim + " stride " + std::to_string(stride) +
                            "; describe the buffer from its lowest address with strides >= 0");
    for (auto [mode, dim, extent] : {std::tuple{&m.token, "token", d.tokens_per_page}, {&m.column, "column", d.columns(r)}})
      need(mode->inner >= 1, rn + ": the " + dim + " mode's inner extent must be at least 1 (" + std::to_string(extent) + " " +
                                 dim + "s), got " + std::to_string(mode->inner));
    need(!(b.per_layer && m.layer != 0), rn + " lives in per-layer buffer " + quote_text(b.name) +
                                             " but has a layer stride; a per-layer buffer holds one layer");
  }
}

void check_bounds(const Layout& layout, CheckReport& rep) {
  for (Region r : kAllRegions) {
    if (!layout.dims.holds(r)) continue;
    const Coord c = last_coord(layout, r);
    const int64_t last = layout.offset(r, c);
    const Buffer& b = layout.buffers[size_t(layout.region(r).buffer)];
    if (last >= b.bytes)
      rep.problems.push_back(describe_element(r, c) + " at byte " + std::to_string(last) + " is outside buffer " +
                             quote_text(b.name) + " of " + std::to_string(b.bytes) + " bytes");
  }
}

int64_t lowest_power_of_two(int64_t g) { return g & -g; }

// How a sound layout's regions may be accessed: vector width per row, and
// whether each (layer, page, head) tile is one dense, aligned plane (a kernel can
// then copy the plane in one piece and address it with the tile's modes).
void report_access(const Layout& layout, CheckReport& rep) {
  const CacheDims& d = layout.dims;
  for (Region r : kAllRegions) {
    if (!d.holds(r)) {  // nothing to access: the default (1-byte rows, no dense plane), marked empty
      rep.access[size_t(r)].holds = false;
      continue;
    }
    const RegionMap& m = layout.region(r);
    RegionAccess& a = rep.access[size_t(r)];
    const Buffer& b = layout.buffers[size_t(m.buffer)];
    // The tile bases: offset + layer, page and head multiples.
    int64_t base = std::gcd(int64_t(16), m.offset);
    if (layout.layers_in(b) > 1) base = std::gcd(base, m.layer);
    if (d.pages > 1) base = std::gcd(base, m.page);
    if (d.heads > 1) base = std::gcd(base, m.head);
    a.plane_align = int(lowest_power_of_two(base));
    const int64_t cols = d.columns(r), n = d.tokens_per_page;
    const int64_t span = m.token(m.token.argmax(n)) + m.column(m.column.argmax(cols)) + 1;
    a.dense_plane = span == n * cols;  // injective (proved) and no gap
    // Rows: a contiguous row of columns (plain column stride 1) starting at every token's offset.
    if (!(m.column.is_plain() && m.column.stride == 1)) {
      a.vector_bytes = 1;
      continue;
    }
    int64_t g = std::gcd(base, cols);
    if (n > 1) g = std::gcd(g, m.token.is_plain() ? m.token.stride : std::gcd(m.token.inner_stride, m.token.stride));
    a.vector_bytes = int(lowest_power_of_two(g));
  }
}

void check_overlap(const Layout& layout, CheckReport& rep) {
  // The region groups to prove, per buffer, and what enumerating their cells takes.
  struct Group {
    int32_t buffer;
    std::vector<Region> regions;
  };
  std::vector<Group> all;
  for (int32_t buf = 0; buf < int32_t(layout.buffers.size()); ++buf) {
    std::vector<Region> group;
    for (Region r : kAllRegions)
      if (layout.region(r).buffer == buf && layout.dims.holds(r)) group.push_back(r);
    if (group.empty()) continue;
    if (BufferProver(layout, buf, group).cell_elements() <= kMaxEnumerated || group.size() == 1) {
      all.push_back({buf, group});
      continue;
    }
    // The regions do not share their page/head strides: prove each region on
    // its own, then each pair apart by its address range.
    for (Region r : group) all.push_back({buf, {r}});
    for (size_t i = 0; i < group.size(); ++i)
      for (size_t j = i + 1; j < group.size(); ++j) {
        const int64_t lo_i = layout.region(group[i]).offset, lo_j = layout.region(group[j]).offset;
        const int64_t hi_i = layout.offset(group[i], last_coord(layout, group[i]));
        const int64_t hi_j = layout.offset(group[j], last_coord(layout, group[j]));
        if (hi_i < lo_j || hi_j < lo_i) continue;
        std::vector<Region> pair{group[i], group[j]};
        if (BufferProver(layout, buf, pair).cell_elements() > kMaxEnumerated) {
          rep.undecided = true;
          rep.problems.push_back(std::string("cannot prove ") + region_name(group[i]) + " and " +
                                 region_name(group[j]) + " disjoint in buffer " + quote_text(layout.buffers[size_t(buf)].name) +
                                 ": their address ranges overlap and they use different page/head strides; "
                                 "check the layout with fewer pages");
          return;
        }
        all.push_back({buf, pair});
      }
  }
  // One bound on the whole proof, refused before anything is enumerated.
  int64_t cells = 0;  // each term at most 2^23 + 1, at most 80 of them
  for (const Group& g : all) cells += BufferProver(layout, g.buffer, g.regions).cell_elements();
  if (cells > kMaxEnumerated) {
    rep.undecided = true;
    rep.problems.push_back("cannot prove the layout sound at these sizes: its page cells hold more than " +
                           std::to_string(kMaxEnumerated) +
                           " (2^23) elements to enumerate, the bound on any enumeration; check it with fewer heads or "
                           "tokens per page");
    return;
  }
  double lattice_work = 0;  // one budget for the lattice search too
  for (const Group& g : all) {
    OverlapProof proof = BufferProver(layout, g.buffer, g.regions).prove(kMaxLatticeWork - lattice_work);
    rep.elements_enumerated += proof.enumerated;
    lattice_work += proof.lattice_work;
    if (proof.cannot_prove) {
      rep.undecided = true;
      rep.problems.push_back(*proof.cannot_prove);
      return;
    }
    if (proof.collision) {
      std::string msg = proof.collision->message();
      if (proof.pairs.size() > 1) {
        msg += " (colliding in one cell:";
        for (const auto& p : proof.pairs) msg += " " + p;
        msg += ")";
      }
      rep.problems.push_back(msg);
      rep.collision = proof.collision;
      rep.colliding_pairs = proof.pairs;
      return;
    }
  }
}

}  // namespace

Layout with_plain_modes(Layout l) {
  for (Region r : kAllRegions) {
    RegionMap& m = l.regions[size_t(r)];
    for (auto [mode, extent] : {std::pair{&m.token, l.dims.tokens_per_page}, {&m.column, l.dims.columns(r)}})
      if (mode->inner > extent && extent >= 1) *mode = Mode(mode->inner_stride);  // x % inner == x for every x < extent
  }
  return l;
}

CheckResult check(const Layout& given) {
  const auto start = std::chrono::steady_clock::now();
  CheckReport rep;
  check_structure(given, rep);
  const Layout layout = with_plain_modes(given);  // the proof and the ValidLayout see one spelling
  if (rep.problems.empty()) {
    // Overlap first: a collision names the cause (two coordinates, one byte) even
    // when the same mistake also pushes the last elements out of bounds.
    report_access(layout, rep);
    check_overlap(layout, rep);
    const size_t before = rep.problems.size();
    check_bounds(layout, rep);
    if (rep.undecided && rep.problems.size() > before) {
      // An element outside its buffer decides it: unsound, whatever the overlap proof could not finish.
      std::rotate(rep.problems.begin(), rep.problems.begin() + std::ptrdiff_t(before), rep.problems.end());
      rep.undecided = false;
    }
  }
  if (rep.problems.empty()) {
    const CacheDims& d = layout.dims;
    for (Region r : kAllRegions)
      rep.elements += d.layers * d.pages * d.heads * d.tokens_per_page * d.columns(r);
  }
  rep.ok = rep.problems.empty();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CheckResult result{rep, std::nullopt};
  if (rep.ok) result.valid = ValidLayout(layout, std::move(rep));
  return result;
}

}  // namespace nvfp4kv
