// The reports as text (what the CLI prints) and as JSON (docs/cli-json.md).
#include <nlohmann/json.hpp>
#include <sstream>

#include "nvfp4kv/conformance/check.hpp"

namespace nvfp4kv::conformance {
namespace {

using Json = nlohmann::json;

using Names = std::vector<std::string>;

std::string where(const Names& buffers, const Location& at) {
  return "byte " + std::to_string(at.byte) + " of \"" + buffers.at(size_t(at.buffer)) + "\"";
}

Json location_json(const Names& buffers, const std::optional<Location>& at) {
  if (!at) return nullptr;
  return {{"buffer", buffers.at(size_t(at->buffer))}, {"byte", at->byte}};
}

Json mode_json(const Mode& m) {
  if (m.is_plain()) return m.stride;
  return {{"inner", m.inner}, {"stride", {m.inner_stride, m.stride}}};
}

Json fit_json(const Names& buffers, const RegionFit& f) {
  Json j = {{"fitted", f.fitted}, {"observations", f.observations}, {"explained", f.explained}, {"unobserved", f.unobserved}};
  if (f.fitted)
    j["map"] = {{"buffer", buffers.at(size_t(f.map.buffer))}, {"offset", f.map.offset}, {"layer", f.map.layer},
                {"page", f.map.page}, {"head", f.map.head}, {"token", mode_json(f.map.token)}, {"column", mode_json(f.map.column)}};
  return j;
}

Json coord_json(Region r, const Coord& c) {
  return {{"element", describe_element(r, c)}, {"region", region_name(r)}, {"layer", c.layer}, {"page", c.page},
          {"token", c.token}, {"head", c.head}, {"column", c.column}};
}

Json differences_json(const std::vector<MapDifference>& diffs, const char* a_key) {
  Json out = Json::array();
  for (const MapDifference& m : diffs)
    out.push_back({{"region", region_name(m.region)}, {"field", m.field}, {a_key, m.a}, {"layout", m.b}, {"note", m.note},
                   {"text", m.text("the layout")}});
  return out;
}

Json region_names(const std::vector<Region>& regions) {
  Json out = Json::array();
  for (Region r : regions) out.push_back(region_name(r));
  return out;
}

// Why no layout of the writer's or reader's map is given though a region is wrong.
std::string not_inferred_text(const std::vector<Region>& regions, const std::string& who) {
  if (regions.empty()) return "";
  std::string names;
  for (Region r : regions) names += (names.empty() ? "" : ", ") + std::string(region_name(r));
  return "  no layout of the " + who + "'s map: the map of " + names + " could not be inferred\n";
}

void print_fit(std::ostream& s, const std::string& who, const std::array<std::optional<RegionFit>, kRegionCount>& fits,
               const std::vector<MapDifference>& diffs) {
  bool any = false;
  for (const auto& f : fits) any = any || f.has_value();
  if (!any) return;
  s << "  the " << who << "'s map, inferred from where its elements were found:\n";
  for (Region r : kAllRegions) {
    const auto& f = fits[size_t(r)];
    if (!f) continue;
    s << "    " << region_name(r) << ": ";
    if (!f->fitted) s << "no element was found anywhere, so nothing is known of its map\n";
    else
      s << f->explained << " of " << f->observations << " located elements fit one map"
        << (f->unobserved.empty() ? "" : "; not determined by them: ") << [&] {
             std::string u;
             for (const std::string& x : f->unobserved) u += (u.empty() ? "" : ", ") + x;
             return u;
           }() << "\n";
  }
  for (const MapDifference& m : diffs) s << "    " << m.text("the layout") << "\n";
}

}  // namespace

std::string WriteReport::text() const {
  std::ostringstream s;
  s << "check-write against \"" << layout << "\":\n";
  s << "  region      bytes      exact   rounding      wrong  (found elsewhere / not found)  verdict\n";
  for (const RegionWriteReport& r : regions) {
    char line[200];
    std::snprintf(line, sizeof line, "  %-8s %8lld %10lld %10lld %10lld  (%lld / %lld)", region_name(r.region),
                  (long long)r.bytes, (long long)r.exact, (long long)r.rounding, (long long)r.wrong,
                  (long long)r.found_elsewhere, (long long)r.not_found);
    std::string v = r.verdict == RegionVerdict::kExact ? "exact"
                    : r.verdict == RegionVerdict::kRoundingOnly
                        ? std::string("rounding-only (") + policy_name(*r.policy) + ")"
                        : "MISPLACED";
    s << line << std::string(std::max<int>(1, 80 - int(std::string(line).size())), ' ') << v << "\n";
  }
  for (const RegionWriteReport& r : regions) {
    if (r.examples.empty()) continue;
    s << "  " << region_name(r.region) << ": " << r.wrong << " bytes not where the layout says; for example\n";
    for (const ElementPlace& e : r.examples) {
      s << "    " << describe_element(e.region, e.coord) << " (row " << e.row << "): the layout's " << where(buffers, e.expected);
      s << " holds " << e.expected_holds << "; "
        << (e.found ? "found at " + where(buffers, *e.found) : std::string("not found anywhere"));
      if (e.writer_at) s << " (the writer's map puts it at " << where(buffers, *e.writer_at) << ", which holds " << e.writer_holds << ")";
      s << "\n";
    }
  }
  std::array<std::optional<RegionFit>, kRegionCount> fits;
  for (const RegionWriteReport& r : regions) fits[size_t(r.region)] = r.writer_map;
  print_fit(s, "writer", fits, differences);
  if (writer_layout) s << "  the writer's map as a layout: " << writer_layout_check << "\n";
  s << not_inferred_text(not_inferred, "writer");
  const auto runs = [&](const char* what, int64_t bytes, const std::vector<TouchedRun>& list) {
    if (bytes == 0) return;
    s << "  " << bytes << " bytes written " << what << ":\n";
    for (size_t i = 0; i < list.size() && i < 8; ++i) {
      const TouchedRun& t = list[i];
      s << "    " << t.bytes << " from " << where(buffers, t.first);
      if (!t.owner.empty()) s << " (" << t.owner << (t.bytes > 1 ? ", ..." : "") << ")";
      s << ": " << t.holds << (t.bytes > 1 ? ", ..." : "") << "\n";
    }
    if (list.size() > 8) s << "    ... and " << list.size() - 8 << " more runs\n";
  };
  if (misplaced_there > 0) {
    const int64_t all = outside_bytes + unstored_bytes;
    if (misplaced_there == all) s << "  all " << all << " bytes below hold stored rows' elements (misplaced, above)\n";
    else
      s << "  of the " << all << " bytes below, " << misplaced_there
        << " hold stored rows' elements (misplaced, above); the others nothing the kit's rows hold\n";
  }
  runs("outside every cell (bytes no element of the layout owns)", outside_bytes, outside_cells);
  runs("into cells no stored row owns (other pages, positions or layers)", unstored_bytes, unstored_cells);
  if (!padding_rows_written.empty()) {
    s << "  padding rows (slot -1) written:";
    for (size_t i = 0; i < padding_rows_written.size() && i < 8; ++i) s << " " << padding_rows_written[i];
    s << "\n";
  }
  std::string bad;
  for (const RegionWriteReport& r : regions)
    if (r.verdict == RegionVerdict::kMisplaced) bad += std::string(bad.empty() ? "" : ", ") + region_name(r.region);
  if (ok()) {
    bool rounding = false;
    for (const RegionWriteReport& r : regions) rounding = rounding || r.verdict == RegionVerdict::kRoundingOnly;
    s << "check-write: PASS (" << (rounding ? "every difference is rounding, explained by a named policy" : "every byte exact")
      << ")";
  } else {
    s << "check-write: FAIL (" << (bad.empty() ? "" : bad + " misplaced")
      << (outside_bytes + unstored_bytes > misplaced_there
              ? std::string(bad.empty() ? "" : "; ") + std::to_string(outside_bytes + unstored_bytes - misplaced_there) +
                    " bytes written outside the rows' cells"
              : "")
      << (!padding_rows_written.empty() ? "; padding rows written" : "") << ")";
  }
  return s.str();
}

std::string WriteReport::json() const {
  const Names& l = buffers;
  Json regs = Json::array();
  for (const RegionWriteReport& r : regions) {
    Json ex = Json::array();
    for (const ElementPlace& e : r.examples) {
      Json j = coord_json(e.region, e.coord);
      j["row"] = e.row;
      j["expected"] = location_json(l, e.expected);
      j["found"] = location_json(l, e.found);
      j["expected_holds"] = e.expected_holds;
      j["writer_at"] = location_json(l, e.writer_at);
      j["writer_holds"] = e.writer_holds;
      ex.push_back(j);
    }
    regs.push_back({{"region", region_name(r.region)},
                    {"verdict", verdict_name(r.verdict)},
                    {"bytes", r.bytes},
                    {"exact", r.exact},
                    {"rounding", r.rounding},
                    {"wrong", r.wrong},
                    {"found_elsewhere", r.found_elsewhere},
                    {"not_found", r.not_found},
                    {"policy", r.policy ? Json(policy_name(*r.policy)) : Json(nullptr)},
                    {"examples", ex},
                    {"writer_map", r.writer_map ? fit_json(l, *r.writer_map) : Json(nullptr)}});
  }
  const auto runs = [&](int64_t bytes, const std::vector<TouchedRun>& list) {
    Json j = Json::array();
    for (const TouchedRun& t : list)
      j.push_back({{"buffer", l.at(size_t(t.first.buffer))}, {"byte", t.first.byte}, {"bytes", t.bytes},
                   {"owner", t.owner}, {"holds", t.holds}});
    return Json{{"bytes", bytes}, {"runs", j}};
  };
  Json j = {{"layout", layout},
            {"ok", ok()},
            {"regions", regs},
            {"outside_cells", runs(outside_bytes, outside_cells)},
            {"unstored_cells", runs(unstored_bytes, unstored_cells)},
            {"misplaced_there", misplaced_there},
            {"padding_rows_written", padding_rows_written},
            {"differences", differences_json(differences, "writer")},
            {"not_inferred", region_names(not_inferred)},
            {"writer_layout", writer_layout ? Json::parse(to_json(*writer_layout)) : Json(nullptr)},
            {"writer_layout_check", writer_layout ? Json(writer_layout_check) : Json(nullptr)}};
  return j.dump();
}

namespace {

Json block_json(const Names& l, const BlockRead& b) {
  return {{"side", b.side == Side::kK ? "K" : "V"},
          {"read_row", b.read_row},
          {"row", b.row},
          {"head", b.head},
          {"group", b.group},
          {"page", b.cell.page},
          {"token", b.cell.token},
          {"what", b.what},
          {"data_from", location_json(l, b.data_from)},
          {"data_owner", b.data_owner},
          {"scale_code", b.scale_code ? Json(*b.scale_code) : Json(nullptr)},
          {"scale_from", location_json(l, b.scale_from)},
          {"scale_owner", b.scale_owner},
          {"aliased", b.aliased}};
}

std::string block_text(const Names& l, const BlockRead& b) {
  std::ostringstream s;
  s << (b.side == Side::kK ? "K" : "V") << " row " << b.read_row << " (page " << b.cell.page << ", token " << b.cell.token
    << "), head " << b.head << ", group " << b.group << ": " << b.what;
  if (b.data_from) s << "; codes from " << where(l, *b.data_from) << " = " << b.data_owner;
  if (b.scale_code) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", *b.scale_code);
    s << "; scale " << hex << " (" << e4m3_decode(*b.scale_code) << ")";
    if (b.scale_from) s << " from " << where(l, *b.scale_from) << " = " << b.scale_owner;
  }
  if (b.aliased) s << "  [aliased data/scale bytes]";
  return s.str();
}

}  // namespace

