// nvfp4kv roundtrip: store then gather through one layout on the CPU reference
// and the GPU (harness/roundtrip.hpp does the work), printed as a table.
#include <iomanip>
#include <iostream>
#include <sstream>

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

int run_roundtrip(const std::vector<std::string>& argv) {
  const Args a(argv, {"cpu-only"}, {"layout", "layers", "pages", "heads", "head-dim", "tokens-per-page", "tokens", "seed"});
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  const auto name = a.get("layout");
  if (!name) throw UsageError("roundtrip needs --layout LAYOUT");
  DimsOverride dims = dims_from(a);
  const LayoutSpec spec = load_spec(*name);
  if (!dims.pages && !spec.defaults.pages) dims.pages = 64;
  if (!dims.heads && !spec.defaults.heads) dims.heads = 8;
  if (!dims.head_dim && !spec.defaults.head_dim) dims.head_dim = 128;
  if (!dims.tokens_per_page && !spec.defaults.tokens_per_page) dims.tokens_per_page = 16;
  const Layout layout = instantiate(spec, dims);
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
  if (!res.valid) {
    std::cerr << "layout " << layout.name << ": " << res.report.summary() << "\n";
    return verdict_code(res.report);
  }
  std::cout << "layout " << layout.name << ": " << res.report.summary() << "\n";
  // The report goes to stdout when the round trip passes and to stderr, with the verdict, when it fails.
  std::ostringstream report;
  const bool ok = print_roundtrip(harness::roundtrip(*res.valid, opt), report);
  (ok ? std::cout : std::cerr) << report.str();
  return ok ? 0 : 1;
}

}  // namespace nvfp4kv::cli
