// nvfp4kv roundtrip: store then gather through one layout on the CPU reference
// and the GPU (harness/roundtrip.hpp does the work), printed as a table.
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "nvfp4kv/harness/roundtrip.hpp"

namespace nvfp4kv::cli {
namespace {

void print_row(std::ostream& out, const std::string& what, const std::string& cpu, const std::string& gpu) {
  out << "  " << std::left << std::setw(22) << what << std::setw(34) << cpu << gpu << std::right << "\n";
}

std::string tally_text(const harness::RegionTally& t) {
  std::ostringstream s;
  if (t.bytes_bad == 0) s << "ok, " << t.bytes_ok << " bytes";
  else s << "FAIL, " << t.bytes_bad << " of " << t.bytes_ok + t.bytes_bad << " bytes wrong";
  return s.str();
}

// One column of the table per path: its cell for each row.
struct Column {
  std::string head, regions[kRegionCount], untouched, gather, skipped;
};

Column column(const harness::RoundtripPath& p, const char* name, const char* exact_what) {
  Column c;
  if (!p.ran) {
    c.head = std::string(p.refused ? "FAILED: " : "not run: ") + p.why_not;
    return c;
  }
  c.head = name;
  for (Region r : kAllRegions) c.regions[int(r)] = tally_text(p.store.regions[size_t(r)]);
  c.untouched = p.store.untouched_changed == 0 ? "untouched" : "FAIL, " + std::to_string(p.store.untouched_changed) + " bytes changed";
  c.gather = p.gather_bad == 0 ? std::string(exact_what) + " (" + std::to_string(p.gather_values) + " values)"
                               : "FAIL, " + std::to_string(p.gather_bad) + " values differ";
  c.skipped = std::to_string(p.status.padding) + " padding, " + std::to_string(p.status.out_of_range) + " out of range";
  return c;
}

}  // namespace

bool print_roundtrip(const harness::RoundtripReport& r, std::ostream& out) {
  out << "  " << r.tokens << " tokens x " << r.heads << " heads x D " << r.head_dim << " (bf16) through \"" << r.layout
      << "\", pages in shuffled order\n";
  const Column cpu = column(r.cpu, "CPU reference", "bit-exact"), gpu = column(r.gpu, "GPU", "bit-exact");
  print_row(out, "", cpu.head, gpu.head);
  for (Region reg : kAllRegions) print_row(out, region_name(reg), cpu.regions[int(reg)], gpu.regions[int(reg)]);
  print_row(out, "bytes outside rows", cpu.untouched, gpu.untouched);
  print_row(out, "gather vs reference", cpu.gather, gpu.gather);
  print_row(out, "skipped slots", cpu.skipped, gpu.skipped);
  out << "  round trip: " << (r.ok() ? "PASS" : "FAIL") << "\n";
  return r.ok();
}

namespace {

const CommandSpec& roundtrip_spec() {
  static const CommandSpec s{
      "roundtrip", "",
      "Store rows through a layout, then gather them back, on the CPU reference and on the GPU when there is one;\n"
      "every byte audited against the dense reference quantization, every value compared bit for bit.",
      [] {
        std::vector<OptionSpec> o = {{"layout", "LAYOUT", "the layout (a preset or a JSON file; required)"}};
        for (const OptionSpec& x : size_options()) o.push_back(x);
        o.push_back({"tokens", "T", "rows to store (default: 3/4 of the cache, at most 4096)"});
        o.push_back({"seed", "S", "seed of the rows and the page order (default 1)"});
        o.push_back({"cpu-only", nullptr, "skip the GPU path"});
        o.push_back(kJsonOption);
        return o;
      }(),
      "Sizes the layout and the command line leave open are pages 64, heads 8, head dim 128, 16 tokens per\n"
      "page and one layer; the ones taken are printed."};
  return s;
}

Json path_json(const harness::RoundtripReport& r, const harness::RoundtripPath& p) {
  Json regions = Json::object();
  for (Region reg : kAllRegions)
    regions[region_name(reg)] = {{"bytes_ok", p.store.regions[size_t(reg)].bytes_ok},
                                 {"bytes_bad", p.store.regions[size_t(reg)].bytes_bad}};
  return {{"ran", p.ran},           {"why_not", p.why_not},
          {"refused", p.refused},   {"ok", r.path_ok(p)},
          {"regions", regions},     {"untouched_changed", p.store.untouched_changed},
          {"gather_values", p.gather_values}, {"gather_bad", p.gather_bad},
          {"padding", p.status.padding}, {"out_of_range", p.status.out_of_range}};
}

}  // namespace

int run_roundtrip(const std::vector<std::string>& argv) {
  const Args a(argv, roundtrip_spec());
  if (a.help()) {
    std::cout << help_text(roundtrip_spec());
    return kExitOk;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  const auto name = a.get("layout");
  if (!name) throw UsageError("roundtrip needs --layout LAYOUT");
  const LoadedLayout ld = load_layout(*name, dims_from(a), {1, 64, 16, 8, 128});
  const Layout& layout = ld.layout;
  // Refused before anything is printed.
  if (std::string p = harness::roundtrip_problem(layout); !p.empty()) throw LayoutError(p);
  harness::RoundtripOptions opt;
  opt.tokens = a.integer("tokens").value_or(0);
  opt.seed = uint64_t(a.integer("seed").value_or(1));
  opt.use_gpu = !a.flag("cpu-only");
  // The round trip holds the cache and the rows on the host (and the GPU): bounded up front.
  constexpr int64_t kMaxCacheBytes = int64_t(1) << 28, kMaxElements = int64_t(1) << 24;
  int64_t cache_bytes = 0;  // what one layer's allocations take (the layout's sizes are within 2^62)
  for (const Buffer& b : layout.buffers) cache_bytes += b.bytes;
  if (cache_bytes > kMaxCacheBytes)
    throw LayoutError("roundtrip allocates the cache of one layer on the host: " + std::to_string(cache_bytes) +
                      " bytes is more than " + std::to_string(kMaxCacheBytes) + " (256 MiB), its bound; use fewer pages or heads");
  if (opt.tokens < 0) throw UsageError("--tokens must be >= 1, got " + std::to_string(opt.tokens));
  const int64_t tokens = opt.tokens > 0 ? opt.tokens : 4096;  // the most RoundtripOptions' default fills
  const int64_t row = layout.dims.heads * layout.dims.head_dim;
  if (tokens > kMaxElements / row)
    throw LayoutError("roundtrip stores " + std::to_string(tokens) + " tokens x " + std::to_string(row) +
                      " elements (heads x head dim), more than " + std::to_string(kMaxElements) +
                      " (2^24), its bound; pass --tokens " + std::to_string(std::max<int64_t>(kMaxElements / row, 1)) +
                      " or fewer, or fewer heads");
  CheckResult res = check(layout);
  if (res.report.undecided) throw LayoutError("layout " + layout.name + ": " + res.report.summary());
  const bool json = a.flag("json");
  if (!json) {
    if (!ld.assumed.empty()) std::cout << assumed_line(ld.assumed) << "\n";
    std::cout << "layout " << layout.name << ": " << res.report.summary() << "\n";
  }
  if (!res.valid) {
    if (json)
      print_json("roundtrip", {{"layout", layout.name}, {"dims", dims_json(layout.dims)}, {"assumed", ld.assumed},
                               {"check", check_json(res.report)}, {"ok", false}});
    return verdict_code(res.report);
  }
  harness::RoundtripReport report;
  {
    StderrProgress progress("roundtrip");
    opt.progress = progress.callback();
    report = harness::roundtrip(*res.valid, opt);
  }
  if (json) {
    print_json("roundtrip", {{"layout", layout.name},
                             {"dims", dims_json(layout.dims)},
                             {"assumed", ld.assumed},
                             {"check", check_json(res.report)},
                                                                   {"tokens", report.tokens},
                                                                   {"heads", report.heads},
                                                                   {"head_dim", report.head_dim},
                                                                   {"cpu", path_json(report, report.cpu)},
                                                                   {"gpu", path_json(report, report.gpu)},
                             {"ok", report.ok()}});
    return report.ok() ? kExitOk : kExitVerdict;
  }
  return print_roundtrip(report, std::cout) ? kExitOk : kExitVerdict;
}

}  // namespace nvfp4kv::cli
