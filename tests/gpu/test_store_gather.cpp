// Store and gather on the GPU, bit for bit against the CPU reference, through
// every sound preset and the native layout. Skipped, with a message, without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/cache.hpp"

namespace nvfp4kv {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr uint8_t kPoison = 0x5A;

template <typename T = uint8_t>
struct DeviceArray {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceArray(size_t n) : count(n) {
    void* p = nullptr;
    ptr = cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) == cudaSuccess ? static_cast<T*>(p) : nullptr;
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr(o.ptr), count(o.count) { o.ptr = nullptr; }
  std::vector<T> to_host() const {
    std::vector<T> h(count);
    cudaMemcpy(h.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  static DeviceArray from(const std::vector<T>& h) {
    DeviceArray d(h.size());
    cudaMemcpy(d.ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
  }
};

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

struct Rows {
  std::vector<uint16_t> k, v;
  int64_t stride = 0;
};

// Random rows, or structured ones where group g of each row has magnitude g + 1
// (so a scale placed at the wrong group shows as a wrong magnitude).
Rows make_rows(const CacheDims& d, int64_t tokens, ElementType type, bool structured, std::mt19937_64& rng) {
  Rows r;
  r.stride = d.heads * d.head_dim + 8;  // a free token stride, 16-byte aligned
  r.k.assign(size_t(tokens * r.stride), 0xFFFF);
  r.v = r.k;
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < d.heads * d.head_dim; ++e) {
      const float g = float((e % d.head_dim) / 16 + 1);
      float kx = structured ? (rng() & 1 ? -g : g) * u(rng) : n(rng) * 3.0f;
      float vx = structured ? (rng() & 1 ? -g : g) * u(rng) * 0.5f : n(rng) * std::exp(n(rng));
      const auto conv = [&](float x) { return type == ElementType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x); };
      r.k[size_t(t * r.stride + e)] = conv(kx);
      r.v[size_t(t * r.stride + e)] = conv(vx);
    }
  return r;
}

// Store arguments for bf16 rows (tokens, heads * D contiguous) with int64 slots and
// K/V global scales at scales[0], scales[1].
StoreArgs bf16_store_args(const uint16_t* rows, int64_t tokens, int64_t row, const int64_t* slots, const float* scales,
                          DeviceStatus* status = nullptr) {
  StoreArgs a;
  a.rows = {rows, rows, tokens, row};
  a.slots = slots;
  a.slots_are_int64 = true;
  a.k_global_scale = scales;
  a.v_global_scale = scales + 1;
  a.status = status;
  return a;
}

struct Outcome {
  StoreCounts cpu;
  DeviceStatus gpu;
};

// Stores through the layout on both sides, compares every byte of every buffer
// (rows written and poison left alone), then gathers and compares bit for bit.
void store_and_gather(const ValidLayout& valid, int64_t layer, const std::vector<int64_t>& slots, ElementType type,
                      ScaleRule rule, bool structured, bool int64_slots, uint64_t seed, Outcome* outcome = nullptr) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  std::mt19937_64 rng(seed);
  const int64_t tokens = int64_t(slots.size());
  const Rows rows = make_rows(d, tokens, type, structured, rng);
  const float kgs = recommend_global_scale(structured ? float(d.head_dim / 16) : 12.0f);
  const float vgs = recommend_global_scale(structured ? float(d.head_dim / 32) : 20.0f);

  reference::HostCache cpu(l, kPoison);
  reference::StoreParams sp{{rows.k.data(), rows.v.data(), tokens, rows.stride}, type, slots.data(), layer, kgs, vgs, rule};
  const StoreCounts counts = reference::store(valid, cpu.buffers, sp);

