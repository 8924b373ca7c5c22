#include "nvfp4kv/conformance/infer.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_map>

namespace nvfp4kv::conformance {

__extension__ typedef __int128 i128;

// ---- finding byte sequences ---------------------------------------------------
std::vector<std::vector<Location>> find_patterns(const std::vector<std::vector<uint8_t>>& buffers,
                                                 const std::vector<Pattern>& patterns, const uint8_t* normalize,
                                                 const bool* first, size_t max_hits) {
  std::vector<std::vector<Location>> hits(patterns.size());
  const auto norm = [&](uint8_t b) { return normalize ? normalize[b] : b; };
  const auto pack = [&](const uint8_t* p, int len, int64_t stride) {
    uint64_t key = 0;
    for (int i = 0; i < len; ++i) key |= uint64_t(norm(p[i * stride])) << (8 * i);
    return key;
  };
  // One scan per (length, stride); patterns of a group looked up by their packed bytes.
  std::map<std::pair<int, int64_t>, std::unordered_map<uint64_t, std::vector<size_t>>> groups;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const Pattern& p = patterns[i];
    if (p.length < 1 || p.length > 8 || p.stride < 1) continue;
    groups[{p.length, p.stride}][pack(p.bytes.data(), p.length, 1)].push_back(i);
  }
  for (const auto& [shape, table] : groups) {
    const auto [len, stride] = shape;
    const int64_t span = int64_t(len - 1) * stride + 1;
    for (size_t b = 0; b < buffers.size(); ++b) {
      const std::vector<uint8_t>& buf = buffers[b];
      for (int64_t o = 0; o + span <= int64_t(buf.size()); ++o) {
        if (first && !first[buf[size_t(o)]]) continue;
        const auto it = table.find(pack(buf.data() + o, len, stride));
        if (it == table.end()) continue;
        for (size_t i : it->second)
          if (hits[i].size() < max_hits) hits[i].push_back({int32_t(b), o});
      }
    }
  }
  return hits;
}

// ---- who owns a byte -----------------------------------------------------------
ByteOwners::ByteOwners(const Layout& l, int64_t layer) : layout_(&l) {
  const CacheDims& d = l.dims;
  // Element numbers leave room for the widest row of any region (D / 2 columns for NVFP4 data,
  // D for an FP8 side's), so an NVFP4 layout maps as large a cache as before FP8 pages.
  for (Region r : kAllRegions) width_ = std::max(width_, d.columns(r));
  const i128 count = i128(d.layers) * d.pages * d.heads * d.tokens_per_page * kRegionCount * width_;
  if (count >= i128(kNone)) throw ArgumentError("ByteOwners: the layout has too many elements to map byte by byte");
  for (const Buffer& b : l.buffers) index_.emplace_back(size_t(b.bytes), kNone);
  uint32_t n = 0;
  for (Coord c; c.layer < d.layers; ++c.layer)
    for (c.page = 0; c.page < d.pages; ++c.page)
      for (c.head = 0; c.head < d.heads; ++c.head)
        for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
          for (Region r : kAllRegions)
            for (c.column = 0; c.column < width_; ++c.column, ++n) {
              if (c.column >= d.columns(r)) continue;
              const RegionMap& m = l.region(r);
              if (l.buffers[size_t(m.buffer)].per_layer && c.layer != layer) continue;  // the allocation of one layer
              const int64_t at = region_offset(m, c);
              if (at >= 0 && at < int64_t(index_[size_t(m.buffer)].size())) index_[size_t(m.buffer)][size_t(at)] = n;
            }
}

Element ByteOwners::element(uint32_t n) const {
  const CacheDims& d = layout_->dims;
  Element e;
  e.coord.column = n % width_;
  n /= uint32_t(width_);
  e.region = Region(n % kRegionCount);
  n /= kRegionCount;
  e.coord.token = n % d.tokens_per_page;
  n /= uint32_t(d.tokens_per_page);
  e.coord.head = n % d.heads;
  n /= uint32_t(d.heads);
  e.coord.page = n % d.pages;
  e.coord.layer = n / d.pages;
  return e;
}

