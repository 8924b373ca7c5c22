// check-write: what an engine's writer did with the kit's rows, byte by byte
// (docs/conformance.md, "check-write").
#include <algorithm>
#include <set>
#include <tuple>
#include <sstream>

#include "nvfp4kv/conformance/check.hpp"
#include "nvfp4kv/core/version.hpp"
#include "trace.hpp"

namespace nvfp4kv::conformance {

const char* verdict_name(RegionVerdict v) {
  switch (v) {
    case RegionVerdict::kExact: return "exact";
    case RegionVerdict::kRoundingOnly: return "rounding-only";
    default: return "misplaced";
  }
}

std::string describe_block(const Kit& kit, const BlockId& b, bool scale) {
  std::ostringstream s;
  const SideRegions reg = side_regions(b.side);
  s << region_name(scale ? reg.scale : reg.data) << " of row " << b.row;
  if (const auto c = kit.cell(b.row)) s << " (page " << c->first << ", token " << c->second << ")";
  else s << " (padding)";
  s << ", head " << b.head;
  if (scale) s << ", group " << b.group;
  else s << ", bytes " << b.group * 8 << ".." << b.group * 8 + 7;
  return s.str();
}

bool WriteReport::ok() const {
  for (const RegionWriteReport& r : regions)
    if (r.verdict == RegionVerdict::kMisplaced) return false;
  return outside_bytes == 0 && unstored_bytes == 0 && padding_rows_written.empty();
}

namespace {

// Runs of consecutive changed bytes of one category.
void add_touched(std::vector<TouchedRun>& runs, const Location& at, const std::string& owner, const std::string& holds) {
  if (!runs.empty() && runs.back().first.buffer == at.buffer && runs.back().first.byte + runs.back().bytes == at.byte) {
    ++runs.back().bytes;
    return;
  }
  runs.push_back({at, 1, owner, holds});
}

}  // namespace

WriteReport check_write(const Kit& kit, const std::vector<std::vector<uint8_t>>& dumps, int max_examples,
                        const Progress& progress) {
  const Layout& l = kit.layout();
  const CacheDims& d = l.dims;
  if (dumps.size() != l.buffers.size())
    throw ArgumentError("check-write: the layout has " + std::to_string(l.buffers.size()) + " buffer(s), " +
                        std::to_string(dumps.size()) + " given");
  for (size_t i = 0; i < dumps.size(); ++i)
    if (int64_t(dumps[i].size()) != l.buffers[i].bytes)
      throw ArgumentError("check-write: buffer \"" + l.buffers[i].name + "\" is " + std::to_string(l.buffers[i].bytes) +
                          " bytes in the layout, the dump holds " + std::to_string(dumps[i].size()));
  WriteReport rep;
  rep.layout = l.name;
  for (const Buffer& b : l.buffers) rep.buffers.push_back(b.name);
  for (Region r : kAllRegions) rep.regions[size_t(r)].region = r;
  const int64_t layer = kit.options.layer, sd = d.scale_bytes();
  report_progress(progress, "mapping the layout's bytes", 0.0);
  const ByteOwners owners(l, layer);
  report_progress(progress, "finding the rows' signatures in the dump", 0.2);
  const Trace trace = trace_kit(kit, dumps);

  // Each stored block at the layout's bytes: exact, explained by a rounding policy, or wrong.
  report_progress(progress, "comparing every stored block", 0.5);
  std::array<std::vector<ElementPlace>, kRegionCount> wrong;
  for (int64_t b = 0; b < kit.block_count(); ++b) {
    const BlockId id = kit.block(b);
    const auto cell = kit.cell(id.row);
    if (!cell) continue;
    const SideRegions reg = side_regions(id.side);
    Coord c{layer, cell->first, cell->second, id.head, id.group};
    const Location scale_at{l.region(reg.scale).buffer, l.offset(reg.scale, c)};
    std::array<Location, 8> data_at;
    uint8_t written[8];
    int differ = 0;
    for (int j = 0; j < 8; ++j) {
      c.column = id.group * 8 + j;
      data_at[size_t(j)] = {l.region(reg.data).buffer, l.offset(reg.data, c)};
      written[j] = dumps[size_t(data_at[size_t(j)].buffer)][size_t(data_at[size_t(j)].byte)];
      differ += written[j] != kit.cache[size_t(data_at[size_t(j)].buffer)][size_t(data_at[size_t(j)].byte)];
    }
    const uint8_t written_scale = dumps[size_t(scale_at.buffer)][size_t(scale_at.byte)];
    const bool scale_differs = written_scale != kit.cache[size_t(scale_at.buffer)][size_t(scale_at.byte)];
    RegionWriteReport &rd = rep.regions[size_t(reg.data)], &rs = rep.regions[size_t(reg.scale)];
    rd.bytes += 8;
    rs.bytes += 1;
    rd.exact += 8 - differ;
    rs.exact += !scale_differs;
    if (differ == 0 && !scale_differs) continue;
    float x[kBlockSize];
    kit.block_values(id, x);
    // Data and scale judged apart when no policy explains the block whole: a misplaced scale
    // must not make codes rounded beside the writer's own scale look misplaced, nor the reverse.
    const float gs = kit.global_scale(id.side);
    std::optional<RoundingPolicy> data_policy = explaining_policy(x, gs, written_scale, written), scale_policy = data_policy;
    if (!data_policy) {
      data_policy = data_explaining_policy(x, gs, written);
      scale_policy = scale_explaining_policy(x, gs, written_scale);
    }
    for (auto [r, n, p] : {std::tuple{&rd, int64_t(differ), data_policy}, {&rs, int64_t(scale_differs), scale_policy}}) {
      if (n == 0 || !p) continue;
      r->rounding += n;
      if (!r->policy || int(*p) > int(*r->policy)) r->policy = *p;
    }
    const auto holds = [&](const Location& at) { return trace.describe(kit, dumps, at); };
    for (int j = 0; j < 8 && !data_policy; ++j) {
      if (written[j] == kit.cache[size_t(data_at[size_t(j)].buffer)][size_t(data_at[size_t(j)].byte)]) continue;
      ElementPlace e{reg.data, {layer, cell->first, cell->second, id.head, id.group * 8 + j}, id.row, data_at[size_t(j)],
                     std::nullopt, holds(data_at[size_t(j)])};
      for (const Location& at : trace.data[size_t(b)])
        if (!(Location{at.buffer, at.byte + j} == data_at[size_t(j)])) e.found = Location{at.buffer, at.byte + j};
      ++rd.wrong;
      ++(e.found ? rd.found_elsewhere : rd.not_found);
      wrong[size_t(reg.data)].push_back(std::move(e));
    }
    if (scale_differs && !scale_policy) {
      ElementPlace e{reg.scale, {layer, cell->first, cell->second, id.head, id.group}, id.row, scale_at, std::nullopt,
                     holds(scale_at)};
      for (const Location& at : trace.scale_of(kit, id))
        if (!(at == scale_at)) e.found = at;
      ++rs.wrong;
      ++(e.found ? rs.found_elsewhere : rs.not_found);
      wrong[size_t(reg.scale)].push_back(std::move(e));
    }
  }
  for (Region r : kAllRegions) {
    RegionWriteReport& rr = rep.regions[size_t(r)];
    rr.verdict = rr.wrong > 0 ? RegionVerdict::kMisplaced : rr.rounding > 0 ? RegionVerdict::kRoundingOnly : RegionVerdict::kExact;
    const std::vector<ElementPlace>& w = wrong[size_t(r)];
    // Examples spread evenly over the wrong elements (which are in row order).
    const int64_t k = std::min<int64_t>(max_examples, int64_t(w.size()));
    for (int64_t i = 0; i < k; ++i) rr.examples.push_back(w[size_t(i * int64_t(w.size()) / k)]);
  }

  // The writer's map of each misplaced region, from where its stored rows were found.
  report_progress(progress, "inferring the writer's map", 0.7);
  Layout writer = l;
  bool inferred = false;
  for (Region r : kAllRegions) {
    RegionWriteReport& rr = rep.regions[size_t(r)];
    if (rr.verdict != RegionVerdict::kMisplaced) continue;
    const RegionFit fit = fit_region(trace.observations(kit, r), l, r, layer);
    rr.writer_map = fit;
    if (!fit.fitted) {
      rep.not_inferred.push_back(r);
      continue;
    }
    writer.regions[size_t(r)] = fit.map;
    inferred = true;
    for (ElementPlace& e : rr.examples) {
      if (e.found) continue;
      Coord c = e.coord;
      if (l.buffers[size_t(fit.map.buffer)].per_layer) c.layer = 0;
      const Location at{fit.map.buffer, region_offset(fit.map, c)};
      if (at.byte < 0 || at.byte >= int64_t(dumps[size_t(at.buffer)].size())) continue;
      e.writer_at = at;
      e.writer_holds = trace.describe(kit, dumps, at);
    }
  }
  if (inferred) {
    writer.name = l.name + "-as-written";
    writer.summary = "Where the writer under test put the kit's rows, inferred by nvfp4kv conformance check-write";
    rep.differences = map_differences(writer, l);
    writer.provenance = Provenance{"the writer under test", std::string("inferred by nvfp4kv ") + kVersion + " conformance check-write",
                                   "the one the dumped buffers came from", "writer (inferred)",
                                   {"a conformance kit for \"" + l.name + "\": the writer's buffers after storing its rows"},
                                   {}, ""};
    for (const MapDifference& m : rep.differences) writer.provenance.expressions.push_back(m.text("the layout"));
    if (writer.provenance.expressions.empty()) writer.provenance.expressions.push_back("the layout's own map");
    // A layout only when every misplaced region's map was inferred: one that keeps the claimed
    // map for a region the writer put elsewhere would describe neither.
    if (rep.not_inferred.empty()) {
      const CheckResult res = check(writer);
      rep.writer_layout_check = res.report.summary();
      rep.writer_layout = std::move(writer);
    }
  }

  // Bytes written outside the stored rows' cells.
  report_progress(progress, "listing bytes written outside the rows' cells", 0.9);
  std::set<std::pair<int64_t, int64_t>> stored;  // (page, position)
  for (int64_t row = 0; row < kit.rows; ++row)
    if (const auto c = kit.cell(row)) stored.insert(*c);
  for (size_t b = 0; b < dumps.size(); ++b)
    for (int64_t o = 0; o < int64_t(dumps[b].size()); ++o) {
      if (dumps[b][size_t(o)] == kPoison) continue;
      const Location at{int32_t(b), o};
      const auto e = owners.owner(at);
      if (e && e->coord.layer == layer && stored.count({e->coord.page, e->coord.token})) continue;
      const int64_t n = trace.at[b][size_t(o)];
      rep.misplaced_there += n >= 0 && kit.cell(kit.block(n / 9).row).has_value();
      if (!e) {
        ++rep.outside_bytes;
        add_touched(rep.outside_cells, at, "", trace.describe(kit, dumps, at));
      } else if (e->coord.layer != layer || !stored.count({e->coord.page, e->coord.token})) {
        ++rep.unstored_bytes;
        add_touched(rep.unstored_cells, at, describe_element(e->region, e->coord), trace.describe(kit, dumps, at));
      }
    }
  for (int64_t row = 0; row < kit.rows; ++row) {
    if (kit.cell(row)) continue;
    bool found = false;
    for (int64_t h = 0; h < d.heads && !found; ++h)
      for (Side s : {Side::kK, Side::kV})
        for (int64_t g = 0; g < sd && !found; ++g) found = !trace.data[size_t(kit.block_index({row, h, s, g}))].empty();
    if (found) rep.padding_rows_written.push_back(row);
  }
  report_progress(progress, "done", 1.0);
  return rep;
}

}  // namespace nvfp4kv::conformance