  std::vector<std::unique_ptr<DeviceArray<>>> cache;
  CacheBuffers bufs;
  bufs.count = int(l.buffers.size());
  for (size_t b = 0; b < l.buffers.size(); ++b) {
    cache.push_back(std::make_unique<DeviceArray<>>(size_t(l.buffers[b].bytes)));
    ASSERT_NE(cache.back()->ptr, nullptr);
    CUDA_OK(cudaMemset(cache.back()->ptr, kPoison, size_t(l.buffers[b].bytes)));
    bufs.ptr[b] = cache.back()->ptr;
  }
  auto dk = DeviceArray<uint16_t>::from(rows.k), dv = DeviceArray<uint16_t>::from(rows.v);
  std::vector<int32_t> slots32(slots.begin(), slots.end());
  auto s64 = DeviceArray<int64_t>::from(slots);
  auto s32 = DeviceArray<int32_t>::from(slots32);
  auto scales = DeviceArray<float>::from({kgs, vgs});
  auto status = DeviceArray<DeviceStatus>::from({DeviceStatus{}});
  StoreArgs a;
  a.rows = {dk.ptr, dv.ptr, tokens, rows.stride};
  a.type = type;
  a.slots = int64_slots ? static_cast<const void*>(s64.ptr) : s32.ptr;
  a.slots_are_int64 = int64_slots;
  a.layer = layer;
  a.k_global_scale = scales.ptr;
  a.v_global_scale = scales.ptr + 1;
  a.rule = rule;
  a.status = status.ptr;
  const Result r = store(valid, bufs, a, nullptr);
  ASSERT_TRUE(r.ok()) << r.message;
  CUDA_OK(cudaDeviceSynchronize());
  // Provenance: the bytes the stored rows own, by the layout; everything else must stay poison.
  std::vector<std::vector<uint8_t>> owned;
  for (const Buffer& b : l.buffers) owned.emplace_back(size_t(b.bytes), 0);
  for (int64_t s : slots) {
    if (s < 0 || s >= d.pages * d.tokens_per_page) continue;
    for (Region reg : kAllRegions)
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t c = 0; c < d.columns(reg); ++c)
          owned[size_t(l.region(reg).buffer)][size_t(l.offset(reg, {layer, s / d.tokens_per_page, s % d.tokens_per_page, h, c}))] = 1;
  }
  for (size_t b = 0; b < l.buffers.size(); ++b) {
    const std::vector<uint8_t> got = cache[b]->to_host();
    const std::vector<uint8_t>& want = cpu.storage[b];
    size_t touched = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!owned[b][i] && got[i] != kPoison) ++touched;
    ASSERT_EQ(touched, 0u) << "buffer \"" << l.buffers[b].name << "\": " << touched << " bytes outside the stored rows changed";
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && bad++ == 0) first = i;
    ASSERT_EQ(bad, 0u) << "buffer \"" << l.buffers[b].name << "\": " << bad << " bytes differ from the reference, first at "
                       << first << " (gpu " << int(got[first]) << ", reference " << int(want[first]) << ")";
  }
  const DeviceStatus st = status.to_host()[0];
  EXPECT_EQ(int64_t(st.stored), counts.stored);
  EXPECT_EQ(int64_t(st.padding), counts.padding);
  EXPECT_EQ(int64_t(st.out_of_range), counts.out_of_range);
  EXPECT_EQ(int64_t(st.non_finite), counts.non_finite);
  if (outcome) *outcome = {counts, st};

  // Gather every page the slots touched, as one sequence, in slot order.
  std::vector<int32_t> table;
  for (int64_t s : slots)
    if (s >= 0 && s < d.pages * d.tokens_per_page &&
        std::find(table.begin(), table.end(), int32_t(s / d.tokens_per_page)) == table.end())
      table.push_back(int32_t(s / d.tokens_per_page));
  if (table.empty()) return;
  const int64_t gtokens = int64_t(table.size()) * d.tokens_per_page;
  const reference::GatheredKv want = reference::gather(valid, cpu.buffers, {table.data(), gtokens, layer, kgs, vgs});
  auto dtable = DeviceArray<int32_t>::from(table);
  auto cu = DeviceArray<int32_t>::from({0, int32_t(gtokens)});
  const size_t n = size_t(gtokens * d.heads * d.head_dim);
  DeviceArray<uint16_t> kout(n), vout(n);
  CUDA_OK(cudaMemset(kout.ptr, 0xFF, n * 2));
  CUDA_OK(cudaMemset(vout.ptr, 0xFF, n * 2));
  GatherArgs g;
  g.block_table = dtable.ptr;
  g.block_table_stride = int64_t(table.size());
  g.cu_seqlens = cu.ptr;
  g.batch = 1;
  g.layer = layer;
  g.k_global_scale = scales.ptr;
  g.v_global_scale = scales.ptr + 1;
  g.out_type = type;
  g.k_out = kout.ptr;
  g.v_out = vout.ptr;
  const Result gr = gather(valid, bufs, g, nullptr);
  ASSERT_TRUE(gr.ok()) << gr.message;
  CUDA_OK(cudaDeviceSynchronize());
  const auto gk = kout.to_host(), gv = vout.to_host();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto conv = [&](float x) { return type == ElementType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x); };
    bad += gk[i] != conv(want.k[i]);
    bad += gv[i] != conv(want.v[i]);
  }
  ASSERT_EQ(bad, 0u) << "gather differs from the reference in " << bad << " of " << 2 * n << " values";
}