std::optional<Element> ByteOwners::owner(const Location& at) const {
  if (at.buffer < 0 || size_t(at.buffer) >= index_.size() || at.byte < 0 || at.byte >= int64_t(index_[size_t(at.buffer)].size()))
    return std::nullopt;
  const uint32_t n = index_[size_t(at.buffer)][size_t(at.byte)];
  if (n == kNone) return std::nullopt;
  return element(n);
}

std::string ByteOwners::describe(const Location& at) const {
  if (at.buffer < 0 || size_t(at.buffer) >= index_.size() || at.byte < 0 || at.byte >= int64_t(index_[size_t(at.buffer)].size()))
    return "outside the buffer";
  const auto e = owner(at);
  return e ? describe_element(e->region, e->coord) : "no element";
}

std::string ByteOwners::describe_run(const Location& at, int64_t length, int64_t stride) const {
  const auto first = owner(at);
  if (length <= 1) return describe(at);
  const Location last_at{at.buffer, at.byte + (length - 1) * stride};
  const auto last = owner(last_at);
  if (first && last && first->region == last->region) {
    bool one_row = true;  // consecutive columns of one (layer, page, head, token)
    for (int64_t i = 0; i < length && one_row; ++i) {
      const auto e = owner({at.buffer, at.byte + i * stride});
      one_row = e && e->region == first->region && e->coord.layer == first->coord.layer && e->coord.page == first->coord.page &&
                e->coord.head == first->coord.head && e->coord.token == first->coord.token &&
                e->coord.column == first->coord.column + i;
    }
    if (one_row) {
      const Coord& c = first->coord;
      std::ostringstream s;
      s << region_name(first->region) << "[layer " << c.layer << ", page " << c.page << ", token " << c.token << ", head "
        << c.head << (is_scale(first->region) ? ", groups " : ", bytes ") << c.column << ".." << c.column + length - 1 << "]";
      return s.str();
    }
  }
  return describe(at) + " .. " + describe(last_at);
}

// ---- fitting a map ---------------------------------------------------------------
std::optional<Mode> fit_mode(const std::vector<std::pair<int64_t, int64_t>>& pts, int64_t extent) {
  if (pts.size() < 2) return std::nullopt;
  const auto [x0, y0] = pts[0];
  bool spread = false;
  for (const auto& p : pts) spread = spread || p.first != x0;
  if (!spread) return std::nullopt;  // every x alike: nothing to fit
  // Plain: y - y0 = (x - x0) * s.
  {
    std::optional<int64_t> s;
    bool ok = true;
    for (const auto& [x, y] : pts) {
      if (x == x0) {
        ok = ok && y == y0;
        continue;
      }
      if ((y - y0) % (x - x0) != 0 || (s && *s != (y - y0) / (x - x0))) {
        ok = false;
        break;
      }
      s = (y - y0) / (x - x0);
    }
    if (ok) return Mode(*s);
  }
  // Nested: y - y0 = (r - r0) * a + (q - q0) * b with r = x % n, q = x / n.
  for (int64_t n = 2; n < extent; ++n) {
    const int64_t r0 = x0 % n, q0 = x0 / n;
    std::optional<std::pair<int64_t, int64_t>> ab;  // (a, b) from the first two independent points
    bool solvable = true;
    for (size_t i = 1; i < pts.size() && !ab && solvable; ++i)
      for (size_t j = i + 1; j < pts.size() && !ab && solvable; ++j) {
        const int64_t dr1 = pts[i].first % n - r0, dq1 = pts[i].first / n - q0, dy1 = pts[i].second - y0;
        const int64_t dr2 = pts[j].first % n - r0, dq2 = pts[j].first / n - q0, dy2 = pts[j].second - y0;
        const int64_t det = dr1 * dq2 - dr2 * dq1;
        if (det == 0) continue;
        const int64_t an = dy1 * dq2 - dy2 * dq1, bn = dr1 * dy2 - dr2 * dy1;
        if (an % det != 0 || bn % det != 0) solvable = false;  // no integer strides: this n fails
        else ab = std::pair{an / det, bn / det};
      }
    if (!ab) continue;
    bool ok = true;
    for (const auto& [x, y] : pts) ok = ok && y - y0 == (x % n - r0) * ab->first + (x / n - q0) * ab->second;
    if (ok) return Mode(n, ab->first, ab->second);
  }
  return std::nullopt;
}