std::string ReadReport::text() const {
  std::ostringstream s;
  const Names& l = buffers;
  s << "check-read (" << mode << ") against \"" << layout << "\":\n";
  if (mode == "rows") {
    for (Side side : {Side::kK, Side::kV}) {
      const SideReadReport& r = sides[size_t(side)];
      s << "  " << (side == Side::kK ? "K" : "V") << ": " << r.correct << " of " << r.elements << " elements read right; "
        << r.blocks_misread << " of " << r.blocks << " blocks misread";
      if (r.blocks_misread)
        s << " (wrong data bytes " << r.wrong_data << ", wrong scale " << r.wrong_scale << ", aliased data/scale "
          << r.aliased << ", unidentified " << r.unidentified << ")";
      s << "\n";
    }
    if (!examples.empty()) s << "  misread blocks, for example:\n";
    for (const BlockRead& b : examples) s << "    " << block_text(l, b) << "\n";
  } else {
    s << "  " << probe_correct << " of " << probe_rows << " probe outputs right; " << wrong_token
      << " attended to another token (K misread), " << v_misread << " read V from the wrong bytes, " << non_finite
      << " non-finite, " << unidentified << " unidentified";
    if (not_isolating) s << "; " << not_isolating << " probes do not single out one token (checked as a whole)";
    s << "\n";
    for (const ProbeRead& p : probe_examples) {
      s << "    probe " << p.probe << " (sequence " << p.sequence << ", position " << p.position << "), q head " << p.q_head
        << ": " << p.what << " (relative L2 error " << p.rel_l2 << ")\n";
      if (p.v_block && p.v_block->data_from) s << "      " << block_text(l, *p.v_block) << "\n";
    }
  }
  print_fit(s, "reader", reader_maps, differences);
  s << not_inferred_text(not_inferred, "reader");
  s << "check-read: " << (ok() ? "PASS" : "FAIL");
  return s.str();
}