// Whole pages in shuffled order, a padding slot, one beyond capacity, and the last slot.
std::vector<int64_t> paged_slots(const CacheDims& d, int64_t tokens, std::mt19937_64& rng) {
  std::vector<int64_t> pages(size_t(d.pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<int64_t> s;
  for (int64_t i = 0; i < tokens; ++i)
    s.push_back(pages[size_t((i / d.tokens_per_page) % d.pages)] * d.tokens_per_page + i % d.tokens_per_page);
  if (tokens > 3) {
    s[1] = -1;
    s[2] = d.pages * d.tokens_per_page;
    // The last slot, unless the shuffled pages already hold it: one slot, one row
    // (which of two rows lands in a duplicated slot is unspecified).
    const int64_t last = d.pages * d.tokens_per_page - 1;
    if (std::find(s.begin(), s.end(), last) == s.end()) s.push_back(last);
  }
  return s;
}

TEST_F(Gpu, StoreAndGatherMatchTheReferenceForEverySoundPreset) {
  int ran = 0;
  for (const PresetInfo& p : list_presets())
    for (int64_t dim : {64, 128, 256})
      for (int64_t n : {5, 16, 32}) {  // 5: an odd page size (the interleaved presets refuse it)
        const Layout l = instantiate(preset_spec(p.name), {2, 6, n, 2, dim});
        CheckResult res = check(l);
        if (!res.valid) continue;  // the broken vLLM packed NHD views
        for (ScaleRule rule : {ScaleRule::kStandard, ScaleRule::kFourOverSix})
          for (bool structured : {false, true}) {
            SCOPED_TRACE(p.name + " D" + std::to_string(dim) + " N" + std::to_string(n) +
                         (rule == ScaleRule::kStandard ? " standard" : " 4over6") + (structured ? " structured" : " random"));
            std::mt19937_64 rng(uint64_t(ran) * 7919 + 1);
            const auto slots = paged_slots(l.dims, n * 3 + 5, rng);
            store_and_gather(*res.valid, 1, slots, structured ? ElementType::kFloat16 : ElementType::kBFloat16, rule,
                             structured, ran % 2 == 0, uint64_t(ran));
            if (HasFatalFailure()) return;
            ++ran;
          }
      }
  EXPECT_GE(ran, (11 * 3 * 2 + 9 * 3) * 4);
}

// Shapes beyond the preset sweep: odd group counts (D 48, 80: the gather's
// paired stores do not apply), a large head dim, and head counts that are not a
// multiple of the kernels' heads in flight (4 in the store, 8 in the gather).
TEST_F(Gpu, OddShapesMatchTheReference) {
  int ran = 0;
  for (int64_t dim : {48, 80, 512})
    for (int64_t heads : {3, 9})
      for (int64_t n : {7, 16}) {
        const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 12, n, heads, dim}));
        SCOPED_TRACE(testing::Message() << "D" << dim << " H" << heads << " N" << n);
        std::mt19937_64 rng(uint64_t(ran) + 101);
        store_and_gather(v, 0, paged_slots(v.layout().dims, n * 5 + 3, rng), ElementType::kBFloat16,
                         ran % 2 ? ScaleRule::kFourOverSix : ScaleRule::kStandard, ran % 3 == 0, ran % 2 == 0,
                         uint64_t(ran) + 500);
        if (HasFatalFailure()) return;
        ++ran;
      }
  EXPECT_EQ(ran, 12);
}

