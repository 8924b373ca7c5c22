// Store and gather throughput on the GPU, with the ceilings measured in the
// same run: a streaming-read kernel (16-byte loads) and a device copy.
// Inputs are random (never zeros); each timed configuration is first checked
// byte for byte against the CPU reference.
//   usage: nvfp4kv_bench [--markdown FILE]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/cache.hpp"

using namespace nvfp4kv;

#define CHECK_CUDA(call)                                                                    \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

namespace {

__global__ void stream_read(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads; practically never taken
}

template <typename F>
float median_ms(F&& launch, int reps = 30, int warmup = 5) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    launch();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CHECK_CUDA(cudaGetLastError());
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

struct Row {
  std::string what;
  double ms, bytes, tbs, vs_copy;
};

std::vector<Row> rows;
double copy_tbs = 0;

void add(const std::string& what, double ms, double bytes) {
  const double tbs = bytes / (ms * 1e-3) / 1e12;
  rows.push_back({what, ms, bytes, tbs, copy_tbs > 0 ? tbs / copy_tbs : 1.0});
  std::printf("  %-58s %9.4f ms %8.1f MB %6.2f TB/s\n", what.c_str(), ms, bytes / 1e6, tbs);
  std::fflush(stdout);
}

struct Case {
  ValidLayout layout;
  std::vector<uint8_t*> buffers;
  uint16_t *k = nullptr, *v = nullptr;
  int64_t *slots = nullptr;
  int32_t *table = nullptr, *cu = nullptr;
  uint16_t *kout = nullptr, *vout = nullptr;
  float* scales = nullptr;
  int64_t tokens = 0;
  CacheBuffers bufs() const {
    CacheBuffers b;
    for (size_t i = 0; i < buffers.size(); ++i) b.ptr[i] = buffers[i];
    b.count = int(buffers.size());
    return b;
  }
};

StoreArgs store_args(const Case& c, int64_t tokens, ScaleRule rule) {
  const CacheDims& d = c.layout.layout().dims;
  StoreArgs a;
  a.rows = {c.k, c.v, tokens, d.heads * d.head_dim};
  a.slots = c.slots;
  a.slots_are_int64 = true;
  a.k_global_scale = c.scales;
  a.v_global_scale = c.scales + 1;
  a.rule = rule;
  return a;
}

// Tokens fill whole pages in shuffled order, as a prefill of many sequences would.
Case make_case(const char* preset, int64_t tokens, int64_t heads, int64_t dim, uint64_t seed) {
  const int64_t n = 16, pages = (tokens + n - 1) / n + 8;
  Case c{validate(instantiate(preset_spec(preset), {1, pages, n, heads, dim}))};
  c.tokens = tokens;
  const Layout& l = c.layout.layout();
  for (const Buffer& b : l.buffers) {
    uint8_t* p;
    CHECK_CUDA(cudaMalloc(&p, size_t(b.bytes)));
    CHECK_CUDA(cudaMemset(p, 0x5A, size_t(b.bytes)));
    c.buffers.push_back(p);
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const size_t elems = size_t(tokens * heads * dim);
  std::vector<uint16_t> hk(elems), hv(elems);
  for (size_t i = 0; i < elems; ++i) {
    hk[i] = float_to_bf16(nd(rng));
    hv[i] = float_to_bf16(nd(rng) * 0.5f);
  }
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) slots[size_t(i)] = int64_t(order[size_t(i / n)]) * n + i % n;
  std::vector<int32_t> table(order.begin(), order.begin() + (tokens + n - 1) / n);
  const std::vector<int32_t> cu = {0, int32_t(tokens)};
  const float gs[2] = {recommend_global_scale(10.0f), recommend_global_scale(5.0f)};
  CHECK_CUDA(cudaMalloc(&c.k, elems * 2));
  CHECK_CUDA(cudaMalloc(&c.v, elems * 2));
  CHECK_CUDA(cudaMalloc(&c.kout, elems * 2));
  CHECK_CUDA(cudaMalloc(&c.vout, elems * 2));
  CHECK_CUDA(cudaMalloc(&c.slots, slots.size() * 8));
  CHECK_CUDA(cudaMalloc(&c.table, table.size() * 4));
  CHECK_CUDA(cudaMalloc(&c.cu, 8));
  CHECK_CUDA(cudaMalloc(&c.scales, 8));
  CHECK_CUDA(cudaMemcpy(c.k, hk.data(), elems * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(c.v, hv.data(), elems * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(c.slots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(c.table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(c.cu, cu.data(), 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(c.scales, gs, 8, cudaMemcpyHostToDevice));
  // Correctness of exactly what is timed: the cache equals the CPU reference.
  reference::HostCache ref(l, 0x5A);
  reference::StoreParams sp{{hk.data(), hv.data(), tokens, heads * dim}, ElementType::kBFloat16, slots.data(), 0,
                            gs[0], gs[1], ScaleRule::kStandard};
  reference::store(c.layout, ref.buffers, sp);
  const Result r = store(c.layout, c.bufs(), store_args(c, tokens, ScaleRule::kStandard), nullptr);
  if (!r.ok()) {
    std::fprintf(stderr, "store: %s\n", r.message.c_str());
    std::exit(1);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  for (size_t b = 0; b < l.buffers.size(); ++b) {
    std::vector<uint8_t> got(size_t(l.buffers[b].bytes));
    CHECK_CUDA(cudaMemcpy(got.data(), c.buffers[b], got.size(), cudaMemcpyDeviceToHost));
    if (got != ref.storage[b]) {
      std::fprintf(stderr, "%s: GPU cache differs from the reference; not timing it\n", preset);
      std::exit(1);
    }
  }
  return c;
}

void free_case(Case& c) {
  for (uint8_t* p : c.buffers) cudaFree(p);
  for (void* p : {(void*)c.k, (void*)c.v, (void*)c.kout, (void*)c.vout, (void*)c.slots, (void*)c.table, (void*)c.cu,
                  (void*)c.scales})
    cudaFree(p);
}

double cache_bytes(const Case& c) {
  const CacheDims& d = c.layout.layout().dims;
  return double(c.tokens) * 2 * d.heads * (d.data_bytes() + d.scale_bytes());
}
double row_bytes(const Case& c) {
  const CacheDims& d = c.layout.layout().dims;
  return double(c.tokens) * 2 * d.heads * d.head_dim * 2;
}

void bench_store(const char* preset, int64_t tokens, ScaleRule rule, uint64_t seed) {
  Case c = make_case(preset, tokens, 8, 128, seed);
  const StoreArgs a = store_args(c, tokens, rule);
  const CacheBuffers b = c.bufs();
  const float ms = median_ms([&] { store(c.layout, b, a, nullptr); });
  add(std::string("store ") + (rule == ScaleRule::kStandard ? "" : "4over6 ") + std::to_string(tokens) +
          " tok x 8 heads x D128, " + preset,
      ms, row_bytes(c) + cache_bytes(c));
  free_case(c);
}

void bench_gather(const char* preset, int64_t tokens, uint64_t seed) {
  Case c = make_case(preset, tokens, 8, 128, seed);
  GatherArgs g{c.table, (tokens + 15) / 16, c.cu, 1, 0, c.scales, c.scales + 1, ElementType::kBFloat16,
               c.kout, c.vout, nullptr};
  const CacheBuffers b = c.bufs();
  const float ms = median_ms([&] { gather(c.layout, b, g, nullptr); });
  add("gather " + std::to_string(tokens) + " tok x 8 heads x D128 -> bf16, " + preset, ms, row_bytes(c) + cache_bytes(c));
  free_case(c);
}

void bench_decode_store(int64_t tokens) {
  Case c = make_case("nvfp4kv-native", 65536, 8, 128, 77);
  const StoreArgs a = store_args(c, tokens, ScaleRule::kStandard);
  const CacheBuffers b = c.bufs();
  // One launch per step: graph-captured 100 steps, time per step.
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 100; ++i) store(c.layout, b, a, s);
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = median_ms([&] { CHECK_CUDA(cudaGraphLaunch(exec, s)); CHECK_CUDA(cudaStreamSynchronize(s)); }) / 100;
  const float eager = median_ms([&] { store(c.layout, b, a, nullptr); });
  c.tokens = tokens;
  add("decode-step store, " + std::to_string(tokens) + " tok (1 launch), graph replay", ms, row_bytes(c) + cache_bytes(c));
  add("decode-step store, " + std::to_string(tokens) + " tok (1 launch), eager + event", eager, row_bytes(c) + cache_bytes(c));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  free_case(c);
}

}  // namespace

int main(int argc, char** argv) {
  const char* md = nullptr;
  bool profile_only = false;  // --profile: just the 65536-token store and gather, for ncu
  bool quick = false;         // --quick: ceilings, store and gather at 16384 and 65536 tokens, decode step
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--markdown") && i + 1 < argc) md = argv[++i];
    else if (!std::strcmp(argv[i], "--profile")) profile_only = true;
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else {
      std::fprintf(stderr, "usage: nvfp4kv_bench [--markdown FILE] [--profile | --quick]\n");
      return 2;
    }
  }
  std::string why;
  if (!cuda_device_available(&why)) {
    std::printf("no GPU benchmark: %s\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);
  if (profile_only) {
    bench_store("nvfp4kv-native", 65536, ScaleRule::kStandard, 2);
    bench_gather("nvfp4kv-native", 65536, 7);
    return 0;
  }
  // Ceilings, 2 GiB buffers of random bytes (well past the L2).
  const size_t big = size_t(2) << 30;
  uint8_t *src, *dst;
  uint32_t* sink;
  CHECK_CUDA(cudaMalloc(&src, big));
  CHECK_CUDA(cudaMalloc(&dst, big));
  CHECK_CUDA(cudaMalloc(&sink, 4));
  {
    std::vector<uint8_t> h(size_t(64) << 20);
    std::mt19937_64 rng(3);
    for (auto& x : h) x = uint8_t(rng());
    for (size_t o = 0; o < big; o += h.size()) CHECK_CUDA(cudaMemcpy(src + o, h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  const float read_ms = median_ms([&] { stream_read<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4*>(src), big / 16, sink); });
  const float copy_ms = median_ms([&] { CHECK_CUDA(cudaMemcpyAsync(dst, src, big, cudaMemcpyDeviceToDevice)); });
  add("ceiling: streaming read, 16-B loads, 2 GiB", read_ms, double(big));
  add("ceiling: device copy 2 GiB (read + write counted)", copy_ms, 2.0 * double(big));
  copy_tbs = rows.back().tbs;
  for (auto& r : rows) r.vs_copy = r.tbs / copy_tbs;
  cudaFree(src);
  cudaFree(dst);
  bench_store("nvfp4kv-native", 16384, ScaleRule::kStandard, 1);
  bench_store("nvfp4kv-native", 65536, ScaleRule::kStandard, 2);
  if (!quick) {
    bench_store("nvfp4kv-native", 65536, ScaleRule::kFourOverSix, 3);
    bench_store("vllm-legacy-hnd", 65536, ScaleRule::kStandard, 4);
    bench_store("flashinfer-nhd", 65536, ScaleRule::kStandard, 5);
  }
  bench_gather("nvfp4kv-native", 16384, 6);
  bench_gather("nvfp4kv-native", 65536, 7);
  if (!quick) bench_gather("vllm-legacy-hnd", 65536, 8);
  bench_decode_store(64);
  std::printf("\n| what | ms | MB moved | TB/s | of copy |\n|---|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %.4f | %.1f | %.2f | %.0f%% |\n", r.what.c_str(), r.ms, r.bytes / 1e6, r.tbs, 100 * r.vs_copy);
  if (md) {
    FILE* f = std::fopen(md, "w");
    if (f) {
      std::fprintf(f, "GPU: %s, %d SMs\n\n| what | ms | MB moved | TB/s | of copy |\n|---|---:|---:|---:|---:|\n", prop.name,
                   prop.multiProcessorCount);
      for (const Row& r : rows)
        std::fprintf(f, "| %s | %.4f | %.1f | %.2f | %.0f%% |\n", r.what.c_str(), r.ms, r.bytes / 1e6, r.tbs, 100 * r.vs_copy);
      std::fclose(f);
    }
  }
  return 0;
}
