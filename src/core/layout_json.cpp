#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "nvfp4kv/core/expr.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/files.hpp"
#include "nvfp4kv/core/names.hpp"
#include "strict_json.hpp"

namespace nvfp4kv {

namespace {

using json = nlohmann::json;

// Bounds on layout text: a layout is a few KiB and nests 5 levels deep.
constexpr size_t kMaxTextBytes = size_t(1) << 20;
constexpr size_t kMaxDepth = 32;
constexpr size_t kMaxNameBytes = 128;

using detail::json_excerpt;
using detail::require_keys;

json parse_strict(std::string_view text) {
  try {
    return detail::parse_json_strict(text, {"layout", kMaxTextBytes, kMaxDepth, true});
  } catch (const ArgumentError& e) {
    throw LayoutError(e.what());
  }
}

// A name (of the layout, a buffer, a let): one short line.
std::string name_value(const json& v, const std::string& where) {
  if (!v.is_string()) throw LayoutError(where + ": expected a name (a string), got " + json_excerpt(v));
  std::string name = v.get<std::string>();
  bool control = false;
  for (const char c : name) control |= static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
  if (name.empty() || name.size() > kMaxNameBytes || control)
    throw LayoutError(where + ": " + quote_text(name) + " is not a name: 1 to " + std::to_string(kMaxNameBytes) +
                      " bytes without control characters");
  return name;
}

std::string expr_text(const json& v, const std::string& where) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_string()) return v.get<std::string>();
  throw LayoutError(where + ": expected an integer or an expression string, got " + json_excerpt(v));
}


// A token or column mode: an expression (a plain stride) or
// {"inner": E, "stride": [inner stride, stride]}.
LayoutSpec::ModeSpec mode_spec(const json& v, const std::string& where) {
  LayoutSpec::ModeSpec m;
  if (!v.is_object()) {
    m.stride = expr_text(v, where);
    return m;
  }
  require_keys(v, {"inner", "stride"}, where);
  if (!v.contains("inner") || !v.contains("stride") || !v["stride"].is_array() || v["stride"].size() != 2)
    throw LayoutError(where + ": a nested mode is {\"inner\": E, \"stride\": [inner stride, stride]}, got " + json_excerpt(v));
  m.inner = expr_text(v["inner"], where + ".inner");
  m.inner_stride = expr_text(v["stride"][0], where + ".stride[0]");
  m.stride = expr_text(v["stride"][1], where + ".stride[1]");
  return m;
}

// "codes": where a data byte keeps its two E2M1 codes, by name ("standard",
// "high-first", "fp16-split") or as {"even": [m, e0, e1, s], "odd": [m, e0, e1, s]}, the
// byte's bit holding each code bit of element 2j (even) and 2j + 1 (odd).
CodeOrder code_order_of(const json& v) {
  if (v.is_string()) {
    const std::string name = v.get<std::string>();
    if (const std::optional<CodeOrder> o = code_order_named(name)) return *o;
    throw LayoutError("codes: " + quote_text(name) +
                      " is not a code order; give \"standard\", \"high-first\", \"fp16-split\" or "
                      "{\"even\": [m, e0, e1, s], \"odd\": [m, e0, e1, s]} (bit positions)");
  }
  if (!v.is_object()) throw LayoutError("codes: expected a name or an object, got " + json_excerpt(v));
  require_keys(v, {"even", "odd"}, "codes");
  CodeOrder o;
  for (int e = 0; e < 2; ++e) {
    const char* key = e ? "odd" : "even";
    if (!v.contains(key) || !v[key].is_array() || v[key].size() != 4)
      throw LayoutError(std::string("codes.") + key + ": expected 4 bit positions [m, e0, e1, s], got " +
                        (v.contains(key) ? json_excerpt(v[key]) : std::string("nothing")));
    for (int c = 0; c < 4; ++c) {
      const json& b = v[key][size_t(c)];
      if (!b.is_number_integer() || b.get<int64_t>() < 0 || b.get<int64_t>() > 7)
        throw LayoutError(std::string("codes.") + key + "[" + std::to_string(c) + "]: expected a bit position 0 to 7, got " +
                          json_excerpt(b));
      o.bit[4 * e + c] = uint8_t(b.get<int64_t>());
    }
  }
  if (std::string p = code_order_problem(o); !p.empty()) throw LayoutError(p);
  return o;
}

