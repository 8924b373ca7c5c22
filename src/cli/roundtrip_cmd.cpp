// nvfp4kv roundtrip: store then gather through one layout, on the CPU reference
// and on the GPU when there is one, and check every byte of every region.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>

#include "cli.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "nvfp4kv/reference/quantize.hpp"
#include "roundtrip.hpp"
#if defined(NVFP4KV_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "nvfp4kv/api/kv_cache.hpp"
#endif

namespace nvfp4kv::cli {
namespace {

constexpr uint8_t kPoison = 0xA5;

struct Workload {
  int64_t tokens = 0;
  std::vector<uint16_t> k, v;  // bf16 (tokens, heads, D)
  std::vector<int64_t> slots;
  std::vector<int32_t> block_table;  // the used pages in slot order: one sequence, for gather
  float k_gs = 1, v_gs = 1;
};

// Rows where group g of each row has magnitude about g + 1, so a scale read
// from the wrong group is unmistakable; signs and mantissas random.
Workload make_workload(const CacheDims& d, const RoundtripOptions& opt) {
  Workload w;
  const int64_t capacity = d.pages * d.tokens_per_page;
  w.tokens = opt.tokens > 0 ? std::min(opt.tokens, capacity) : std::min<int64_t>(std::max<int64_t>(capacity * 3 / 4, 1), 4096);
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  const int64_t n = w.tokens * d.heads * d.head_dim;
  w.k.resize(size_t(n));
  w.v.resize(size_t(n));
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float g = float((i % d.head_dim) / kBlockSize + 1);
    const float kx = (rng() & 1 ? -1.0f : 1.0f) * u(rng) * g, vx = (rng() & 1 ? -1.0f : 1.0f) * u(rng) * g * 0.25f;
    w.k[size_t(i)] = float_to_bf16(kx);
    w.v[size_t(i)] = float_to_bf16(vx);
    amax = std::max(amax, std::fabs(kx));
  }
  w.k_gs = recommend_global_scale(amax);
  w.v_gs = recommend_global_scale(amax * 0.25f);
  // Whole pages in a shuffled order, tokens in page order: what a paged engine does.
  std::vector<int32_t> pages(size_t(d.pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  const int64_t used_pages = (w.tokens + d.tokens_per_page - 1) / d.tokens_per_page;
  w.block_table.assign(pages.begin(), pages.begin() + used_pages);
  for (int64_t i = 0; i < w.tokens; ++i)
    w.slots.push_back(int64_t(w.block_table[size_t(i / d.tokens_per_page)]) * d.tokens_per_page + i % d.tokens_per_page);
  // One padding slot and one beyond capacity, which both paths must skip.
  if (w.tokens >= 4) {
    w.slots[1] = -1;
    w.slots[2] = capacity + 5;
  }
  return w;
}

struct RegionTally {
  int64_t bytes_ok = 0, bytes_bad = 0;
};

// Every byte a stored token owns must equal the dense reference quantization;
// every other byte must still be poison.
std::array<RegionTally, kRegionCount> audit(const ValidLayout& valid, const reference::HostCache& cache,
                                            const Workload& w, const reference::QuantizedTensor& qk,
                                            const reference::QuantizedTensor& qv, int64_t& poison_bad) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  std::array<RegionTally, kRegionCount> t{};
  std::vector<std::vector<uint8_t>> owned;
  for (const auto& s : cache.storage) owned.emplace_back(s.size(), 0);
  for (int64_t i = 0; i < w.tokens; ++i) {
    const int64_t slot = w.slots[size_t(i)];
    if (slot < 0 || slot >= d.pages * d.tokens_per_page) continue;
    for (Region r : kAllRegions) {
      const auto& q = (r == Region::kKData || r == Region::kKScale) ? qk : qv;
      const auto& src = is_scale(r) ? q.scales : q.data;
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t c = 0; c < d.columns(r); ++c) {
          const Coord co{0, slot / d.tokens_per_page, slot % d.tokens_per_page, h, c};
          const int32_t b = l.region(r).buffer;
          const int64_t off = l.offset(r, co);
          owned[size_t(b)][size_t(off)] = 1;
          const bool ok = cache.storage[size_t(b)][size_t(off)] == src[size_t((i * d.heads + h) * d.columns(r) + c)];
          (ok ? t[size_t(r)].bytes_ok : t[size_t(r)].bytes_bad)++;
        }
    }
  }
  poison_bad = 0;
  for (size_t b = 0; b < owned.size(); ++b)
    for (size_t i = 0; i < owned[b].size(); ++i) poison_bad += (!owned[b][i] && cache.storage[b][i] != kPoison);
  return t;
}

void print_row(std::ostream& out, const std::string& what, const std::string& cpu, const std::string& gpu) {
  out << "  " << std::left << std::setw(22) << what << std::setw(34) << cpu << gpu << std::right << "\n";
}

std::string tally_text(const RegionTally& t) {
  std::ostringstream s;
  if (t.bytes_bad == 0) s << "ok, " << t.bytes_ok << " bytes";
  else s << "FAIL, " << t.bytes_bad << " of " << t.bytes_ok + t.bytes_bad << " bytes wrong";
  return s.str();
}

#if defined(NVFP4KV_HAVE_CUDA)
struct GpuOutcome {
  bool ran = false;
  std::string why;
  std::vector<std::vector<uint8_t>> cache;
  std::vector<uint16_t> k, v;
  DeviceStatus status;
};

#define NVFP4KV_RT_CUDA(call)                                               \
  do {                                                                      \
    const cudaError_t e_ = (call);                                          \
    if (e_ != cudaSuccess) {                                                \
      g.why = std::string(#call) + ": " + cudaGetErrorString(e_);           \
      return g;                                                             \
    }                                                                       \
  } while (0)

GpuOutcome run_gpu(const ValidLayout& valid, const Workload& w, std::vector<int32_t>& cu) {
  GpuOutcome g;
  if (!cuda_device_available(&g.why)) return g;
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  CacheBuffers bufs;
  bufs.count = int(l.buffers.size());
  std::vector<void*> owned;
  auto alloc = [&](size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) == cudaSuccess) owned.push_back(p);
    return p;
  };
  struct Free {
    std::vector<void*>& v;
    ~Free() {
      for (void* p : v) cudaFree(p);
    }
  } freer{owned};
  for (size_t b = 0; b < l.buffers.size(); ++b) {
    bufs.ptr[b] = static_cast<uint8_t*>(alloc(size_t(l.buffers[b].bytes)));
    if (!bufs.ptr[b]) {
      g.why = "cudaMalloc of the cache failed";
      return g;
    }
    NVFP4KV_RT_CUDA(cudaMemset(bufs.ptr[b], kPoison, size_t(l.buffers[b].bytes)));
  }
  const size_t row_bytes = w.k.size() * 2;
  void* dk = alloc(row_bytes);
  void* dv = alloc(row_bytes);
  void* dslots = alloc(w.slots.size() * 8);
  auto* scales = static_cast<float*>(alloc(2 * sizeof(float)));
  auto* status = static_cast<DeviceStatus*>(alloc(sizeof(DeviceStatus)));
  auto* bt = static_cast<int32_t*>(alloc(w.block_table.size() * 4));
  auto* dcu = static_cast<int32_t*>(alloc(cu.size() * 4));
  const size_t out_elems = size_t(w.tokens * d.heads * d.head_dim);
  void* kout = alloc(out_elems * 2);
  void* vout = alloc(out_elems * 2);
  if (!dk || !dv || !dslots || !scales || !status || !bt || !dcu || !kout || !vout) {
    g.why = "cudaMalloc failed";
    return g;
  }
  const float gs[2] = {w.k_gs, w.v_gs};
  NVFP4KV_RT_CUDA(cudaMemcpy(dk, w.k.data(), row_bytes, cudaMemcpyHostToDevice));
  NVFP4KV_RT_CUDA(cudaMemcpy(dv, w.v.data(), row_bytes, cudaMemcpyHostToDevice));
  NVFP4KV_RT_CUDA(cudaMemcpy(dslots, w.slots.data(), w.slots.size() * 8, cudaMemcpyHostToDevice));
  NVFP4KV_RT_CUDA(cudaMemcpy(scales, gs, sizeof gs, cudaMemcpyHostToDevice));
  NVFP4KV_RT_CUDA(cudaMemcpy(bt, w.block_table.data(), w.block_table.size() * 4, cudaMemcpyHostToDevice));
  NVFP4KV_RT_CUDA(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  NVFP4KV_RT_CUDA(cudaMemset(status, 0, sizeof(DeviceStatus)));
  NVFP4KV_RT_CUDA(cudaMemset(kout, 0xFF, out_elems * 2));
  NVFP4KV_RT_CUDA(cudaMemset(vout, 0xFF, out_elems * 2));
  StoreArgs s;
  s.rows = {dk, dv, w.tokens, d.heads * d.head_dim};
  s.type = ElementType::kBFloat16;
  s.slots = dslots;
  s.slots_are_int64 = true;
  s.k_global_scale = scales;
  s.v_global_scale = scales + 1;
  s.status = status;
  Result r = store(valid, bufs, s, nullptr);
  if (!r.ok()) {
    g.why = "store: " + r.message;
    return g;
  }
  GatherArgs ga;
  ga.block_table = bt;
  ga.block_table_stride = int64_t(w.block_table.size());
  ga.cu_seqlens = dcu;
  ga.batch = 1;
  ga.k_global_scale = scales;
  ga.v_global_scale = scales + 1;
  ga.out_type = ElementType::kBFloat16;
  ga.k_out = kout;
  ga.v_out = vout;
  ga.status = status;
  r = gather(valid, bufs, ga, nullptr);
  if (!r.ok()) {
    g.why = "gather: " + r.message;
    return g;
  }
  NVFP4KV_RT_CUDA(cudaDeviceSynchronize());
  for (size_t b = 0; b < l.buffers.size(); ++b) {
    g.cache.emplace_back(size_t(l.buffers[b].bytes));
    NVFP4KV_RT_CUDA(cudaMemcpy(g.cache.back().data(), bufs.ptr[b], g.cache.back().size(), cudaMemcpyDeviceToHost));
  }
  g.k.resize(out_elems);
  g.v.resize(out_elems);
  NVFP4KV_RT_CUDA(cudaMemcpy(g.k.data(), kout, out_elems * 2, cudaMemcpyDeviceToHost));
  NVFP4KV_RT_CUDA(cudaMemcpy(g.v.data(), vout, out_elems * 2, cudaMemcpyDeviceToHost));
  NVFP4KV_RT_CUDA(cudaMemcpy(&g.status, status, sizeof(DeviceStatus), cudaMemcpyDeviceToHost));
  g.ran = true;
  return g;
}
#endif

}  // namespace

