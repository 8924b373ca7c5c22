// nvfp4kv layout presets | show | check | compare | plan
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "nvfp4kv/core/layout_diff.hpp"
#include "nvfp4kv/core/names.hpp"
#include "nvfp4kv/core/plan.hpp"

namespace nvfp4kv::cli {
namespace {

// Sizes used where neither the layout nor the command line sets them, for listing only.
const DimsOverride kListingDims{1, 4, 16, 8, 128};

std::vector<OptionSpec> with_sizes(std::vector<OptionSpec> more) {
  std::vector<OptionSpec> o = size_options();
  o.insert(o.end(), more.begin(), more.end());
  o.push_back(kJsonOption);
  return o;
}

const CommandSpec& presets_spec() {
  static const CommandSpec s{"layout presets", "", "List the built-in layouts: verdict, summary, provenance, former names.",
                             {kJsonOption}, ""};
  return s;
}
const CommandSpec& show_spec() {
  static const CommandSpec s{
      "layout show", "LAYOUT",
      "Print a layout's provenance, regions, sizes, capacity, its check and a byte map of one page.",
      with_sizes({{"layer", "L", "the layer whose page the byte map draws (default 0)"},
                  {"page", "P", "the page the byte map draws (default 0)"},
                  {"format", "FILE", "the cache's format (docs/format.md, \"Cache formats\"), checked against the "
                                     "layout's sizes and printed with its bits per value"}}),
      "With --json, \"layout_json\" holds the layout with every number evaluated: a file `layout check` loads;\n"
      "\"format\" the cache's format (plain NVFP4 without --format) and its bits per value."};
  return s;
}
const CommandSpec& check_spec() {
  static const CommandSpec s{"layout check", "LAYOUT",
                             "Prove a layout sound over every layer and page, or say where it breaks.", with_sizes({}), ""};
  return s;
}
const CommandSpec& compare_spec() {
  static const CommandSpec s{
      "layout compare", "WRITER READER",
      "Count, over every layer and page, the elements two descriptions place at different bytes; show examples\n"
      "spread over regions and rows, and which strides differ.",
      with_sizes({{"examples", "N", "how many misplaced elements to show (default 5)"}}), ""};
  return s;
}
const CommandSpec& plan_spec() {
  static const CommandSpec s{
      "layout plan", "",
      "Size an allocation: pages, token capacity and bytes, for nvfp4kv's native layout or a layout of one's own.",
      {{"layers", "L", "model layers (required)"},
       {"kv-heads", "H", "kv heads of the whole model (required)"},
       {"head-dim", "D", "head dim (required unless --layout fixes it)"},
       {"tokens-per-page", "N", "tokens per page (default 16, or what --layout fixes)"},
       {"memory", "BYTES", "budget for this rank's cache, all layers: 4096, 512MiB, 40GiB"},
       {"pages", "P", "a page count instead of a budget"},
       {"tp-size", "T", "tensor-parallel size (default 1)"},
       {"tp-rank", "R", "this rank (default 0)"},
       {"layout", "LAYOUT", "size this layout (a preset or a file) instead of the native one"},
       {"cross-layer", nullptr, "native layout: one allocation for all layers"},
       {"v-scales", "linear|interleave4", "native layout: V scales linear (default) or in the 4-token interleave"},
       {"k-element", "nvfp4|fp8_e4m3", "native layout: what K's bytes hold (default nvfp4)"},
       {"v-element", "nvfp4|fp8_e4m3", "native layout: what V's bytes hold (default nvfp4)"},
       kJsonOption},
      ""};
  return s;
}

void print_assumed(const std::vector<std::string>& assumed) {
  if (!assumed.empty()) std::cout << assumed_line(assumed) << "\n";
}

void print_regions(const Layout& l, const CheckReport* rep) {
  const CacheDims& d = l.dims;
  std::cout << "dims     layers " << d.layers << ", pages " << d.pages << ", tokens/page " << d.tokens_per_page
            << ", heads " << d.heads << ", head dim " << d.head_dim << "\n";
  for (Side s : {Side::kK, Side::kV}) {
    const SideRegions reg = side_regions(s);
    std::cout << "elements " << (s == Side::kK ? "K " : "V ") << element_format_name(d.element(s)) << ": data row "
              << d.columns(reg.data) << " B"
              << (d.fp8(s) ? ", no scales (the global scale is the per-tensor scale)"
                           : ", scale row " + std::to_string(d.columns(reg.scale)) + " B")
              << "\n";
  }
  for (const Buffer& b : l.buffers)
    std::cout << "buffer   \"" << b.name << "\" " << b.bytes << " B" << (b.per_layer ? " per layer" : " (all layers)")
              << "\n";
  std::cout << "region     buffer        offset      layer       page     head  token            column         vector\n";
  for (Region r : kAllRegions) {
    if (!d.holds(r)) {
      std::cout << std::left << std::setw(10) << region_name(r) << " " << std::right
                << "none: its side holds fp8_e4m3 (no block scales)\n";
      continue;
    }
    const RegionMap& m = l.region(r);
    std::cout << std::left << std::setw(10) << region_name(r) << " " << std::setw(10)
              << l.buffers.at(size_t(m.buffer)).name << std::right << std::setw(10) << m.offset << std::setw(11)
              << m.layer << std::setw(11) << m.page << std::setw(9) << m.head << "  " << std::left << std::setw(17)
              << mode_text(m.token) << std::setw(15) << mode_text(m.column) << std::right;
    if (rep && rep->ok) std::cout << rep->access[size_t(r)].vector_bytes << " B";
    std::cout << "\n";
  }
  const int64_t cells = d.pages * d.tokens_per_page;
  std::cout << "capacity " << cells << " tokens per layer; " << l.total_bytes() << " B over " << d.layers
            << " layer(s), " << double(l.total_bytes()) / double(cells * d.layers) << " B per token per layer\n";
}

int cmd_presets(const Args& a) {
  if (!a.positional().empty()) throw UsageError("presets takes no arguments");
  Json list = Json::array();
  if (!a.flag("json"))
    std::cout << "built-in layouts (verdicts at layers 1, pages 4, tokens/page 16, heads 8, head dim 128):\n";
  for (const PresetInfo& p : list_presets()) {
    const CheckResult res = check(instantiate(preset_spec(p.name), kListingDims));
    list.push_back({{"name", p.name}, {"verdict", verdict_name(res.report)}, {"summary", p.summary},
                    {"provenance", provenance_json(p.provenance)}, {"former_names", p.former_names}});
    if (a.flag("json")) continue;
    std::cout << "  " << std::left << std::setw(33) << p.name << std::right << (res.report.ok ? "sound   " : "REJECTED")
              << "  " << p.summary << "\n"
              << provenance_text(p.provenance, "      ", false);
    for (const std::string& f : p.former_names) std::cout << "      former name " << f << "\n";
  }
  if (a.flag("json")) {
    print_json("layout presets", {{"listing_dims", dims_json({1, 4, 16, 8, 128})}, {"presets", list}});
    return kExitOk;
  }
  std::cout << "use them by name, or write your own (docs/layouts.md); layout show NAME prints the expressions\n";
  return kExitOk;
}

int cmd_show(const Args& a) {
  if (a.positional().size() != 1) throw UsageError("show takes one LAYOUT");
  const LoadedLayout ld = load_layout(a.positional()[0], dims_from(a), {1});
  const Layout& l = ld.layout;
  // Drawn first: a page that cannot be drawn is refused before anything is printed.
  const std::string map = a.flag("json") ? "" : byte_map(l, a.integer("layer").value_or(0), a.integer("page").value_or(0));
  const CheckResult res = check(l);
  // Checked against the layout's sizes before anything is printed (exit 2 when it does not fit).
  CacheFormat format;
  if (const auto path = a.get("format")) {
    format = load_format(*path);
    for (const std::string& p : {format_problem(format, l.dims), element_problem(format, l.dims)})
      if (!p.empty()) throw LayoutError(*path + ": " + p);
  }
  if (a.flag("json")) {
    Json buffers = Json::array();
    for (const Buffer& b : l.buffers) buffers.push_back({{"name", b.name}, {"bytes", b.bytes}, {"per_layer", b.per_layer}});
    const int64_t cells = l.dims.pages * l.dims.tokens_per_page;
    print_json("layout show", {{"layout", l.name},
                          {"summary", l.summary},
                          {"provenance", provenance_json(l.provenance)},
                          {"dims", dims_json(l.dims)},
                          {"assumed", ld.assumed},
                          {"buffers", buffers},
                          {"elements", {{"k", element_format_name(l.dims.k_element)},
                                        {"v", element_format_name(l.dims.v_element)}}},
                          {"codes", code_order_text(l.codes)},
                          {"capacity_tokens", cells},
                          {"total_bytes", l.total_bytes()},
                          {"bytes_per_token_per_layer", double(l.total_bytes()) / double(cells * l.dims.layers)},
                          {"check", check_json(res.report)},
                          {"layout_json", layout_json(l)},
                          {"format", {{"implicit", format.implicit() && !format.transforms()},
                                      {"bits_per_value", format.implicit() ? bits_per_value(l.dims)
                                                                           : bits_per_value(format, l.dims.layers)},
                                      {"format_json", Json::parse(format_to_json(format))}}}});
    return verdict_code(res.report);
  }
  print_assumed(ld.assumed);
  std::cout << "layout   " << l.name << "\n";
  if (!l.summary.empty()) std::cout << "         " << l.summary << "\n";
  std::cout << provenance_text(l.provenance, "         ", true);
  print_regions(l, &res.report);
  std::cout << "codes    " << code_order_text(l.codes)
            << (l.codes.is_standard() ? " (element 2j in a data byte's low nibble)" : " (docs/layouts.md, \"codes\")") << "\n";
  std::cout << "format\n" << format_text(format, l.dims);
  std::cout << "check    " << res.report.summary() << "\n\n" << map;
  return verdict_code(res.report);
}

int cmd_check(const Args& a) {
  if (a.positional().size() != 1) throw UsageError("check takes one LAYOUT");
  const LoadedLayout ld = load_layout(a.positional()[0], dims_from(a), {1});
  const CheckResult res = check(ld.layout);
  // Past the proof's bounds: unusable sizes, said in one line on stderr like any refusal.
  if (res.report.undecided) throw LayoutError(ld.layout.name + ": " + res.report.summary());
  if (a.flag("json")) {
    print_json("layout check", {{"layout", ld.layout.name}, {"dims", dims_json(ld.layout.dims)}, {"assumed", ld.assumed},
                           {"check", check_json(res.report)}});
    return verdict_code(res.report);
  }
  print_assumed(ld.assumed);
  std::cout << ld.layout.name << ": " << res.report.summary() << "\n";
  if (!res.report.ok) return verdict_code(res.report);
  std::cout << "widest vector access per row:";
  for (Region r : kAllRegions) {
    const RegionAccess& a = res.report.access[size_t(r)];
    std::cout << " " << region_name(r) << " ";
    if (a.holds) std::cout << a.vector_bytes << " B";
    else std::cout << "none";
  }
  std::cout << "\n";
  return kExitOk;
}

int cmd_compare(const Args& a) {
  if (a.positional().size() != 2) throw UsageError("compare takes WRITER and READER");
  const int64_t examples = a.integer("examples").value_or(5);
  if (examples < 0 || examples > 10000) throw UsageError("--examples must be in [0, 10000], got " + std::to_string(examples));
  const LoadedLayout w = load_layout(a.positional()[0], dims_from(a), {1});
  // The reader takes the writer's sizes where it leaves them open.
  const CacheDims& wd = w.layout.dims;
  const LoadedLayout r = load_layout(a.positional()[1], dims_from(a), {wd.layers, wd.pages, wd.tokens_per_page, wd.heads, wd.head_dim});
  const CompareReport rep = compare(w.layout, r.layout, int(examples));
  const std::vector<MapDifference> diffs = map_differences(w.layout, r.layout);
  if (a.flag("json")) {
    Json ex = Json::array(), di = Json::array(), per = Json::object();
    for (const Misplacement& m : rep.examples) {
      Json e = element_json(m.region, m.coord);
      e["writer"] = {{"buffer", m.writer_buffer}, {"byte", m.writer_byte}};
      e["reader"] = {{"buffer", m.reader_buffer}, {"byte", m.reader_byte}};
      ex.push_back(e);
    }
    for (const MapDifference& m : diffs)
      di.push_back({{"region", region_name(m.region)}, {"field", m.field}, {"writer", m.a}, {"reader", m.b},
                    {"note", m.note}, {"text", m.text("the reader")}});
    for (Region reg : kAllRegions) per[region_name(reg)] = rep.misplaced_per_region[size_t(reg)];
    print_json("layout compare", {{"writer", w.layout.name}, {"reader", r.layout.name}, {"dims", dims_json(wd)},
                             {"assumed", w.assumed}, {"agree", rep.agree}, {"codes_agree", rep.codes_agree},
                             {"writer_codes", rep.writer_codes}, {"reader_codes", rep.reader_codes}, {"elements", rep.elements},
                             {"misplaced", rep.misplaced}, {"misplaced_per_region", per}, {"examples", ex},
                             {"differences", di}});
    return rep.agree ? kExitOk : kExitVerdict;
  }
  print_assumed(w.assumed);
  std::cout << rep.summary(w.layout.name, r.layout.name) << "\n";
  if (!diffs.empty()) {
    std::cout << "what differs (\"" << w.layout.name << "\" is the writer):\n";
    for (const MapDifference& m : diffs) std::cout << "  " << m.text("the reader") << "\n";
  }
  return rep.agree ? kExitOk : kExitVerdict;
}

int cmd_plan(const Args& a) {
  if (!a.positional().empty()) throw UsageError("plan takes options only, got " + quote_text(a.positional()[0]));
  PlanRequest q;
  std::optional<LayoutSpec> own;
  if (const auto l = a.get("layout")) own = load_spec(*l);
  const auto need = [&](const char* name, std::optional<int64_t> from_layout) {
    const auto v = a.integer(name);
    if (v) return *v;
    if (from_layout) return *from_layout;
    throw UsageError(std::string("plan needs --") + name);
  };
  q.layers = need("layers", std::nullopt);
  q.kv_heads = need("kv-heads", std::nullopt);
  q.head_dim = need("head-dim", own ? own->defaults.head_dim : std::nullopt);
  std::vector<std::string> assumed;
  if (const auto n = a.integer("tokens-per-page")) q.tokens_per_page = *n;
  else if (own && own->defaults.tokens_per_page) q.tokens_per_page = *own->defaults.tokens_per_page;
  else assumed.push_back("tokens per page 16");
  q.memory_bytes = a.bytes("memory");
  q.pages = a.integer("pages");
  q.tp_size = a.integer("tp-size").value_or(1);
  q.tp_rank = a.integer("tp-rank").value_or(0);
  q.cross_layer = a.flag("cross-layer");
  const std::string vs = a.get("v-scales").value_or("linear");
  if (vs == "interleave4") q.interleave_v_scales = true;
  else if (vs != "linear") throw UsageError("--v-scales expects linear or interleave4, got " + quote_text(vs));
  q.k_element = element_option(a, "k-element").value_or(ElementFormat::kNvfp4);
  q.v_element = element_option(a, "v-element").value_or(ElementFormat::kNvfp4);
  if (own && (a.get("k-element") || a.get("v-element")))
    throw UsageError("--k-element and --v-element shape the native layout; --layout says its own elements");
  q.layout = own;
  const Plan p = plan(q);
  const Layout& l = p.layout.layout();
  if (a.flag("json")) {
    print_json("layout plan", {{"layout", l.name},
                          {"native", p.native},
                          {"dims", dims_json(l.dims)},
                          {"assumed", assumed},
                          {"heads_per_rank", p.heads_per_rank},
                          {"first_head", p.first_head},
                          {"pages", l.dims.pages},
                          {"bytes_per_page_per_layer", p.bytes_per_page_per_layer},
                          {"bytes_per_page", p.bytes_per_page},
                          {"token_capacity", p.token_capacity},
                          {"total_bytes", p.total_bytes},
                          {"fixed_bytes", p.fixed_bytes},
                          {"check", check_json(p.layout.report())},
                          {"layout_json", layout_json(l)}});
    return kExitOk;
  }
  if (!assumed.empty()) std::cout << "assumed: tokens per page 16 (--tokens-per-page sets it)\n";
  std::cout << p.summary() << "\n" << "check           " << p.layout.report().summary() << "\n";
  return kExitOk;
}

}  // namespace

int run_layout(const std::vector<std::string>& argv) {
  static const std::vector<Subcommand> subs = {
      {"presets", "presets                        the built-in layouts and their verdicts", presets_spec, cmd_presets},
      {"show", "show LAYOUT [sizes]            regions, sizes, capacity and a byte map of one page", show_spec, cmd_show},
      {"check", "check LAYOUT [sizes]           prove a layout sound or say where it breaks", check_spec, cmd_check},
      {"compare", "compare WRITER READER [sizes]  do two descriptions place every element alike?", compare_spec,
       cmd_compare},
      {"plan", "plan [options]                 size an allocation", plan_spec, cmd_plan}};
  return run_group("layout", subs, argv, " (docs/layouts.md).");
}

}  // namespace nvfp4kv::cli