// "provenance": where the layout comes from (docs/layouts.md). engine, version,
// gpu_path, sources and expressions are required; role and notes are optional.
Provenance provenance_of(const json& v) {
  require_keys(v, {"engine", "version", "gpu_path", "role", "sources", "expressions", "notes"}, "provenance");
  const auto text = [&](const char* key, bool required) -> std::string {
    if (!v.contains(key)) {
      if (required) throw LayoutError(std::string("provenance: \"") + key + "\" (text) is required");
      return "";
    }
    if (!v[key].is_string() || v[key].get<std::string>().empty())
      throw LayoutError(std::string("provenance.") + key + ": expected non-empty text, got " + json_excerpt(v[key]));
    return v[key].get<std::string>();
  };
  const auto lines = [&](const char* key) {
    if (!v.contains(key) || !v[key].is_array() || v[key].empty())
      throw LayoutError(std::string("provenance: \"") + key + "\" (a non-empty array of text) is required");
    std::vector<std::string> out;
    for (const json& e : v[key]) {
      if (!e.is_string() || e.get<std::string>().empty())
        throw LayoutError(std::string("provenance.") + key + ": expected non-empty text, got " + json_excerpt(e));
      out.push_back(e.get<std::string>());
    }
    return out;
  };
  return {text("engine", true), text("version", true), text("gpu_path", true), text("role", false),
          lines("sources"),     lines("expressions"),  text("notes", false)};
}

std::optional<int64_t> dim_value(const json& dims, const char* key) {
  if (!dims.contains(key)) return std::nullopt;
  const json& v = dims[key];
  if (!v.is_number_integer()) throw LayoutError(std::string("dims.") + key + ": expected an integer, got " + json_excerpt(v));
  return v.get<int64_t>();
}

}  // namespace