bool roundtrip(const ValidLayout& valid, const RoundtripOptions& opt, std::ostream& out) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  if (d.layers != 1 && !l.buffers.empty() && !l.buffers[0].per_layer)
    out << "  (round trip uses layer 0)\n";
  const Workload w = make_workload(d, opt);
  const reference::DenseShape shape{w.tokens, d.heads, d.head_dim};
  const auto qk = reference::quantize(w.k.data(), ElementType::kBFloat16, shape, w.k_gs, ScaleRule::kStandard);
  const auto qv = reference::quantize(w.v.data(), ElementType::kBFloat16, shape, w.v_gs, ScaleRule::kStandard);
  // CPU reference through the layout.
  reference::HostCache cpu(l, kPoison);
  reference::StoreParams sp;
  sp.rows = {w.k.data(), w.v.data(), w.tokens, d.heads * d.head_dim};
  sp.type = ElementType::kBFloat16;
  sp.slots = w.slots.data();
  sp.k_global_scale = w.k_gs;
  sp.v_global_scale = w.v_gs;
  const StoreCounts counts = reference::store(valid, cpu.buffers, sp);
  int64_t cpu_poison_bad = 0;
  const auto cpu_tally = audit(valid, cpu, w, qk, qv, cpu_poison_bad);
  reference::GatherParams gp{w.block_table.data(), w.tokens, 0, w.k_gs, w.v_gs};
  const auto gathered = reference::gather(valid, cpu.buffers, gp);
  // Expected gather: the dense dequantization, except skipped slots, which hold poison.
  const auto dk = reference::dequantize(qk, w.k_gs), dv = reference::dequantize(qv, w.v_gs);
  const int64_t row = d.heads * d.head_dim;
  int64_t cpu_gather_bad = 0, compared = 0;
  for (int64_t i = 0; i < w.tokens; ++i) {
    const int64_t slot = w.slots[size_t(i)];
    if (slot < 0 || slot >= d.pages * d.tokens_per_page) continue;
    for (int64_t e = 0; e < row; ++e, ++compared) {
      cpu_gather_bad += gathered.k[size_t(i * row + e)] != dk[size_t(i * row + e)];
      cpu_gather_bad += gathered.v[size_t(i * row + e)] != dv[size_t(i * row + e)];
    }
  }
  bool ok = cpu_poison_bad == 0 && cpu_gather_bad == 0 && counts.padding == (w.tokens >= 4) &&
            counts.out_of_range == (w.tokens >= 4);
  for (const auto& t : cpu_tally) ok &= t.bytes_bad == 0;

  std::string gpu_note = "not run";
  std::array<std::string, kRegionCount> gpu_cells;
  std::string gpu_poison = "-", gpu_gather = "-", gpu_counts = "-";