std::string ReadReport::json() const {
  const Names& l = buffers;
  Json ex = Json::array();
  for (const BlockRead& b : examples) ex.push_back(block_json(l, b));
  Json sides_j = Json::object();
  for (Side side : {Side::kK, Side::kV}) {
    const SideReadReport& r = sides[size_t(side)];
    sides_j[side == Side::kK ? "K" : "V"] = {{"elements", r.elements},         {"correct", r.correct},
                                             {"blocks", r.blocks},             {"blocks_misread", r.blocks_misread},
                                             {"wrong_data", r.wrong_data},     {"wrong_scale", r.wrong_scale},
                                             {"aliased", r.aliased},           {"unidentified", r.unidentified}};
  }
  Json probes = Json::array();
  for (const ProbeRead& p : probe_examples)
    probes.push_back({{"probe", p.probe},
                      {"q_head", p.q_head},
                      {"sequence", p.sequence},
                      {"position", p.position},
                      {"what", p.what},
                      {"attended", p.attended >= 0 ? Json(p.attended) : Json(nullptr)},
                      {"rel_l2", p.rel_l2},
                      {"v_block", p.v_block ? block_json(l, *p.v_block) : Json(nullptr)}});
  Json maps = Json::object();
  for (Region r : kAllRegions)
    if (reader_maps[size_t(r)]) maps[region_name(r)] = fit_json(l, *reader_maps[size_t(r)]);
  Json j = {{"layout", layout},
            {"mode", mode},
            {"ok", ok()},
            {"sides", sides_j},
            {"examples", ex},
            {"attention",
             {{"probe_rows", probe_rows},
              {"correct", probe_correct},
              {"wrong_token", wrong_token},
              {"v_misread", v_misread},
              {"non_finite", non_finite},
              {"unidentified", unidentified},
              {"not_isolating", not_isolating},
              {"examples", probes}}},
            {"reader_maps", maps},
            {"differences", differences_json(differences, "reader")},
            {"not_inferred", region_names(not_inferred)},
            {"reader_layout", reader_layout ? Json::parse(to_json(*reader_layout)) : Json(nullptr)}};
  return j.dump();
}

}  // namespace nvfp4kv::conformance