LayoutSpec parse_layout_spec(std::string_view text) {
  const json doc = parse_strict(text);
  require_keys(doc, {"name", "summary", "source", "provenance", "dims", "elements", "let", "buffers", "regions", "codes"},
               "layout");
  LayoutSpec spec;
  if (!doc.contains("name")) throw LayoutError("layout: \"name\" (a string) is required");
  spec.name = name_value(doc["name"], "layout.name");
  if (doc.contains("summary")) {
    if (!doc["summary"].is_string()) throw LayoutError("layout: \"summary\" must be a string");
    spec.summary = doc["summary"].get<std::string>();
  }
  if (doc.contains("provenance")) spec.provenance = provenance_of(doc["provenance"]);
  if (doc.contains("codes")) spec.codes = code_order_of(doc["codes"]);
  if (doc.contains("dims")) {
    const json& d = doc["dims"];
    require_keys(d, {"layers", "pages", "tokens_per_page", "heads", "head_dim"}, "dims");
    spec.defaults = {dim_value(d, "layers"), dim_value(d, "pages"), dim_value(d, "tokens_per_page"),
                     dim_value(d, "heads"), dim_value(d, "head_dim")};
  }
  if (doc.contains("elements")) {
    const json& e = doc["elements"];
    if (!e.is_object()) throw LayoutError("elements: expected {\"k\": ..., \"v\": ...}, got " + json_excerpt(e));
    require_keys(e, {"k", "v"}, "elements");
    for (auto [key, slot] : {std::pair{"k", &spec.defaults.k_element}, {"v", &spec.defaults.v_element}}) {
      if (!e.contains(key)) continue;
      const json& v = e[key];
      std::optional<ElementFormat> f;
      if (v.is_string()) f = element_format_named(v.get<std::string>());
      if (!f) throw LayoutError(std::string("elements.") + key + ": expected \"nvfp4\" or \"fp8_e4m3\", got " + json_excerpt(v));
      *slot = f;
    }
  }
  if (doc.contains("let")) {
    const json& lets = doc["let"];
    if (!lets.is_array()) throw LayoutError("let: expected an array of [name, expression] pairs");
    for (const json& kv : lets) {
      if (!kv.is_array() || kv.size() != 2)
        throw LayoutError("let: each entry is [\"NAME\", expression], got " + json_excerpt(kv));
      const std::string name = name_value(kv[0], "let");
      const bool identifier = !std::isdigit(static_cast<unsigned char>(name[0])) &&
                              std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
      if (!identifier)
        throw LayoutError("let " + quote_text(name) + ": a name is letters, digits and _, not starting with a digit");
      spec.lets.emplace_back(name, expr_text(kv[1], "let " + name));
    }
  }
  if (!doc.contains("buffers") || !doc["buffers"].is_array() || doc["buffers"].empty())
    throw LayoutError("layout: \"buffers\" (a non-empty array) is required");
  if (doc["buffers"].size() > size_t(kMaxBuffers))
    throw LayoutError("buffers: " + std::to_string(doc["buffers"].size()) + " buffers; a layout has at most " +
                      std::to_string(kMaxBuffers) + " (a cache hands kernels " + std::to_string(kMaxBuffers) + " base pointers)");
  for (const json& b : doc["buffers"]) {
    require_keys(b, {"name", "bytes", "per_layer"}, "buffer");
    LayoutSpec::BufferSpec bs;
    if (!b.contains("name")) throw LayoutError("buffer: \"name\" (a string) is required");
    bs.name = name_value(b["name"], "buffer");
    for (const auto& other : spec.buffers)
      if (other.name == bs.name) throw LayoutError("buffer " + quote_text(bs.name) + " is declared twice");
    if (b.contains("bytes")) bs.bytes = expr_text(b["bytes"], "buffer " + quote_text(bs.name) + " bytes");
    if (b.contains("per_layer")) {
      if (!b["per_layer"].is_boolean()) throw LayoutError("buffer " + quote_text(bs.name) + ": per_layer must be true or false");
      bs.per_layer = b["per_layer"].get<bool>();
    } else {
      bs.per_layer = true;
    }
    spec.buffers.push_back(bs);
  }
  if (!doc.contains("regions")) throw LayoutError("layout: \"regions\" is required");
  const json& regions = doc["regions"];
  require_keys(regions, {"k_data", "k_scale", "v_data", "v_scale"}, "regions");
  for (Region r : kAllRegions) {
    const std::string rn = region_name(r);
    if (!regions.contains(rn)) {
      // Whether the side holds FP8 (no block scales) is known once the elements are bound.
      if (is_scale(r)) continue;
      throw LayoutError("regions: \"" + rn + "\" is missing; a layout places k_data and v_data, and the scale "
                        "region of every side that holds NVFP4");
    }
    const json& j = regions[rn];
    require_keys(j, {"buffer", "offset", "layer", "page", "token", "head", "column"}, rn);
    LayoutSpec::RegionSpec& rs = spec.regions[size_t(r)];
    rs.given = true;
    if (j.contains("buffer")) {
      rs.buffer = name_value(j["buffer"], rn + ".buffer");
    } else if (spec.buffers.size() == 1) {
      rs.buffer = spec.buffers[0].name;
    } else {
      throw LayoutError(rn + ": \"buffer\" is required when the layout has several buffers");
    }
    for (auto key : {"page", "token", "head"})
      if (!j.contains(key)) throw LayoutError(rn + ": the \"" + key + "\" stride is required");
    rs.page = expr_text(j["page"], rn + ".page");
    rs.head = expr_text(j["head"], rn + ".head");
    rs.token = mode_spec(j["token"], rn + ".token");
    rs.offset = j.contains("offset") ? expr_text(j["offset"], rn + ".offset") : "0";
    rs.column = j.contains("column") ? mode_spec(j["column"], rn + ".column") : LayoutSpec::ModeSpec{"1", "0", "1"};
    if (j.contains("layer")) rs.layer = expr_text(j["layer"], rn + ".layer");
  }
  return spec;
}