namespace {

template <typename Key, typename Value>
std::optional<Value> winner(const std::map<Key, int64_t>& votes, const std::map<Key, Value>& values) {
  if (votes.empty()) return std::nullopt;
  const auto best = std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return values.at(best->first);
}

using ModeKey = std::tuple<int64_t, int64_t, int64_t>;
ModeKey key_of(const Mode& m) { return {m.inner, m.inner_stride, m.stride}; }

// Votes, weighted by the points each group holds, for the mode of one coordinate
// within groups of observations that agree on the others.
template <typename GroupKey>
std::optional<Mode> vote_mode(const std::vector<Observation>& obs, GroupKey group_key, int64_t Observation::*coord,
                              int64_t extent, bool plain_only) {
  std::map<decltype(group_key(obs[0])), std::vector<std::pair<int64_t, int64_t>>> groups;
  for (const Observation& o : obs) groups[group_key(o)].push_back({o.*coord, o.at.byte});
  std::map<ModeKey, int64_t> votes;
  std::map<ModeKey, Mode> modes;
  for (auto& [k, pts] : groups) {
    std::sort(pts.begin(), pts.end());
    pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
    const auto m = fit_mode(pts, plain_only ? 2 : extent);
    if (!m) continue;
    votes[key_of(*m)] += int64_t(pts.size());
    modes[key_of(*m)] = *m;
  }
  return winner(votes, modes);
}

}  // namespace

RegionFit fit_region(const std::vector<Observation>& all, const Layout& prior, Region r, int64_t layer) {
  RegionFit fit;
  fit.map = prior.region(r);
  fit.observations = int64_t(all.size());
  if (all.empty()) return fit;
  const CacheDims& d = prior.dims;
  // The buffer most observations are in.
  std::map<int32_t, int64_t> in;
  for (const Observation& o : all) ++in[o.at.buffer];
  const int32_t buffer = std::max_element(in.begin(), in.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  std::vector<Observation> obs;
  for (const Observation& o : all)
    if (o.at.buffer == buffer) obs.push_back(o);
  RegionMap& m = fit.map;
  m.buffer = buffer;
  using K3 = std::tuple<int64_t, int64_t, int64_t>;
  const auto column = vote_mode(obs, [](const Observation& o) { return K3{o.page, o.token, o.head}; }, &Observation::column,
                                d.columns(r), false);
  const auto token = vote_mode(obs, [](const Observation& o) { return K3{o.page, o.head, o.column}; }, &Observation::token,
                               d.tokens_per_page, false);
  const auto head = vote_mode(obs, [](const Observation& o) { return K3{o.page, o.token, o.column}; }, &Observation::head, 0, true);
  const auto page = vote_mode(obs, [](const Observation& o) { return K3{o.token, o.head, o.column}; }, &Observation::page, 0, true);
  if (column) m.column = *column;
  else if (d.columns(r) > 1) fit.unobserved.push_back("column");
  if (token) m.token = *token;
  else if (d.tokens_per_page > 1) fit.unobserved.push_back("token");
  if (head) m.head = head->stride;
  else if (d.heads > 1) fit.unobserved.push_back("head stride");
  if (page) m.page = page->stride;
  else if (d.pages > 1) fit.unobserved.push_back("page stride");
  const bool shared = !prior.buffers[size_t(buffer)].per_layer;
  if (d.layers > 1 && shared) fit.unobserved.push_back("layer stride (one layer was written)");
  const int64_t L = shared ? layer : 0;
  std::map<int64_t, int64_t> offsets;
  for (const Observation& o : obs)
    ++offsets[o.at.byte - (region_offset(m, {L, o.page, o.token, o.head, o.column}) - m.offset)];
  m.offset = std::max_element(offsets.begin(), offsets.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  for (const Observation& o : all)
    fit.explained += o.at.buffer == m.buffer && o.at.byte == region_offset(m, {L, o.page, o.token, o.head, o.column});
  fit.fitted = true;
  return fit;
}

}  // namespace nvfp4kv::conformance
