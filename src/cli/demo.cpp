// nvfp4kv demo: what NVFP4 does to a KV cache, what a broken layout looks like,
// and a round trip through the native layout (on the GPU when there is one).
#include <cmath>
#include <iomanip>
#include <iostream>
#include <random>

#include "cli.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "nvfp4kv/reference/quantize.hpp"
#include "nvfp4kv/harness/accuracy.hpp"
#include "nvfp4kv/harness/workload.hpp"
#if defined(NVFP4KV_HAVE_CUDA)
#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/harness/decode_bench.hpp"
#endif

namespace nvfp4kv::cli {
namespace {

void report_row(const std::string& name, const reference::ErrorStats& e, double bytes_per_token) {
  std::cout << "  " << std::left << std::setw(30) << name << std::right << std::setw(10) << std::fixed
            << std::setprecision(4) << e.rel_l2 << std::setw(12) << std::setprecision(4) << e.max_abs << std::setw(14)
            << std::setprecision(0) << bytes_per_token << "\n";
}

// 4: attention over NVFP4 against BF16, on the CPU reference; 5: decode attention
// on the GPU, checked against that reference, when there is one.
void attention_sections(bool cpu_only, uint64_t seed) {
  std::cout << "\n4. What 4 bits cost in attention (fp64 decode attention over 2048 tokens, 32 q / 8 kv heads, 8 steps)\n"
            << "   Relative L2 error of the attention output against attention on the unquantized K/V (vs exact) and\n"
            << "   on a BF16 cache (vs BF16, what engines treat as lossless). Each row is one cache format for K and V:\n\n";
  std::cout << "  " << std::left << std::setw(48) << "K/V" << std::setw(28) << "format" << std::right << std::setw(12)
            << "vs exact" << std::setw(12) << "vs BF16" << std::setw(14) << "bytes/token" << "\n";
  const std::vector<harness::AccuracyRow> rows = harness::attention_accuracy(2048, seed);
  for (const harness::AccuracyRow& r : rows) {
    std::cout << "  " << std::left << std::setw(48) << r.cache << std::setw(28) << r.format << std::right << std::fixed
              << std::setprecision(4) << std::setw(12) << r.rel_l2_vs_exact << std::setw(12) << r.rel_l2_vs_bf16
              << std::setprecision(0) << std::setw(14) << r.bytes_per_token << "\n";
  }
  // The K-outlier cache's two NVFP4 rows (amax/6, then 4over6), as measured above.
  double amax6 = 0, four_over_six = 0;
  for (const harness::AccuracyRow& r : rows)
    if (r.cache.find("K outlier") != std::string::npos && r.format.find("NVFP4") != std::string::npos)
      (r.format.find("4over6") != std::string::npos ? four_over_six : amax6) = r.rel_l2_vs_exact;
  std::cout << "\n   Reference point: the FP8 rows, the accuracy an FP8 KV cache is accepted at; NVFP4 costs about twice\n"
            << "   FP8's output error for 0.56x its bytes. 4over6 picks, per 16-value block, whichever scale (amax/6 or\n"
            << "   amax/4) gives that block's values the smaller squared error, which is what section 1 measures;\n"
            << "   attention sees K only through softmax(q.k / sqrt(D)), where the outlier channels set the logits and\n"
            << "   the exponential weighs logit errors unevenly, so a lower per-block error need not lower the output's:\n"
            << "   on the K-outlier row here 4over6 is " << (four_over_six > amax6 ? "higher" : "not higher") << " ("
            << std::setprecision(4) << four_over_six << " against amax/6's " << amax6 << "). Which rule wins depends\n"
            << "   on the data: measure it on your model's K and V.\n";
  std::cout << "\n5. Decode attention on the GPU, reading the NVFP4 cache directly\n";
#if defined(NVFP4KV_HAVE_CUDA)
  std::string why;
  if (cpu_only || !cuda_device_available(&why)) {
    std::cout << "   not run: " << (cpu_only ? std::string("--cpu-only") : why) << "\n";
    return;
  }
  const harness::DecodeBenchResult r = harness::bench_decode({8, 8192, 32, 8, 128});
  std::cout << std::setprecision(2) << "   8 sequences x 8192 tokens, 32 q / 8 kv heads, D 128: " << r.ms * 1e3
            << " us per step, " << r.tbs << " TB/s of NVFP4 cache read\n   (checked against the fp64 reference first: "
            << std::scientific << r.checked_rel_l2 << std::fixed << " relative L2 error)\n";
#else
  (void)cpu_only;
  std::cout << "   not run: nvfp4kv was built without CUDA\n";
#endif
}


const CommandSpec& demo_spec() {
  static const CommandSpec s{"demo", "",
                             "The tour: what NVFP4 costs in accuracy and in attention, what a broken layout looks like,\n"
                             "and a round trip through nvfp4kv's native layout (on the GPU when there is one).",
                             {{"tokens", "T", "tokens of the synthetic KV tensor (default 2048)"},
                              {"seed", "S", "seed (default 7)"},
                              {"cpu-only", nullptr, "skip the GPU sections"}},
                             ""};
  return s;
}

}  // namespace

int run_demo(const std::vector<std::string>& argv) {
  const Args a(argv, demo_spec());
  if (a.help()) {
    std::cout << help_text(demo_spec());
    return kExitOk;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  StderrProgress progress("demo");
  const Progress tell = progress.callback();
  const int64_t tokens = a.integer("tokens").value_or(2048);
  // About half a millisecond per token on one core beyond the fixed sections: 8192 tokens stay within seconds.
  constexpr int64_t kMaxTokens = 8192;
  if (tokens < 1 || tokens > kMaxTokens)
    throw UsageError("--tokens must be in [1, " + std::to_string(kMaxTokens) + "], got " + std::to_string(tokens));
  const uint64_t seed = uint64_t(a.integer("seed").value_or(7));
  constexpr int64_t kHeads = 8, kDim = 128;
  tell("1. quantizing the synthetic KV tensor", 0.0);
  std::cout << "nvfp4kv demo\n============\n\n"
            << "1. What 4-bit storage costs in accuracy\n"
            << "   One layer of a synthetic KV cache shaped like Llama-3-8B (" << tokens
            << " tokens, 8 kv heads, head dim 128),\n"
            << "   heavy-tailed values, 4 outlier channels per head in K. Bytes are K + V per token per layer.\n\n";
  std::cout << "  " << std::left << std::setw(30) << "format" << std::right << std::setw(10) << "rel L2" << std::setw(12)
            << "max |err|" << std::setw(14) << "bytes/token" << "\n";
  const reference::DenseShape shape{tokens, kHeads, kDim};
  for (bool keys : {true, false}) {
    const auto x = harness::realistic_kv(tokens, kHeads, kDim, keys, seed + (keys ? 0 : 1));
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const std::string side = keys ? "K " : "V ";
    report_row(side + "BF16 (baseline)", reference::error_stats(x, [&] {
                 std::vector<float> y(x.size());
                 for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_float(float_to_bf16(x[i]));
                 return y;
               }()),
               2.0 * 2 * kHeads * kDim);
    {  // FP8 E4M3 with one per-tensor scale, the common alternative
      const float s = amax / kE4M3Max;
      std::vector<float> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = e4m3_decode(e4m3_encode(x[i] / s)) * s;
      report_row(side + "FP8 E4M3, per-tensor scale", reference::error_stats(x, y), 1.0 * 2 * kHeads * kDim);
    }
    const float gs = recommend_global_scale(amax);
    for (auto [rule, name] : {std::pair{ScaleRule::kStandard, "NVFP4, amax/6 scales"},
                              {ScaleRule::kFourOverSix, "NVFP4, 4over6 scales"}}) {
      const auto q = reference::quantize(x.data(), ElementType::kFloat32, shape, gs, rule);
      report_row(side + name, reference::error_stats(x, reference::dequantize(q, gs)),
                 2.0 * kHeads * (kDim / 2 + kDim / 16));
    }
  }
  std::cout << "\n   rel L2 is ||dequantized - x|| / ||x|| over the tensor; max |err| the largest single error.\n"
            << "   The reference point is FP8 E4M3, the 8-bit KV cache engines ship today: NVFP4 keeps about 1/10\n"
            << "   relative error, some 3x FP8's, at 1152 B per token (3.56x smaller than BF16, 1.8x smaller than FP8).\n"
            << "   A layout bug is another order: section 2's misread V comes back at about 0.8.\n\n";

  tell("2. the broken layouts", 0.3);
  std::cout << "2. The bug class nvfp4kv exists to stop\n"
            << "   vLLM's packed NHD cache, as its writer and its reader address it (H=1, D=128, N=16):\n";
  for (const char* name : {"vllm-packed-nhd-writer-sm12x", "vllm-packed-nhd-reader-sm120"}) {
    const Layout l = instantiate(preset_spec(name), {1, 1, 16, 1, 128});
    std::cout << "   " << name << ": " << check(l).report.summary() << "\n";
  }
  {
    const DimsOverride dims{1, 1, 16, 1, 128};
    const Layout w = instantiate(preset_spec("vllm-packed-nhd-writer-sm12x"), dims);
    const Layout r = instantiate(preset_spec("vllm-packed-nhd-reader-sm120"), dims);
    const CompareReport c = compare(w, r, 2);
    std::cout << "   writer vs reader: " << c.misplaced << " of " << c.elements << " elements placed differently\n"
              << "   (nvfp4kv layout show vllm-packed-nhd-writer-sm12x --heads 1 --head-dim 128 --tokens-per-page 16\n"
              << "    --pages 1 draws the page)\n\n";
  }

  {  // vLLM issue #50084: upstream's writer interleaves V scales on every GPU; SM120 reads them linearly.
    const int64_t pages = (tokens + 15) / 16;
    const DimsOverride dims{1, pages, 16, kHeads, kDim};
    const ValidLayout writer = validate(instantiate(preset_spec("vllm-legacy-hnd-writer-upstream"), dims));
    const ValidLayout reader = validate(instantiate(preset_spec("vllm-legacy-hnd-reader-sm120"), dims));
    const auto v = harness::realistic_kv(tokens, kHeads, kDim, false, seed + 1);
    float amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    const float gs = recommend_global_scale(amax);
    std::vector<int64_t> slots(static_cast<size_t>(tokens));
    std::vector<int32_t> table(static_cast<size_t>(pages));
    for (int64_t i = 0; i < tokens; ++i) slots[size_t(i)] = i;
    for (int64_t p = 0; p < pages; ++p) table[size_t(p)] = int32_t(p);
    reference::HostCache cache(writer.layout(), 0);
    StoreArgs store;
    store.rows = {v.data(), v.data(), tokens, kHeads * kDim};
    store.type = ElementType::kFloat32;
    store.slots = slots.data();
    store.slots_are_int64 = true;
    store.k_global_scale = &gs;
    store.v_global_scale = &gs;
    reference::store(writer, cache.buffers, store);
    const auto read_v = [&](const ValidLayout& as) {
      return reference::gather_sequence(as, cache.buffers, table, tokens, 0, gs, gs).v;
    };
    const double ok = reference::error_stats(v, read_v(writer)).rel_l2;
    const double bad = reference::error_stats(v, read_v(reader)).rel_l2;
    std::cout << "   V written by vLLM's upstream writer (V scales interleaved for SM100), read back (CPU reference):\n"
              << "     as SM100's trtllm-gen reads it      rel L2 " << std::setprecision(3) << ok << "\n"
              << "     as SM120's XQA/FA2 reads it         rel L2 " << bad
              << "   <- vLLM #50084: nothing crashes; answers degrade\n"
              << "   nvfp4kv layout compare vllm-legacy-hnd-writer-upstream vllm-legacy-hnd-reader-sm120 --pages 1\n"
              << "   --heads 8 --head-dim 128 --tokens-per-page 16 names every misplaced scale (V scales only).\n\n";
  }

  std::cout << "3. A round trip through nvfp4kv's native layout (64 pages x 16 tokens, 8 heads, D 128)\n";
  const ValidLayout native = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 64, 16, 8, 128}));
  harness::RoundtripOptions opt;
  opt.seed = seed;
  opt.use_gpu = !a.flag("cpu-only");
  tell("3. the round trip", 0.5);
  const bool ok = print_roundtrip(harness::roundtrip(native, opt), std::cout);
  tell("4. attention over the cache", 0.7);
  attention_sections(a.flag("cpu-only"), seed);
  std::cout << "\nNext: nvfp4kv layout presets | nvfp4kv layout check <your layout.json> | nvfp4kv roundtrip --layout ...\n"
            << "      nvfp4kv bench decode --batch 8 --context 32768   (decode attention on the GPU)\n";
  return ok ? kExitOk : kExitVerdict;
}

}  // namespace nvfp4kv::cli