Layout instantiate(const LayoutSpec& spec, const DimsOverride& over) {
  Layout l;
  l.name = spec.name;
  l.summary = spec.summary;
  l.provenance = spec.provenance;
  l.codes = spec.codes;
  // A size the file fixes is part of the description: a different one from the
  // caller is a contradiction, never a silent override.
  const auto pick = [&](std::optional<int64_t> o, std::optional<int64_t> d, const char* what, const char* flag) {
    if (o && d && *o != *d)
      throw LayoutError("layout \"" + spec.name + "\" fixes " + what + " " + std::to_string(*d) + "; " + flag + " " +
                        std::to_string(*o) + " contradicts it (leave " + flag + " out or give " + std::to_string(*d) + ")");
    return o ? o : d;
  };
  const std::optional<int64_t> L = pick(over.layers, spec.defaults.layers, "layers", "--layers").value_or(1);
  const std::optional<int64_t> P = pick(over.pages, spec.defaults.pages, "pages", "--pages");
  const std::optional<int64_t> N = pick(over.tokens_per_page, spec.defaults.tokens_per_page, "tokens per page", "--tokens-per-page");
  const std::optional<int64_t> H = pick(over.heads, spec.defaults.heads, "heads", "--heads");
  const std::optional<int64_t> D = pick(over.head_dim, spec.defaults.head_dim, "head dim", "--head-dim");
  std::string open;
  for (auto [v, flag] : {std::pair{P, "--pages"}, {N, "--tokens-per-page"}, {H, "--heads"}, {D, "--head-dim"}})
    if (!v) open += std::string(open.empty() ? "" : ", ") + flag;
  if (!open.empty()) throw LayoutError("layout " + quote_text(spec.name) + " leaves sizes open: give " + open);
  const auto pick_element = [&](std::optional<ElementFormat> o, std::optional<ElementFormat> d, const char* side) {
    if (o && d && *o != *d)
      throw LayoutError("layout \"" + spec.name + "\" fixes " + side + " elements as " + element_format_name(*d) + "; " +
                        element_format_name(*o) + " contradicts it");
    return o ? *o : d.value_or(ElementFormat::kNvfp4);
  };
  l.dims = {*L, *P, *N, *H, *D, pick_element(over.k_element, spec.defaults.k_element, "K"),
            pick_element(over.v_element, spec.defaults.v_element, "V")};
  if (const std::string p = dims_problem(l.dims); !p.empty()) throw LayoutError(p);
  for (Region r : kAllRegions)
    if (l.dims.holds(r) && !spec.regions[size_t(r)].given)
      throw LayoutError(std::string("regions: \"") + region_name(r) + "\" is missing; " +
                        (side_of(r) == Side::kK ? "K" : "V") + " holds nvfp4 elements, whose block scales it places");
  // Row bytes per region: kd ks vd vs (NVFP4: D/2 and D/16; FP8: D and 0).
  std::map<std::string, int64_t, std::less<>> symbols = {
      {"L", *L}, {"P", *P}, {"N", *N}, {"H", *H}, {"D", *D},
      {"dd", *D / 2}, {"sd", *D / 16}, {"F", *D / 2 + *D / 16},
      {"kd", l.dims.columns(Region::kKData)}, {"ks", l.dims.columns(Region::kKScale)},
      {"vd", l.dims.columns(Region::kVData)}, {"vs", l.dims.columns(Region::kVScale)}};
  const SymbolLookup lookup = [&](std::string_view name) -> std::optional<int64_t> {
    auto it = symbols.find(name);
    if (it == symbols.end()) return std::nullopt;
    return it->second;
  };
  const auto eval = [&](const std::string& text, const std::string& where) {
    try {
      return evaluate_expression(text, lookup);
    } catch (const LayoutError& e) {
      throw LayoutError(where + ": " + e.what());
    }
  };
  for (const auto& [name, text] : spec.lets) {
    if (symbols.count(name)) throw LayoutError("let " + quote_text(name) + ": the name is already defined");
    symbols[name] = eval(text, "let " + quote_text(name));
  }
  for (const auto& bs : spec.buffers) l.buffers.push_back({bs.name, 0, bs.per_layer});
  for (Region r : kAllRegions) {
    const auto& rs = spec.regions[size_t(r)];
    const std::string rn = region_name(r);
    RegionMap& m = l.regions[size_t(r)];
    // A region that holds nothing (an FP8 side's scales) is left at its default: it places no byte.
    if (!l.dims.holds(r)) continue;
    m.buffer = -1;
    for (size_t i = 0; i < spec.buffers.size(); ++i)
      if (spec.buffers[i].name == rs.buffer) m.buffer = int32_t(i);
    if (m.buffer < 0) throw LayoutError(rn + " names buffer " + quote_text(rs.buffer) + ", which the layout does not declare");
    const bool per_layer = spec.buffers[size_t(m.buffer)].per_layer;
    if (rs.layer.empty() && !per_layer)
      throw LayoutError(rn + ": buffer " + quote_text(rs.buffer) + " holds all layers (per_layer false), so a \"layer\" stride is required");
    m.offset = eval(rs.offset, rn + ".offset");
    m.layer = rs.layer.empty() ? 0 : eval(rs.layer, rn + ".layer");
    m.page = eval(rs.page, rn + ".page");
    m.head = eval(rs.head, rn + ".head");
    const auto mode = [&](const LayoutSpec::ModeSpec& ms, const std::string& where) {
      const Mode md(eval(ms.inner, where + ".inner"), eval(ms.inner_stride, where + ".stride[0]"),
                    eval(ms.stride, where + (ms.inner == "1" ? "" : ".stride[1]")));
      if (md.inner < 1)
        throw LayoutError(where + ": inner extent " + ms.inner + " = " + std::to_string(md.inner) + " at head dim " +
                          std::to_string(*D) + " and " + std::to_string(*N) + " tokens per page; it must be >= 1");
      return md;
    };
    m.token = mode(rs.token, rn + ".token");
    m.column = mode(rs.column, rn + ".column");
  }
  for (size_t i = 0; i < spec.buffers.size(); ++i)
    if (spec.buffers[i].bytes) l.buffers[i].bytes = eval(*spec.buffers[i].bytes, "buffer " + quote_text(spec.buffers[i].name) + " bytes");
  require_evaluable(l);  // buffers without a size still at 0: the offsets below are computable
  for (size_t i = 0; i < spec.buffers.size(); ++i) {
    if (spec.buffers[i].bytes) continue;
    // No size given: exactly what the regions in it reach (strides >= 0 assumed; check() verifies).
    int64_t need = 0;
    for (Region r : kAllRegions) {
      const RegionMap& m = l.regions[size_t(r)];
      if (m.buffer != int32_t(i) || !l.dims.holds(r)) continue;
      const Coord c{l.layers_in(l.buffers[i]) - 1, l.dims.pages - 1, m.token.argmax(l.dims.tokens_per_page),
                    l.dims.heads - 1, m.column.argmax(l.dims.columns(r))};
      need = std::max(need, l.offset(r, c) + 1);
    }
    l.buffers[i].bytes = need;
  }
  require_evaluable(l);  // and the sizes just worked out, with their total
  return with_plain_modes(std::move(l));
}