#if defined(NVFP4KV_HAVE_CUDA)
  if (opt.use_gpu) {
    std::vector<int32_t> cu = {0, int32_t(w.tokens)};
    GpuOutcome g = run_gpu(valid, w, cu);
    if (!g.ran) {
      gpu_note = "not run: " + g.why;
      if (g.why.rfind("store:", 0) == 0 || g.why.rfind("gather:", 0) == 0) ok = false;  // the GPU refused: a failure
    } else {
      gpu_note = "GPU";
      reference::HostCache gpu_view(l, kPoison);
      for (size_t b = 0; b < g.cache.size(); ++b) gpu_view.storage[b] = g.cache[b];
      int64_t gpu_poison_bad = 0;
      const auto gt = audit(valid, gpu_view, w, qk, qv, gpu_poison_bad);
      for (Region r : kAllRegions) {
        gpu_cells[size_t(r)] = tally_text(gt[size_t(r)]);
        ok &= gt[size_t(r)].bytes_bad == 0;
      }
      gpu_poison = gpu_poison_bad == 0 ? "untouched" : "FAIL, " + std::to_string(gpu_poison_bad) + " bytes changed";
      int64_t bad = 0;
      for (int64_t i = 0; i < w.tokens; ++i) {
        const int64_t slot = w.slots[size_t(i)];
        if (slot < 0 || slot >= d.pages * d.tokens_per_page) continue;
        for (int64_t e = 0; e < row; ++e) {
          bad += g.k[size_t(i * row + e)] != float_to_bf16(dk[size_t(i * row + e)]);
          bad += g.v[size_t(i * row + e)] != float_to_bf16(dv[size_t(i * row + e)]);
        }
      }
      gpu_gather = bad == 0 ? "bit-exact" : "FAIL, " + std::to_string(bad) + " values differ";
      gpu_counts = std::to_string(g.status.padding) + " padding, " + std::to_string(g.status.out_of_range) +
                   " out of range";
      ok &= gpu_poison_bad == 0 && bad == 0 && int64_t(g.status.padding) == counts.padding &&
            int64_t(g.status.out_of_range) == counts.out_of_range;
    }
  }
