// Store and gather throughput on the GPU, with the ceilings measured in the
// same run: a streaming-read kernel (16-byte loads) and a device copy.
// Inputs are random (never zeros); each timed configuration is first checked
// byte for byte against the CPU reference.
//   usage: nvfp4kv_bench [--markdown FILE] [--profile | --quick | --formats]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/harness/decode_bench.hpp"
#include "nvfp4kv/harness/device_buffer.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/cache.hpp"

using namespace nvfp4kv;
using harness::DeviceBuffer;

namespace {

template <typename F>
float median_ms(F&& launch, int reps = 30, int warmup = 5) {
  cudaEvent_t a, b;
  NVFP4KV_CUDA_CHECK(cudaEventCreate(&a));
  NVFP4KV_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    NVFP4KV_CUDA_CHECK(cudaEventRecord(a));
    launch();
    NVFP4KV_CUDA_CHECK(cudaEventRecord(b));
    NVFP4KV_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    NVFP4KV_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  NVFP4KV_CUDA_CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

struct Row {
  std::string what;
  double ms, bytes, tbs, vs_copy;
  double vs_plain = 0;  // time against the same operation on a plain cache (the format rows)
};

std::vector<Row> rows;
double copy_tbs = 0;

void add(const std::string& what, double ms, double bytes) {
  const double tbs = bytes / (ms * 1e-3) / 1e12;
  rows.push_back({what, ms, bytes, tbs, copy_tbs > 0 ? tbs / copy_tbs : 1.0, 0});
  std::printf("  %-58s %9.4f ms %8.1f MB %6.2f TB/s\n", what.c_str(), ms, bytes / 1e6, tbs);
  std::fflush(stdout);
}

void require(const Result& r) {
  if (!r.ok()) throw Error(r.message);
}

// A cache filled by one store of `tokens` random rows into whole pages in a
// shuffled order, as a prefill of many sequences would; checked byte for byte
// against the CPU reference before anything is timed.
struct Case {
  ValidLayout layout;
  std::unique_ptr<harness::DeviceCache> cache;
  std::unique_ptr<DeviceBuffer<uint16_t>> k, v, kout, vout;
  std::unique_ptr<DeviceBuffer<int64_t>> slots;
  std::unique_ptr<DeviceBuffer<int32_t>> table, cu;
  std::unique_ptr<DeviceBuffer<float>> scales;
  std::unique_ptr<harness::FormatVectors> vectors;  // the format's mu and lambda on the device
  int64_t tokens = 0;

  StoreArgs store_args(int64_t n, ScaleRule rule) const {
    const CacheDims& d = layout.layout().dims;
    StoreArgs a;
    a.rows = {k->get(), v->get(), n, d.heads * d.head_dim};
    a.slots = slots->get();
    a.slots_are_int64 = true;
    a.k_global_scale = scales->get();
    a.v_global_scale = scales->get() + 1;
    a.rule = rule;
    vectors->give(a);
    return a;
  }

  // Gathers the one sequence the store wrote, to bf16 rows.
  GatherArgs gather_args() const {
    GatherArgs g;
    g.batch = {.block_table = table->get(), .block_table_stride = int64_t(table->size()), .cu_seqlens = cu->get(),
               .batch = 1};
    g.k_global_scale = scales->get();
    g.v_global_scale = scales->get() + 1;
    g.k_out = kout->get();
    g.v_out = vout->get();
    vectors->give(g);
    return g;
  }
};

// A cache of `layout` filled by one store of `tokens` random rows into whole pages in a
// shuffled order, as a prefill of many sequences would; checked byte for byte against the
// CPU reference before anything is timed. The layout's pages must hold the tokens.
Case make_case(ValidLayout layout, int64_t tokens, uint64_t seed, const std::string& what) {
  Case c{std::move(layout)};
  c.tokens = tokens;
  const Layout& l = c.layout.layout();
  const CacheDims& d = l.dims;
  c.cache = std::make_unique<harness::DeviceCache>(l, 0x5A);
  const harness::Rows rows = harness::make_rows(d, tokens, ElementType::kBFloat16, harness::RowPattern::kNormal, seed);
  const std::vector<int64_t> slots = harness::paged_slots(d, tokens, seed + 1, false);
  const std::vector<int32_t> table = harness::pages_of(d, slots);
  // FP8 sides: the per-tensor scale amax / 448 (docs/format.md).
  const auto scale_of = [&](Side side, float amax) { return d.fp8(side) ? amax / kE4M3Max : recommend_global_scale(amax); };
  const float gs[2] = {scale_of(Side::kK, rows.k_amax), scale_of(Side::kV, rows.v_amax)};
  c.k = std::make_unique<DeviceBuffer<uint16_t>>(DeviceBuffer<uint16_t>::from(rows.k));
  c.v = std::make_unique<DeviceBuffer<uint16_t>>(DeviceBuffer<uint16_t>::from(rows.v));
  c.kout = std::make_unique<DeviceBuffer<uint16_t>>(rows.k.size());
  c.vout = std::make_unique<DeviceBuffer<uint16_t>>(rows.k.size());
  c.slots = std::make_unique<DeviceBuffer<int64_t>>(DeviceBuffer<int64_t>::from(slots));
  c.table = std::make_unique<DeviceBuffer<int32_t>>(DeviceBuffer<int32_t>::from(table));
  c.cu = std::make_unique<DeviceBuffer<int32_t>>(DeviceBuffer<int32_t>::from({0, int32_t(tokens)}));
  c.scales = std::make_unique<DeviceBuffer<float>>(DeviceBuffer<float>::from({gs[0], gs[1]}));
  c.vectors = std::make_unique<harness::FormatVectors>(c.layout);
  // Correctness of exactly what is timed: the cache equals the CPU reference.
  reference::HostCache ref(l, 0x5A);
  StoreArgs host = c.store_args(tokens, ScaleRule::kStandard);
  host.rows = {rows.k.data(), rows.v.data(), tokens, rows.stride};
  host.slots = slots.data();
  host.k_global_scale = &gs[0];
  host.v_global_scale = &gs[1];
  host.k_mean = c.layout.format().has_k_mean() ? c.layout.format().k_mean.data() : nullptr;
  host.k_channel_scale = c.layout.format().has_k_channel_scale() ? c.layout.format().k_channel_scale.data() : nullptr;
  reference::store(c.layout, ref.buffers, host);
  require(store(c.layout, c.cache->view(), c.store_args(tokens, ScaleRule::kStandard), nullptr));
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  if (c.cache->download() != ref.storage) throw Error(what + ": GPU cache differs from the reference; not timing it");
  return c;
}

Case make_case(const char* preset, int64_t tokens, int64_t heads, int64_t dim, uint64_t seed) {
  const int64_t n = 16, pages = (tokens + n - 1) / n + 8;
  return make_case(validate(instantiate(preset_spec(preset), {1, pages, n, heads, dim})), tokens, seed, preset);
}

double cache_bytes(const Case& c) {
  const CacheDims& d = c.layout.layout().dims;
  return double(c.tokens) * d.heads * d.row_bytes();
}
double row_bytes(const Case& c) {
  const CacheDims& d = c.layout.layout().dims;
  return double(c.tokens) * 2 * d.heads * d.head_dim * 2;
}

void bench_store(const char* preset, int64_t tokens, ScaleRule rule, uint64_t seed) {
  Case c = make_case(preset, tokens, 8, 128, seed);
  const StoreArgs a = c.store_args(tokens, rule);
  const CacheBuffers b = c.cache->view();
  const float ms = median_ms([&] { require(store(c.layout, b, a, nullptr)); });
  add(std::string("store ") + (rule == ScaleRule::kStandard ? "" : "4over6 ") + std::to_string(tokens) +
          " tok x 8 heads x D128, " + preset,
      ms, row_bytes(c) + cache_bytes(c));
}

void bench_gather(const char* preset, int64_t tokens, uint64_t seed) {
  Case c = make_case(preset, tokens, 8, 128, seed);
  const GatherArgs g = c.gather_args();
  const CacheBuffers b = c.cache->view();
  const float ms = median_ms([&] { require(gather(c.layout, b, g, nullptr)); });
  add("gather " + std::to_string(tokens) + " tok x 8 heads x D128 -> bf16, " + preset, ms, row_bytes(c) + cache_bytes(c));
}

// One store launch per decode step: 100 steps captured in a graph, the time per step.
float graph_step_ms(const Case& c, const StoreArgs& a) {
  const CacheBuffers b = c.cache->view();
  cudaStream_t s;
  NVFP4KV_CUDA_CHECK(cudaStreamCreate(&s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  NVFP4KV_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 100; ++i) require(store(c.layout, b, a, s));
  NVFP4KV_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  NVFP4KV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float ms =
      median_ms([&] { NVFP4KV_CUDA_CHECK(cudaGraphLaunch(exec, s)); NVFP4KV_CUDA_CHECK(cudaStreamSynchronize(s)); }) / 100;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return ms;
}

void bench_decode_store(int64_t tokens) {
  Case c = make_case("nvfp4kv-native", 65536, 8, 128, 77);
  const StoreArgs a = c.store_args(tokens, ScaleRule::kStandard);
  const CacheBuffers b = c.cache->view();
  const float ms = graph_step_ms(c, a);
  const float eager = median_ms([&] { require(store(c.layout, b, a, nullptr)); });
  c.tokens = tokens;
  add("decode-step store, " + std::to_string(tokens) + " tok (1 launch), graph replay", ms, row_bytes(c) + cache_bytes(c));
  add("decode-step store, " + std::to_string(tokens) + " tok (1 launch), eager + event", eager, row_bytes(c) + cache_bytes(c));
}

// Store, gather and the decode-step store for each cache format beside plain NVFP4, at one
// head dim: what a format costs the writer and the reader (issue 23: store within 5 % of
// plain). Every case is checked against the CPU reference before it is timed.
struct FormatCase {
  const char* transform;  // harness::transform_format's words (bench_layout makes the layout hold them)
  ScaleRule k_rule;
};
constexpr FormatCase kFormatCases[] = {
    {"plain", ScaleRule::kStandard},         {"rotate-k", ScaleRule::kStandard},
    {"rotate-v", ScaleRule::kStandard},      {"smooth-k", ScaleRule::kStandard},
    {"rotate-k+rotate-v+smooth-k", ScaleRule::kStandard},
    {"plain", ScaleRule::kFourOverSix},  // K 4over6, V standard: the rules differ, the row kernel
    {"fp8-k", ScaleRule::kStandard},         {"fp8-k+fp8-v", ScaleRule::kStandard},
    {"scale-k", ScaleRule::kStandard},  // K's channel scale lambda alone
    {"rotate-k+smooth-k+scale-k", ScaleRule::kFourOverSix},  // the query-scaled K mode (docs/accuracy.md)
};

ValidLayout format_layout(const FormatCase& f, int64_t pages, int64_t heads, int64_t dim) {
  const ValidLayout v = harness::bench_layout("nvfp4kv-native", f.transform, pages, 16, heads, dim);
  CacheFormat format = v.format();
  if (format.layers.empty()) format.layers.resize(1);
  format.layers[0].k.rule = f.k_rule;
  return with_format(v, std::move(format));
}

std::string format_name(const FormatCase& f) {
  return std::string(f.transform) + (f.k_rule == ScaleRule::kFourOverSix ? ", K 4over6" : "");
}

void bench_formats(int64_t dim) {
  const int64_t tokens = 65536, heads = 8, pages = tokens / 16 + 8;
  float plain[3] = {0, 0, 0};
  for (const FormatCase& f : kFormatCases) {
    const std::string name = format_name(f);
    Case c = make_case(format_layout(f, pages, heads, dim), tokens, 11, name);
    const CacheBuffers b = c.cache->view();
    const StoreArgs a = c.store_args(tokens, ScaleRule::kStandard);
    const GatherArgs g = c.gather_args();
    const float ms[3] = {median_ms([&] { require(store(c.layout, b, a, nullptr)); }),
                         median_ms([&] { require(gather(c.layout, b, g, nullptr)); }),
                         graph_step_ms(c, c.store_args(64, ScaleRule::kStandard))};
    if (&f == &kFormatCases[0]) std::copy(ms, ms + 3, plain);
    const std::string shape = std::to_string(tokens) + " tok x 8 heads x D" + std::to_string(dim) + ", " + name;
    const double moved = row_bytes(c) + cache_bytes(c);
    add("format store " + shape, ms[0], moved);
    rows.back().vs_plain = ms[0] / plain[0];
    add("format gather " + shape, ms[1], moved);
    rows.back().vs_plain = ms[1] / plain[1];
    c.tokens = 64;
    add("format decode-step store, 64 tok, graph replay, D" + std::to_string(dim) + ", " + name, ms[2],
        row_bytes(c) + cache_bytes(c));
    rows.back().vs_plain = ms[2] / plain[2];
  }
}

}  // namespace

int run(int argc, char** argv) {
  const char* md = nullptr;
  bool profile_only = false;  // --profile: just the 65536-token store and gather, for ncu
  bool quick = false;         // --quick: ceilings, store and gather at 16384 and 65536 tokens, decode step
  bool formats = false;       // --formats: ceilings, then store and gather of each cache format beside plain
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--markdown") && i + 1 < argc) md = argv[++i];
    else if (!std::strcmp(argv[i], "--profile")) profile_only = true;
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--formats")) formats = true;
    else {
      std::fprintf(stderr, "usage: nvfp4kv_bench [--markdown FILE] [--profile | --quick | --formats]\n");
      return 2;
    }
  }
  std::string why;
  if (!cuda_device_available(&why)) {
    std::printf("no GPU benchmark: %s\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop;
  NVFP4KV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);
  if (profile_only) {
    bench_store("nvfp4kv-native", 65536, ScaleRule::kStandard, 2);
    bench_gather("nvfp4kv-native", 65536, 7);
    return 0;
  }
  // Ceilings, 2 GiB buffers of random bytes (well past the L2).
  const size_t big = size_t(2) << 30;
  uint8_t *src, *dst;
  NVFP4KV_CUDA_CHECK(cudaMalloc(&src, big));
  NVFP4KV_CUDA_CHECK(cudaMalloc(&dst, big));
  {
    std::vector<uint8_t> h(size_t(64) << 20);
    std::mt19937_64 rng(3);
    for (auto& x : h) x = uint8_t(rng());
    for (size_t o = 0; o < big; o += h.size()) NVFP4KV_CUDA_CHECK(cudaMemcpy(src + o, h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  const double read_ms = double(big) / (harness::read_ceiling_tbs() * 1e12) * 1e3;  // the same 2 GiB streaming read
  const float copy_ms = median_ms([&] { NVFP4KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, big, cudaMemcpyDeviceToDevice)); });
  add("ceiling: streaming read, 16-B loads, 2 GiB", read_ms, double(big));
  add("ceiling: device copy 2 GiB (read + write counted)", copy_ms, 2.0 * double(big));
  copy_tbs = rows.back().tbs;
  for (auto& r : rows) r.vs_copy = r.tbs / copy_tbs;
  cudaFree(src);
  cudaFree(dst);
  if (formats) {
    bench_formats(128);
    bench_formats(64);
  } else {
    bench_store("nvfp4kv-native", 16384, ScaleRule::kStandard, 1);
    bench_store("nvfp4kv-native", 65536, ScaleRule::kStandard, 2);
    // Native layout version 1 (the standard code order) beside version 2 (fp16-split): what
    // re-encoding each data word costs the store and gather.
    bench_store("nvfp4kv-native-v1", 65536, ScaleRule::kStandard, 2);
    if (!quick) {
      bench_store("nvfp4kv-native", 65536, ScaleRule::kFourOverSix, 3);
      bench_store("vllm-legacy-hnd", 65536, ScaleRule::kStandard, 4);
      bench_store("flashinfer-nhd", 65536, ScaleRule::kStandard, 5);
    }
    bench_gather("nvfp4kv-native", 16384, 6);
    bench_gather("nvfp4kv-native", 65536, 7);
    bench_gather("nvfp4kv-native-v1", 65536, 7);
    if (!quick) bench_gather("vllm-legacy-hnd", 65536, 8);
    bench_decode_store(64);
  }
  const auto table = [&](FILE* f) {
    std::fprintf(f, "| what | ms | MB moved | TB/s | of copy |%s\n|---|---:|---:|---:|---:|%s\n", formats ? " time vs plain |" : "",
                 formats ? "---:|" : "");
    for (const Row& r : rows) {
      std::fprintf(f, "| %s | %.4f | %.1f | %.2f | %.0f%% |", r.what.c_str(), r.ms, r.bytes / 1e6, r.tbs, 100 * r.vs_copy);
      if (formats) r.vs_plain > 0 ? std::fprintf(f, " %+.1f%% |", 100 * (r.vs_plain - 1)) : std::fprintf(f, " |");
      std::fprintf(f, "\n");
    }
  };
  std::printf("\n");
  table(stdout);
  if (md) {
    FILE* f = std::fopen(md, "w");
    if (f) {
      std::fprintf(f, "GPU: %s, %d SMs\n\n", prop.name, prop.multiProcessorCount);
      table(f);
      std::fclose(f);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvfp4kv_bench: %s\n", e.what());
    return 1;
  }
}