std::string to_json(const Layout& l) {
  json doc;
  doc["name"] = l.name;
  if (!l.summary.empty()) doc["summary"] = l.summary;
  if (const Provenance& p = l.provenance; !p.empty()) {
    json& j = doc["provenance"] = {{"engine", p.engine}, {"version", p.version}, {"gpu_path", p.gpu_path},
                                   {"sources", p.sources}, {"expressions", p.expressions}};
    if (!p.role.empty()) j["role"] = p.role;
    if (!p.notes.empty()) j["notes"] = p.notes;
  }
  doc["dims"] = {{"layers", l.dims.layers}, {"pages", l.dims.pages}, {"tokens_per_page", l.dims.tokens_per_page},
                 {"heads", l.dims.heads}, {"head_dim", l.dims.head_dim}};
  if (l.dims.fp8(Side::kK) || l.dims.fp8(Side::kV))
    doc["elements"] = {{"k", element_format_name(l.dims.k_element)}, {"v", element_format_name(l.dims.v_element)}};
  if (!l.codes.is_standard()) {
    if (std::string name = code_order_name(l.codes); !name.empty()) {
      doc["codes"] = name;
    } else {
      const auto bits = [&](int e) { return json::array({l.codes.bit[4 * e], l.codes.bit[4 * e + 1], l.codes.bit[4 * e + 2], l.codes.bit[4 * e + 3]}); };
      doc["codes"] = {{"even", bits(0)}, {"odd", bits(1)}};
    }
  }
  doc["buffers"] = json::array();
  for (const Buffer& b : l.buffers) doc["buffers"].push_back({{"name", b.name}, {"bytes", b.bytes}, {"per_layer", b.per_layer}});
  for (Region r : kAllRegions) {
    if (!l.dims.holds(r)) continue;  // an FP8 side's scale region: nothing to place
    const RegionMap& m = l.region(r);
    const auto mode = [](const Mode& md) -> json {
      if (md.is_plain()) return md.stride;
      return {{"inner", md.inner}, {"stride", {md.inner_stride, md.stride}}};
    };
    json j = {{"buffer", l.buffers.at(size_t(m.buffer)).name}, {"offset", m.offset}, {"page", m.page},
              {"token", mode(m.token)}, {"head", m.head}, {"column", mode(m.column)}};
    if (!l.buffers.at(size_t(m.buffer)).per_layer || m.layer != 0) j["layer"] = m.layer;  // what was read, printed
    doc["regions"][region_name(r)] = j;
  }
  return doc.dump(2);
}

