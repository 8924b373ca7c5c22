// nvfp4kv layout presets | show | check | compare | plan
#include <iomanip>
#include <iostream>

#include "cli.hpp"
#include "nvfp4kv/core/plan.hpp"

namespace nvfp4kv::cli {
namespace {

// Sizes used where neither the layout nor the command line sets them, for listing only.
const DimsOverride kListingDims{1, 4, 16, 8, 128};

std::string load_and_fill(const std::string& what, const Args& a, Layout& out) {
  const LayoutSpec spec = load_spec(what);
  out = instantiate(spec, dims_from(a));
  return spec.name;
}

void print_regions(const Layout& l, const CheckReport* rep) {
  const CacheDims& d = l.dims;
  std::cout << "dims     layers " << d.layers << ", pages " << d.pages << ", tokens/page " << d.tokens_per_page
            << ", heads " << d.heads << ", head dim " << d.head_dim << "  (data row " << d.data_bytes()
            << " B, scale row " << d.scale_bytes() << " B)\n";
  for (const Buffer& b : l.buffers)
    std::cout << "buffer   " << quote_text(b.name) << " " << b.bytes << " B" << (b.per_layer ? " per layer" : " (all layers)")
              << "\n";
  std::cout << "region     buffer        offset      layer       page     head  token            column         vector\n";
  for (Region r : kAllRegions) {
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

int cmd_presets() {
  std::cout << "built-in layouts (verdicts at layers 1, pages 4, tokens/page 16, heads 8, head dim 128):\n";
  for (const PresetInfo& p : list_presets()) {
    const CheckResult res = check(instantiate(preset_spec(p.name), kListingDims));
    std::cout << "  " << std::left << std::setw(33) << p.name << std::right << (res.report.ok ? "sound   " : "REJECTED")
              << "  " << p.summary << "\n"
              << provenance_text(p.provenance, "      ", false);
    for (const std::string& f : p.former_names) std::cout << "      former name " << f << "\n";
  }
  std::cout << "use them by name, or write your own (docs/layouts.md); layout show NAME prints the expressions\n";
  return 0;
}

int cmd_show(const Args& a) {
  if (a.positional().size() != 1) throw UsageError("show takes one LAYOUT");
  Layout l;
  load_and_fill(a.positional()[0], a, l);
  if (a.flag("json")) {
    std::cout << to_json(l) << "\n";
    return 0;
  }
  // Drawn first: a page that cannot be drawn is refused before anything is printed.
  const std::string map = byte_map(l, a.integer("layer").value_or(0), a.integer("page").value_or(0));
  const CheckResult res = check(l);
  std::cout << "layout   " << l.name << "\n";
  if (!l.summary.empty()) std::cout << "         " << l.summary << "\n";
  std::cout << provenance_text(l.provenance, "         ", true);
  print_regions(l, &res.report);
  std::cout << "check    " << res.report.summary() << "\n\n" << map;
  return verdict_code(res.report);
}

int cmd_check(const Args& a) {
  if (a.positional().size() != 1) throw UsageError("check takes one LAYOUT");
  Layout l;
  load_and_fill(a.positional()[0], a, l);
  const CheckResult res = check(l);
  if (!res.report.ok) {
    std::cerr << l.name << ": " << res.report.summary() << "\n";
    return verdict_code(res.report);
  }
  std::cout << l.name << ": " << res.report.summary() << "\n";
  std::cout << "widest vector access per row:";
  for (Region r : kAllRegions)
    std::cout << " " << region_name(r) << " " << res.report.access[size_t(r)].vector_bytes << " B";
  std::cout << "\n";
  return 0;
}

int cmd_compare(const Args& a) {
  if (a.positional().size() != 2) throw UsageError("compare takes WRITER and READER");
  Layout w, r;
  load_and_fill(a.positional()[0], a, w);
  load_and_fill(a.positional()[1], a, r);
  const CompareReport rep = compare(w, r);
  (rep.agree ? std::cout : std::cerr) << rep.summary(w.name, r.name) << "\n";
  return rep.agree ? 0 : 1;
}

int cmd_plan(const Args& a) {
  PlanRequest q;
  const auto need = [&](const char* name) {
    const auto v = a.integer(name);
    if (!v) throw UsageError(std::string("plan needs --") + name);
    return *v;
  };
  q.layers = need("layers");
  q.kv_heads = need("kv-heads");
  q.head_dim = need("head-dim");
  q.tokens_per_page = a.integer("tokens-per-page").value_or(16);
  q.memory_bytes = a.bytes("memory");
  q.pages = a.integer("pages");
  q.tp_size = a.integer("tp-size").value_or(1);
  q.tp_rank = a.integer("tp-rank").value_or(0);
  q.cross_layer = a.flag("cross-layer");
  const std::string vs = a.get("v-scales").value_or("linear");
  if (vs == "interleave4") q.interleave_v_scales = true;
  else if (vs != "linear") throw UsageError("--v-scales expects linear or interleave4, got " + quote_text(vs));
  const Plan p = plan(q);
  if (a.flag("json")) {
    std::cout << to_json(p.layout.layout()) << "\n";
    return 0;
  }
  std::cout << p.summary() << "\n" << "check           " << p.layout.report().summary() << "\n";
  return 0;
}

}  // namespace

int run_layout(const std::vector<std::string>& argv) {
  if (argv.empty()) throw UsageError("layout needs a subcommand: presets, show, check, compare, plan");
  const std::string sub = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (sub == "presets") {
    Args a(rest, {}, {});
    if (!a.positional().empty()) throw UsageError("presets takes no arguments");
    return cmd_presets();
  }
  if (sub == "plan")
    return cmd_plan(Args(rest, {"cross-layer", "json"},
                         {"layers", "kv-heads", "head-dim", "tokens-per-page", "memory", "pages", "tp-size", "tp-rank",
                          "v-scales"}));
  const Args a(rest, {"json"}, {"layers", "pages", "heads", "head-dim", "tokens-per-page", "layer", "page"});
  if (sub == "show") return cmd_show(a);
  if (sub == "check") return cmd_check(a);
  if (sub == "compare") return cmd_compare(a);
  throw UsageError("unknown layout subcommand " + quote_text(sub) + " (presets, show, check, compare, plan)");
}

}  // namespace nvfp4kv::cli