TEST_F(Gpu, SlotEdgeCases) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 4, 16, 8, 128}));
  const int64_t cap = 4 * 16;
  Outcome o;
  // A batch that fills page 2 exactly.
  std::vector<int64_t> fill(16);
  std::iota(fill.begin(), fill.end(), 2 * 16);
  store_and_gather(v, 0, fill, ElementType::kBFloat16, ScaleRule::kStandard, false, true, 11, &o);
  EXPECT_EQ(o.gpu.stored, 16u);
  // One that crosses from page 0 into page 1, in int32 slots.
  std::vector<int64_t> cross(10);
  std::iota(cross.begin(), cross.end(), 11);
  store_and_gather(v, 0, cross, ElementType::kBFloat16, ScaleRule::kStandard, false, false, 12, &o);
  EXPECT_EQ(o.gpu.stored, 10u);
  // Padding, the last slot, and out-of-range slots (counted, nothing written: the byte
  // comparison against the reference, which skips them, proves it).
  const std::vector<int64_t> edge = {-1, cap - 1, cap, cap + 1000, -7, 0, int64_t(1) << 40};
  store_and_gather(v, 0, edge, ElementType::kFloat16, ScaleRule::kFourOverSix, true, true, 13, &o);
  EXPECT_EQ(o.gpu.stored, 2u);
  EXPECT_EQ(o.gpu.padding, 2u);
  EXPECT_EQ(o.gpu.out_of_range, 3u);
  // All padding: nothing written at all.
  store_and_gather(v, 0, {-1, -1, -1}, ElementType::kBFloat16, ScaleRule::kStandard, false, true, 14, &o);
  EXPECT_EQ(o.gpu.padding, 3u);
}

TEST_F(Gpu, LargeRandomBatchOnTheNativeLayout) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native-layers"), {3, 300, 16, 8, 128}));
  std::mt19937_64 rng(21);
  store_and_gather(v, 2, paged_slots(v.layout().dims, 4000, rng), ElementType::kBFloat16, ScaleRule::kFourOverSix,
                   false, true, 22);
}

TEST_F(Gpu, UnusableGlobalScalesWriteNothingAndAreCounted) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 2, 16, 2, 64}));
  DeviceArray<> cache(size_t(v.layout().buffers[0].bytes));
  CacheBuffers b;
  b.ptr[0] = cache.ptr;
  b.count = 1;
  std::vector<uint16_t> rows(3 * 2 * 64, float_to_bf16(1.5f));
  auto drows = DeviceArray<uint16_t>::from(rows);
  auto slots = DeviceArray<int64_t>::from({0, 5, 17});
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e-45f,
                    1e31f, 3e-31f}) {
    CUDA_OK(cudaMemset(cache.ptr, kPoison, cache.count));
    auto scales = DeviceArray<float>::from({1.0f, bad});
    auto status = DeviceArray<DeviceStatus>::from({DeviceStatus{}});
    ASSERT_TRUE(store(v, b, bf16_store_args(drows.ptr, 3, 128, slots.ptr, scales.ptr, status.ptr), nullptr).ok());
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(status.to_host()[0].bad_global_scale, 3u) << bad;
    EXPECT_EQ(status.to_host()[0].stored, 0u) << bad;
    for (uint8_t byte : cache.to_host()) ASSERT_EQ(byte, kPoison) << bad;
  }
}