std::vector<std::string> assumed_sizes(const LayoutSpec& spec, const DimsOverride& dims) {
  if (dims.layers || spec.defaults.layers) return {};
  return {"layers 1"};
}

LayoutSpec load_spec(std::string_view name_or_path) {
  if (is_preset_name(name_or_path)) return preset_spec(name_or_path);
  std::error_code ec;
  if (!std::filesystem::exists(std::string(name_or_path), ec)) {
    std::string names;
    std::vector<std::string> all;
    for (const PresetInfo& p : list_presets()) {
      names += " " + p.name;
      all.push_back(p.name);
      all.insert(all.end(), p.former_names.begin(), p.former_names.end());
    }
    throw LayoutError(quote_text(name_or_path) + " is neither a preset nor a readable file" +
                      did_you_mean(name_or_path, all) + "; presets:" + names);
  }
  // A regular file only (a FIFO or /dev/zero is refused unopened), its size known before reading.
  std::string text;
  try {
    RegularFile in(std::string(name_or_path), "layout file");
    if (size_t(in.size()) > kMaxTextBytes)
      throw LayoutError("layout text is more than " + std::to_string(kMaxTextBytes) + " bytes (1 MiB), the bound on a layout");
    text.resize(size_t(in.size()));
    in.read(text.data(), in.size());
  } catch (const ArgumentError& e) {
    throw LayoutError(e.what());
  }
  try {
    return parse_layout_spec(text);
  } catch (const LayoutError& e) {
    throw LayoutError(quote_text(name_or_path) + ": " + e.what());
  }
}

}  // namespace nvfp4kv
