// nvfp4kv bench decode | prefill: time decode or prefill attention on the GPU
// over a grid of shapes (harness/decode_bench.hpp, harness/prefill_bench.hpp do
// the work) and print a table or JSON lines.
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "nvfp4kv/harness/workload.hpp"
#if defined(NVFP4KV_HAVE_CUDA)
#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/harness/decode_bench.hpp"
#include "nvfp4kv/harness/prefill_bench.hpp"
#endif

namespace nvfp4kv::cli {
namespace {

std::vector<int64_t> integer_list(const Args& a, const std::string& name, int64_t fallback, int64_t least = 1) {
  const auto text = a.get(name);
  if (!text) return {fallback};
  std::vector<int64_t> out;
  std::stringstream s(*text);
  std::string item;
  while (std::getline(s, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < least)
      throw UsageError("--" + name + " expects integers >= " + std::to_string(least) + " separated by commas, got \"" +
                       *text + "\"");
    out.push_back(v);
  }
  return out;
}

// --transform's list, each checked (harness::transform_format says what is wrong).
std::vector<std::string> transform_list(const Args& a) {
  const auto text = a.get("transform");
  if (!text) return {"plain"};
  std::vector<std::string> out;
  std::stringstream s(*text);
  std::string item;
  while (std::getline(s, item, ',')) {
    try {
      (void)harness::transform_format(item, 1, 16, 0);
    } catch (const ArgumentError& e) {
      throw UsageError(std::string("--transform: ") + e.what());
    }
    out.push_back(item);
  }
  if (out.empty()) throw UsageError("--transform expects plain or transforms joined by '+', separated by commas");
  return out;
}

constexpr const char* kTransformHelp =
    "the cache's transforms (default plain), each one timed as its own cache: plain, or any of rotate-k,\n"
    "rotate-v (Hadamard rotations of the whole head), smooth-k (a K mean subtracted), scale-k (K's channels\n"
    "divided by a channel scale), fp8-k, fp8-v (that side in FP8 E4M3) joined by '+'";

const CommandSpec& bench_spec() {
  static const CommandSpec s{
      "bench decode", "",
      "Time decode attention on the GPU over a grid of shapes (each value list is comma-separated): the cache in\n"
      "a page pool larger than the L2, CUDA graph replay, the median per call, against the streaming-read ceiling.",
      {{"batch", "B,...", "sequences (default 8)"},
       {"context", "L,...", "tokens per sequence (default 8192)"},
       {"q-heads", "H,...", "query heads (default 32)"},
       {"kv-heads", "H,...", "kv heads (default 8)"},
       {"head-dim", "D,...", "head dim (default 128)"},
       {"tokens-per-page", "N", "tokens per page (default 16)"},
       {"layout", "LAYOUT", "the cache layout (default nvfp4kv-native)"},
       {"transform", "T,...", kTransformHelp},
       {"max-gib", "G", "skip shapes whose cache needs more (default 40)"},
       {"fp16", nullptr, "fp16 queries and output instead of bf16"},
       {"json", nullptr, "one JSON object per line: the ceiling, then each shape"}},
      "Without a GPU it says so and exits 3."};
  return s;
}

const CommandSpec& prefill_spec() {
  static const CommandSpec s{
      "bench prefill", "",
      "Time prefill / extend attention on the GPU over a grid of shapes (each value list is comma-separated):\n"
      "each sequence has --cached tokens in the cache and --prompt new ones; the median of 7 launches; TFLOP/s\n"
      "counted as causal attention's FLOPs (4 D per attended query-head and token pair).",
      {{"batch", "B,...", "sequences (default 1)"},
       {"prompt", "L,...", "new tokens per sequence (default 2048)"},
       {"cached", "C,...", "tokens already cached per sequence (default 0)"},
       {"q-heads", "H,...", "query heads (default 32)"},
       {"kv-heads", "H,...", "kv heads (default 8)"},
       {"head-dim", "D,...", "head dim (default 128)"},
       {"tokens-per-page", "N", "tokens per page (default 16)"},
       {"layout", "LAYOUT", "the cache layout (default nvfp4kv-native)"},
       {"transform", "T,...", kTransformHelp},
       {"fp16", nullptr, "fp16 queries and output instead of bf16"},
       {"mixed", nullptr,
        "through the mixed-batch call, which routes q length 1 to decode and q lengths up to 16 / group to the\n"
        "short-query route (the decode kernel); others still run prefill"},
       {"json", nullptr, "one JSON object per line, one per shape"}},
      "Without a GPU it says so and exits 3."};
  return s;
}

int run_bench_prefill(const std::vector<std::string>& argv) {
  const Args a(std::vector<std::string>(argv.begin() + 1, argv.end()), prefill_spec());
  if (a.help()) {
    std::cout << help_text(prefill_spec());
    return kExitOk;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  const auto batches = integer_list(a, "batch", 1), prompts = integer_list(a, "prompt", 2048);
  const auto cached = integer_list(a, "cached", 0, 0);
  const auto q_heads = integer_list(a, "q-heads", 32), kv_heads = integer_list(a, "kv-heads", 8);
  const auto dims = integer_list(a, "head-dim", 128);
  const int64_t page = a.integer("tokens-per-page").value_or(16);
  const auto transforms = transform_list(a);
#if defined(NVFP4KV_HAVE_CUDA)
  std::string why;
  if (!cuda_device_available(&why)) {
    std::cerr << "nvfp4kv bench: " << why << "; prefill attention needs a GPU\n";
    return kExitUnavailable;
  }
  const bool json = a.flag("json");
  for (int64_t h : kv_heads)
    for (int64_t qh : q_heads)
      for (int64_t dim : dims)
        for (int64_t b : batches)
          for (int64_t c : cached)
            for (int64_t L : prompts)
              for (const std::string& t : transforms) {
                if (qh % h != 0) continue;
                const harness::PrefillBenchResult r = harness::bench_prefill(
                    {b, L, c, qh, h, dim, page, a.get("layout").value_or("nvfp4kv-native"),
                     a.flag("fp16") ? ElementType::kFloat16 : ElementType::kBFloat16, a.flag("mixed"), t});
                if (json)
                  std::cout << "{\"batch\": " << b << ", \"prompt\": " << L << ", \"cached\": " << c
                            << ", \"q_heads\": " << qh << ", \"kv_heads\": " << h << ", \"head_dim\": " << dim
                            << ", \"route\": \"" << (a.flag("mixed") ? "mixed" : "prefill") << "\", \"transform\": \"" << t
                            << "\", \"ms\": " << r.ms << ", \"tflops\": " << r.tflops << "}" << std::endl;
                else
                  std::cout << "batch " << b << " prompt " << L << " cached " << c << " heads " << qh << "/" << h
                            << " D " << dim << (a.flag("mixed") ? " (mixed)" : "") << (t == "plain" ? "" : " " + t)
                            << ": " << r.ms << " ms, " << r.tflops << " TFLOP/s" << std::endl;
              }
  return 0;
#else
  (void)batches, (void)prompts, (void)cached, (void)q_heads, (void)kv_heads, (void)dims, (void)page, (void)transforms;
  std::cerr << "nvfp4kv bench: this nvfp4kv was built without CUDA (no nvcc at configure time), so there are no kernels to time\n";
  return kExitUnavailable;
#endif
}

}  // namespace

int run_bench(const std::vector<std::string>& argv) {
  if (!argv.empty() && (argv[0] == "--help" || argv[0] == "-h")) {
    std::cout << help_text(bench_spec());
    return kExitOk;
  }
  if (!argv.empty() && argv[0] == "prefill") return run_bench_prefill(argv);
  if (argv.empty() || argv[0] != "decode")
    throw UsageError("bench needs a kernel: bench decode|prefill [options] (nvfp4kv bench decode --help lists them)");
  const Args a(std::vector<std::string>(argv.begin() + 1, argv.end()), bench_spec());
  if (a.help()) {
    std::cout << help_text(bench_spec());
    return kExitOk;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  const auto batches = integer_list(a, "batch", 8), contexts = integer_list(a, "context", 8192);
  const auto q_heads = integer_list(a, "q-heads", 32), kv_heads = integer_list(a, "kv-heads", 8);
  const auto dims = integer_list(a, "head-dim", 128);
  const int64_t page = a.integer("tokens-per-page").value_or(16);
  const double max_bytes = double(a.integer("max-gib").value_or(40)) * double(int64_t(1) << 30);
  const auto transforms = transform_list(a);
#if defined(NVFP4KV_HAVE_CUDA)
  std::string why;
  if (!cuda_device_available(&why)) {
    std::cerr << "nvfp4kv bench: " << why << "; decode attention needs a GPU\n";
    return kExitUnavailable;
  }
  const bool json = a.flag("json");
  const double ceiling = harness::read_ceiling_tbs();
  if (json) std::cout << "{\"ceiling_read_tbs\": " << ceiling << "}\n";
  else std::cout << "streaming-read ceiling " << ceiling << " TB/s\n";
  for (int64_t h : kv_heads)
    for (int64_t qh : q_heads)
      for (int64_t dim : dims)
        for (int64_t b : batches)
          for (int64_t ctx : contexts)
            for (const std::string& t : transforms) {
              if (qh % h != 0) continue;
              harness::DecodeBenchShape shape{b, ctx, qh, h, dim, page, a.get("layout").value_or("nvfp4kv-native"),
                                              a.flag("fp16") ? ElementType::kFloat16 : ElementType::kBFloat16, t};
              const double bytes = double(b) * ctx * h * 2 * (dim / 2 + dim / 16);
              if (bytes > max_bytes) {
                std::cerr << "skipped: batch " << b << " x context " << ctx << " needs " << bytes / 1e9
                          << " GB of cache, above --max-gib\n";
                continue;
              }
              const harness::DecodeBenchResult r = harness::bench_decode(shape);
              if (json)
                std::cout << "{\"batch\": " << b << ", \"context\": " << ctx << ", \"q_heads\": " << qh
                          << ", \"kv_heads\": " << h << ", \"head_dim\": " << dim << ", \"ms\": " << r.ms
                          << ", \"cache_bytes\": " << r.cache_bytes << ", \"tbs\": " << r.tbs
                          << ", \"of_ceiling\": " << r.tbs / ceiling << ", \"splits\": " << r.splits
                          << ", \"dense\": " << (r.dense ? "true" : "false")
                          << ", \"tensor_rows\": " << (r.tensor_rows ? "true" : "false") << ", \"checked_rel_l2\": " << r.checked_rel_l2
                          << ", \"layout\": \"" << shape.layout << "\", \"transform\": \"" << t << "\"}" << std::endl;
              else
                std::cout << "batch " << b << " context " << ctx << " heads " << qh << "/" << h << " D " << dim
                          << (t == "plain" ? "" : " " + t) << ": "
                          << r.ms * 1e3 << " us, " << r.tbs << " TB/s (" << 100 * r.tbs / ceiling
                          << " % of the read ceiling), " << r.splits << " splits, "
                          << (r.dense ? "whole planes" : r.tensor_rows ? "rows by tensor copies" : "row by row") << std::endl;
            }
  return 0;
#else
  (void)batches, (void)contexts, (void)q_heads, (void)kv_heads, (void)dims, (void)page, (void)max_bytes, (void)transforms;
  std::cerr << "nvfp4kv bench: this nvfp4kv was built without CUDA (no nvcc at configure time), so there are no kernels to time\n";
  return kExitUnavailable;
#endif
}

}  // namespace nvfp4kv::cli