#else
  gpu_note = "not run: built without CUDA";
#endif
  out << "  " << w.tokens << " tokens x " << d.heads << " heads x D " << d.head_dim << " (bf16) through \"" << l.name
      << "\", pages in shuffled order\n";
  print_row(out, "", "CPU reference", gpu_note);
  for (Region r : kAllRegions) print_row(out, region_name(r), tally_text(cpu_tally[size_t(r)]), gpu_cells[size_t(r)]);
  print_row(out, "bytes outside rows", cpu_poison_bad == 0 ? "untouched" : "FAIL, " + std::to_string(cpu_poison_bad) + " bytes changed", gpu_poison);
  print_row(out, "gather vs reference", cpu_gather_bad == 0 ? "bit-exact (" + std::to_string(2 * compared) + " values)" : "FAIL", gpu_gather);
  print_row(out, "skipped slots", std::to_string(counts.padding) + " padding, " + std::to_string(counts.out_of_range) + " out of range", gpu_counts);
  out << "  round trip: " << (ok ? "PASS" : "FAIL") << "\n";
  return ok;
}

int run_roundtrip(const std::vector<std::string>& argv) {
  const Args a(argv, {"cpu-only"}, {"layout", "layers", "pages", "heads", "head-dim", "tokens-per-page", "tokens", "seed"});
  if (!a.positional().empty()) throw UsageError("unexpected argument \"" + a.positional()[0] + "\"");
  const auto name = a.get("layout");
  if (!name) throw UsageError("roundtrip needs --layout LAYOUT");
  DimsOverride dims = dims_from(a);
  const LayoutSpec spec = load_spec(*name);
  if (!dims.pages && !spec.defaults.pages) dims.pages = 64;
  if (!dims.heads && !spec.defaults.heads) dims.heads = 8;
  if (!dims.head_dim && !spec.defaults.head_dim) dims.head_dim = 128;
  if (!dims.tokens_per_page && !spec.defaults.tokens_per_page) dims.tokens_per_page = 16;
  const Layout layout = instantiate(spec, dims);
  CheckResult res = check(layout);
  std::cout << "layout " << layout.name << ": " << res.report.summary() << "\n";
  if (!res.valid) return 1;
  RoundtripOptions opt;
  opt.tokens = a.integer("tokens").value_or(0);
  opt.seed = uint64_t(a.integer("seed").value_or(1));
  opt.use_gpu = !a.flag("cpu-only");
  return roundtrip(*res.valid, opt, std::cout) ? 0 : 1;
}

}  // namespace nvfp4kv::cli