TEST_F(Gpu, GatherMarksBadBlockTableEntries) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 4, 16, 2, 64}));
  DeviceArray<> cache(size_t(v.layout().buffers[0].bytes));
  CUDA_OK(cudaMemset(cache.ptr, 0, cache.count));
  CacheBuffers b;
  b.ptr[0] = cache.ptr;
  b.count = 1;
  auto table = DeviceArray<int32_t>::from({1, 9});  // page 9 does not exist
  auto cu = DeviceArray<int32_t>::from({0, 32});
  auto scales = DeviceArray<float>::from({1.0f, 1.0f});
  auto status = DeviceArray<DeviceStatus>::from({DeviceStatus{}});
  DeviceArray<uint16_t> k(32 * 2 * 64), vv(32 * 2 * 64);
  GatherArgs g{table.ptr, 2, cu.ptr, 1, 0, scales.ptr, scales.ptr + 1, ElementType::kBFloat16, k.ptr, vv.ptr, status.ptr};
  ASSERT_TRUE(gather(v, b, g, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const auto out = k.to_host();
  EXPECT_EQ(out[0], 0);                       // page 1: zero bytes decode to +0
  EXPECT_EQ(out[16 * 2 * 64] & 0x7FC0, 0x7FC0);  // page 9: NaN, never read from outside the cache
  EXPECT_EQ(status.to_host()[0].bad_pages, 16u);
}

TEST_F(Gpu, HostSideErrorsLaunchNothing) {
  const ValidLayout v = validate(instantiate(preset_spec("flashinfer-hnd"), {1, 4, 16, 2, 64}));
  DeviceArray<> buf(4096);
  DeviceArray<uint16_t> rows(1024);
  auto slots = DeviceArray<int64_t>::from({0, 1});
  auto scales = DeviceArray<float>::from({1.0f, 1.0f});
  CacheBuffers b;
  for (int i = 0; i < 4; ++i) b.ptr[i] = buf.ptr + 1024 * i;
  b.count = 4;
  const StoreArgs a = bf16_store_args(rows.ptr, 2, 128, slots.ptr, scales.ptr);
  EXPECT_TRUE(store(v, b, a, nullptr).ok());
  auto bad = [&](auto mutate, const char* needle) {
    StoreArgs x = a;
    CacheBuffers y = b;
    mutate(x, y);
    const Result r = store(v, y, x, nullptr);
    EXPECT_EQ(r.status, Status::kInvalidArgument) << needle;
    EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
  };
  bad([](StoreArgs& x, CacheBuffers&) { x.rows.k = reinterpret_cast<const uint8_t*>(x.rows.k) + 2; }, "16-byte aligned");
  bad([](StoreArgs& x, CacheBuffers&) { x.rows.token_stride = 100; }, "token stride");
  bad([](StoreArgs& x, CacheBuffers&) { x.rows.token_stride = 132; }, "multiple of 8");
  bad([](StoreArgs& x, CacheBuffers&) { x.type = ElementType::kFloat32; }, "bf16 or fp16");
  bad([](StoreArgs& x, CacheBuffers&) { x.k_global_scale = nullptr; }, "global scales");
  bad([](StoreArgs& x, CacheBuffers&) { x.layer = 1; }, "layer 1");
  bad([](StoreArgs&, CacheBuffers& y) { y.count = 3; }, "4 buffers");
  bad([](StoreArgs&, CacheBuffers& y) { y.ptr[2] += 1; }, "not 16-byte aligned");
  bad([](StoreArgs&, CacheBuffers& y) { y.ptr[1] = nullptr; }, "is null");
  CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace nvfp4kv
