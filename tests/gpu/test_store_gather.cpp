// Store and gather on the GPU, bit for bit against the CPU reference, through
// every sound preset and the native layout. Skipped, with a message, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "nvfp4kv/api/decode.hpp"
#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/api/prefill.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/harness/device_buffer.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "odd_layouts.hpp"

namespace nvfp4kv {
namespace {

using harness::DeviceBuffer;
using harness::DeviceCache;

constexpr uint8_t kPoison = 0x5A;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

bool same_status(const DeviceStatus& a, const DeviceStatus& b) {
  return a.stored == b.stored && a.padding == b.padding && a.out_of_range == b.out_of_range &&
         a.non_finite == b.non_finite && a.bad_pages == b.bad_pages && a.bad_global_scale == b.bad_global_scale &&
         a.bad_lengths == b.bad_lengths;
}

std::string status_text(const DeviceStatus& s) {
  return "stored " + std::to_string(s.stored) + ", padding " + std::to_string(s.padding) + ", out of range " +
         std::to_string(s.out_of_range) + ", non-finite " + std::to_string(s.non_finite) + ", bad pages " +
         std::to_string(s.bad_pages) + ", bad global scale " + std::to_string(s.bad_global_scale) + ", bad lengths " +
         std::to_string(s.bad_lengths);
}

struct Outcome {
  DeviceStatus cpu, gpu;
};

// Stores the same rows through the layout on both sides and compares every byte
// of every buffer (rows written and poison left alone), then gathers the touched
// pages as one sequence on both sides and compares bit for bit.
void store_and_gather(const ValidLayout& valid, int64_t layer, const std::vector<int64_t>& slots, ElementType type,
                      ScaleRule rule, harness::RowPattern pattern, bool int64_slots, uint64_t seed,
                      Outcome* outcome = nullptr) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  const int64_t tokens = int64_t(slots.size());
  const harness::Rows rows = harness::make_rows(d, tokens, type, pattern, seed, 8);
  const float scales_host[2] = {recommend_global_scale(rows.k_amax), recommend_global_scale(rows.v_amax)};
  std::vector<int32_t> slots32(slots.begin(), slots.end());

  StoreArgs a;
  a.rows = {rows.k.data(), rows.v.data(), tokens, rows.stride};
  a.type = type;
  a.slots = int64_slots ? static_cast<const void*>(slots.data()) : slots32.data();
  a.slots_are_int64 = int64_slots;
  a.layer = layer;
  a.k_global_scale = &scales_host[0];
  a.v_global_scale = &scales_host[1];
  a.rule = rule;
  DeviceStatus cpu_status;
  a.status = &cpu_status;
  reference::HostCache cpu(l, kPoison);
  reference::store(valid, cpu.buffers, a);

  DeviceCache cache(l, kPoison);
  auto dk = DeviceBuffer<uint16_t>::from(rows.k), dv = DeviceBuffer<uint16_t>::from(rows.v);
  auto s64 = DeviceBuffer<int64_t>::from(slots);
  auto s32 = DeviceBuffer<int32_t>::from(slots32);
  auto scales = DeviceBuffer<float>::from({scales_host[0], scales_host[1]});
  auto status = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
  // A format that smooths or channel-scales K: its mu and lambda in device memory, as the kernels take them.
  const harness::FormatVectors vectors(valid);
  StoreArgs g = a;  // the same operation, device pointers
  vectors.give(g);
  g.rows = {dk.get(), dv.get(), tokens, rows.stride};
  g.slots = int64_slots ? static_cast<const void*>(s64.get()) : s32.get();
  g.k_global_scale = scales.get();
  g.v_global_scale = scales.get() + 1;
  g.status = status.get();
  const Result r = store(valid, cache.view(), g, nullptr);
  ASSERT_TRUE(r.ok()) << r.message;
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = cache.download();
  for (size_t b = 0; b < l.buffers.size(); ++b) {
    const std::vector<uint8_t>& want = cpu.storage[b];
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (got[b][i] != want[i] && bad++ == 0) first = i;
    ASSERT_EQ(bad, 0u) << "buffer \"" << l.buffers[b].name << "\": " << bad << " bytes differ from the reference, first at "
                       << first << " (gpu " << int(got[b][first]) << ", reference " << int(want[first])
                       << (want[first] == kPoison ? ": the reference left it alone)" : ")");
  }
  const DeviceStatus st = status.download()[0];
  EXPECT_TRUE(same_status(st, cpu_status)) << "gpu: " << status_text(st) << "\ncpu: " << status_text(cpu_status);
  if (outcome) *outcome = {cpu_status, st};

  // Gather every page the slots touched, as one sequence, in first-use order.
  const std::vector<int32_t> table = harness::pages_of(d, slots);
  if (table.empty()) return;
  const int64_t gtokens = int64_t(table.size()) * d.tokens_per_page;
  const reference::GatheredKv want =
      reference::gather_sequence(valid, cpu.buffers, table, gtokens, layer, scales_host[0], scales_host[1]);
  auto dtable = DeviceBuffer<int32_t>::from(table);
  auto cu = DeviceBuffer<int32_t>::from({0, int32_t(gtokens)});
  const size_t n = size_t(gtokens * d.heads * d.head_dim);
  DeviceBuffer<uint16_t> kout(n), vout(n);
  kout.fill_bytes(0xFF);
  vout.fill_bytes(0xFF);
  GatherArgs ga;
  ga.batch = {.block_table = dtable.get(), .block_table_stride = int64_t(table.size()), .cu_seqlens = cu.get(), .batch = 1};
  ga.layer = layer;
  ga.k_global_scale = scales.get();
  ga.v_global_scale = scales.get() + 1;
  ga.out_type = type;
  ga.k_out = kout.get();
  ga.v_out = vout.get();
  vectors.give(ga);
  const Result gr = gather(valid, cache.view(), ga, nullptr);
  ASSERT_TRUE(gr.ok()) << gr.message;
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  const auto gk = kout.download(), gv = vout.download();
  const auto conv = [&](float x) { return type == ElementType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x); };
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += (gk[i] != conv(want.k[i])) + (gv[i] != conv(want.v[i]));
  ASSERT_EQ(bad, 0u) << "gather differs from the reference in " << bad << " of " << 2 * n << " values";
  const LayerFormat lf = valid.format().layer(layer);
  const bool k_vectors = valid.format().has_k_mean() || valid.format().has_k_channel_scale();
  if (lf.k.rotation == kNoRotation && lf.v.rotation == kNoRotation && !k_vectors) return;  // stored = original values
  // The stored values too (rotated, mu subtracted, divided by lambda), as the reference gives them back.
  GatherArgs sa = ga;
  sa.stored_values = true;
  std::vector<uint16_t> sk(n, 0xFFFF), sv(n, 0xFFFF);
  GatherArgs ca = sa;
  const int32_t cu_host[2] = {0, int32_t(gtokens)};
  ca.batch = {.block_table = table.data(), .block_table_stride = int64_t(table.size()), .cu_seqlens = cu_host, .batch = 1};
  ca.k_global_scale = &scales_host[0];
  ca.v_global_scale = &scales_host[1];
  ca.k_out = sk.data();
  ca.v_out = sv.data();
  ca.status = nullptr;
  reference::gather(valid, cpu.buffers, ca);
  ASSERT_TRUE(gather(valid, cache.view(), sa, nullptr).ok());
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  const auto tk = kout.download(), tv = vout.download();
  bad = 0;
  for (size_t i = 0; i < n; ++i) bad += (tk[i] != sk[i]) + (tv[i] != sv[i]);
  ASSERT_EQ(bad, 0u) << "gather of the stored values differs from the reference in " << bad << " of " << 2 * n;
}

TEST_F(Gpu, StoreAndGatherMatchTheReferenceForEverySoundPreset) {
  int ran = 0, presets = 0;
  for (const PresetInfo& p : list_presets()) {
    bool any = false;
    for (int64_t dim : {64, 128, 256})
      for (int64_t n : {5, 16, 32}) {  // 5: an odd page size (the interleaved presets refuse it)
        const Layout l = instantiate(preset_spec(p.name), {2, 6, n, 2, dim});
        CheckResult res = check(l);
        if (!res.valid) continue;  // the broken vLLM packed NHD views
        any = true;
        for (ScaleRule rule : {ScaleRule::kStandard, ScaleRule::kFourOverSix})
          for (harness::RowPattern pattern : {harness::RowPattern::kNormal, harness::RowPattern::kStructured}) {
            const bool structured = pattern == harness::RowPattern::kStructured;
            SCOPED_TRACE(p.name + " D" + std::to_string(dim) + " N" + std::to_string(n) +
                         (rule == ScaleRule::kStandard ? " standard" : " 4over6") + (structured ? " structured" : " random"));
            const auto slots = harness::paged_slots(l.dims, n * 3 + 5, uint64_t(ran) * 7919 + 1, true);
            store_and_gather(*res.valid, 1, slots, structured ? ElementType::kFloat16 : ElementType::kBFloat16, rule,
                             pattern, ran % 2 == 0, uint64_t(ran));
            if (HasFatalFailure()) return;
            ++ran;
          }
      }
    presets += any;
  }
  // Every preset that is sound at some size ran (all but the three broken vLLM packed NHD views).
  EXPECT_EQ(presets, int(list_presets().size()) - 3);
  EXPECT_GE(ran, presets * 4 * 4);
}

// Code orders (where a data byte keeps its two codes): the store writes the reference's
// bytes and the gather reads them back exactly, through row-aligned and byte-wise paths.
TEST_F(Gpu, StoreAndGatherFollowTheLayoutsCodeOrder) {
  int ran = 0;
  for (const char* order : {"high-first", "fp16-split"})
    for (const char* preset : {"nvfp4kv-native", "flashinfer-nhd"})
      for (int64_t n : {5, 16}) {
        LayoutSpec spec = preset_spec(preset);
        spec.codes = *code_order_named(order);
        const CheckResult res = check(instantiate(spec, {2, 6, n, 2, 128}));
        ASSERT_TRUE(res.valid.has_value()) << res.report.summary();
        SCOPED_TRACE(std::string(order) + " " + preset + " N" + std::to_string(n));
        const auto slots = harness::paged_slots(res.valid->layout().dims, n * 3 + 5, uint64_t(ran) * 31 + 3, true);
        store_and_gather(*res.valid, 1, slots, ElementType::kBFloat16, ScaleRule::kStandard,
                         harness::RowPattern::kNormal, ran % 2 == 0, uint64_t(ran) + 500);
        if (HasFatalFailure()) return;
        ++ran;
      }
  EXPECT_EQ(ran, 8);
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
        store_and_gather(v, 0, harness::paged_slots(v.layout().dims, n * 5 + 3, uint64_t(ran) + 101, true),
                         ElementType::kBFloat16, ran % 2 ? ScaleRule::kFourOverSix : ScaleRule::kStandard,
                         ran % 3 == 0 ? harness::RowPattern::kStructured : harness::RowPattern::kNormal, ran % 2 == 0,
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
  const auto random = harness::RowPattern::kNormal;
  // A batch that fills page 2 exactly.
  std::vector<int64_t> fill(16);
  std::iota(fill.begin(), fill.end(), 2 * 16);
  store_and_gather(v, 0, fill, ElementType::kBFloat16, ScaleRule::kStandard, random, true, 11, &o);
  EXPECT_EQ(o.gpu.stored, 16u);
  // One that crosses from page 0 into page 1, in int32 slots.
  std::vector<int64_t> cross(10);
  std::iota(cross.begin(), cross.end(), 11);
  store_and_gather(v, 0, cross, ElementType::kBFloat16, ScaleRule::kStandard, random, false, 12, &o);
  EXPECT_EQ(o.gpu.stored, 10u);
  // Padding, the last slot, and out-of-range slots (counted, nothing written: the byte
  // comparison against the reference, which skips them, proves it).
  const std::vector<int64_t> edge = {-1, cap - 1, cap, cap + 1000, -7, 0, int64_t(1) << 40};
  store_and_gather(v, 0, edge, ElementType::kFloat16, ScaleRule::kFourOverSix, harness::RowPattern::kStructured, true,
                   13, &o);
  EXPECT_EQ(o.gpu.stored, 2u);
  EXPECT_EQ(o.gpu.padding, 2u);
  EXPECT_EQ(o.gpu.out_of_range, 3u);
  // All padding: nothing written at all.
  store_and_gather(v, 0, {-1, -1, -1}, ElementType::kBFloat16, ScaleRule::kStandard, random, true, 14, &o);
  EXPECT_EQ(o.gpu.padding, 3u);
}

TEST_F(Gpu, LargeRandomBatchOnTheNativeLayout) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native-layers"), {3, 300, 16, 8, 128}));
  store_and_gather(v, 2, harness::paged_slots(v.layout().dims, 4000, 21, true), ElementType::kBFloat16,
                   ScaleRule::kFourOverSix, harness::RowPattern::kNormal, true, 22);
}

TEST_F(Gpu, UnusableGlobalScalesWriteNothingAndAreCounted) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 2, 16, 2, 64}));
  DeviceCache cache(v.layout(), kPoison);
  auto rows = DeviceBuffer<uint16_t>::from(std::vector<uint16_t>(3 * 2 * 64, float_to_bf16(1.5f)));
  auto slots = DeviceBuffer<int64_t>::from({0, 5, 17});
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e-45f,
                    1e31f, 3e-31f}) {
    auto scales = DeviceBuffer<float>::from({1.0f, bad});
    auto status = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
    StoreArgs a;
    a.rows = {rows.get(), rows.get(), 3, 128};
    a.slots = slots.get();
    a.slots_are_int64 = true;
    a.k_global_scale = scales.get();
    a.v_global_scale = scales.get() + 1;
    a.status = status.get();
    ASSERT_TRUE(store(v, cache.view(), a, nullptr).ok());
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(status.download()[0].bad_global_scale, 3u) << bad;
    EXPECT_EQ(status.download()[0].stored, 0u) << bad;
    for (const auto& buffer : cache.download())
      for (uint8_t byte : buffer) ASSERT_EQ(byte, kPoison) << bad;
  }
}

// A ragged batch through the gather: shuffled and sparse pages, a length of 0,
// lengths not a multiple of the page, a block-table entry outside the cache, a
// length beyond the block table, and an unusable V scale: the GPU and the
// reference agree on every value (NaN rows included, by bits) and every counter.
TEST_F(Gpu, GatherOfARaggedBatchMatchesTheReferenceWithBadEntries) {
  const ValidLayout v = validate(instantiate(preset_spec("vllm-legacy-hnd"), {1, 20, 16, 2, 64}));
  const CacheDims& d = v.layout().dims;
  // Fill the whole cache through the reference, then copy it to the GPU.
  reference::HostCache cpu(v.layout(), kPoison);
  const auto slots = harness::paged_slots(d, d.pages * d.tokens_per_page, 5, false);
  const harness::Rows rows = harness::make_rows(d, int64_t(slots.size()), ElementType::kBFloat16, harness::RowPattern::kNormal, 6);
  const float gs[2] = {recommend_global_scale(rows.k_amax), recommend_global_scale(rows.v_amax)};
  reference::store(v, cpu.buffers, {.rows = {rows.k.data(), rows.v.data(), rows.tokens, rows.stride}, .slots = slots.data(),
                                    .slots_are_int64 = true, .k_global_scale = &gs[0], .v_global_scale = &gs[1]});
  DeviceCache cache(v.layout(), kPoison);
  DeviceBuffer<uint8_t> staged(cpu.storage[0].size());
  staged.upload(cpu.storage[0]);
  NVFP4KV_CUDA_CHECK(cudaMemcpy(cache.view().ptr[0], staged.get(), staged.size(), cudaMemcpyDeviceToDevice));
  // 4 sequences, 3 entries each: lengths 37, 0, 48 (one entry points at page 99), 60 (beyond 3 * 16).
  const std::vector<int32_t> table = {7, 2, 19, 5, 5, 5, 11, 99, 3, 0, 13, 8};
  const std::vector<int32_t> cu = {0, 37, 37, 85, 145};
  for (float v_scale : {gs[1], std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(v_scale);
    const float scales_host[2] = {gs[0], v_scale};
    const size_t n = size_t(cu.back() * d.heads * d.head_dim);
    std::vector<uint16_t> want_k(n, 0xFFFF), want_v(n, 0xFFFF);
    DeviceStatus want_status;
    GatherArgs a;
    a.batch = {.block_table = table.data(), .block_table_stride = 3, .cu_seqlens = cu.data(), .batch = 4};
    a.k_global_scale = &scales_host[0];
    a.v_global_scale = &scales_host[1];
    a.out_type = ElementType::kBFloat16;
    a.k_out = want_k.data();
    a.v_out = want_v.data();
    a.status = &want_status;
    reference::gather(v, cpu.buffers, a);
    auto dtable = DeviceBuffer<int32_t>::from(table);
    auto dcu = DeviceBuffer<int32_t>::from(cu);
    auto scales = DeviceBuffer<float>::from({scales_host[0], scales_host[1]});
    auto status = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
    DeviceBuffer<uint16_t> kout(n), vout(n);
    kout.fill_bytes(0xFF);
    vout.fill_bytes(0xFF);
    GatherArgs g = a;
    g.batch.block_table = dtable.get();
    g.batch.cu_seqlens = dcu.get();
    g.k_global_scale = scales.get();
    g.v_global_scale = scales.get() + 1;
    g.k_out = kout.get();
    g.v_out = vout.get();
    g.status = status.get();
    ASSERT_TRUE(gather(v, cache.view(), g, nullptr).ok());
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(kout.download(), want_k);
    EXPECT_EQ(vout.download(), want_v);
    const DeviceStatus st = status.download()[0];
    EXPECT_TRUE(same_status(st, want_status)) << "gpu: " << status_text(st) << "\ncpu: " << status_text(want_status);
    EXPECT_EQ(st.bad_pages, 16u);   // the entry 99 holds tokens 16..31 of sequence 2
    EXPECT_EQ(st.bad_lengths, 1u);  // sequence 3: 60 tokens, 48 fit
    // NaN marks: sequence 2's second page, sequence 3's rows past 48.
    EXPECT_EQ(want_k[size_t((37 + 16) * d.heads * d.head_dim)] & 0x7FC0, 0x7FC0);
    EXPECT_EQ(want_k[size_t((85 + 50) * d.heads * d.head_dim)] & 0x7FC0, 0x7FC0);
    if (!global_scale_usable(v_scale)) {
      EXPECT_EQ(st.bad_global_scale, uint64_t(37 + 32 + 48));
      EXPECT_EQ(want_v[0] & 0x7FC0, 0x7FC0);
      EXPECT_NE(want_k[0] & 0x7FC0, 0x7FC0);
    }
  }
}

TEST_F(Gpu, HostSideErrorsLaunchNothing) {
  const ValidLayout v = validate(instantiate(preset_spec("flashinfer-hnd"), {1, 4, 16, 2, 64}));
  DeviceBuffer<uint8_t> buf(4096);
  DeviceBuffer<uint16_t> rows(1024);
  auto slots = DeviceBuffer<int64_t>::from({0, 1});
  auto scales = DeviceBuffer<float>::from({1.0f, 1.0f});
  CacheBuffers b;
  for (int i = 0; i < 4; ++i) b.ptr[i] = buf.get() + 1024 * i;
  b.count = 4;
  StoreArgs a;
  a.rows = {rows.get(), rows.get(), 2, 128};
  a.slots = slots.get();
  a.slots_are_int64 = true;
  a.k_global_scale = scales.get();
  a.v_global_scale = scales.get() + 1;
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
  GatherArgs g;
  g.batch = {.block_table = reinterpret_cast<const int32_t*>(slots.get()), .block_table_stride = 1,
             .seq_lens = reinterpret_cast<const int32_t*>(slots.get()), .batch = 1};
  g.k_global_scale = scales.get();
  g.v_global_scale = scales.get() + 1;
  g.k_out = g.v_out = rows.get();
  const Result r = gather(v, b, g, nullptr);
  EXPECT_EQ(r.status, Status::kInvalidArgument);
  EXPECT_NE(r.message.find("cu_seqlens"), std::string::npos) << r.message;
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
}

// A format fixes the store's scale rule: the kernel takes it from the layout, not the call.
TEST_F(Gpu, StoreTakesTheFormatsScaleRule) {
  const ValidLayout plain = validate(instantiate(preset_spec("nvfp4kv-native"), {2, 8, 16, 2, 128}));
  CacheFormat f;
  f.layers = {LayerFormat{}};
  f.layers[0].k.rule = f.layers[0].v.rule = ScaleRule::kFourOverSix;
  std::vector<int64_t> slots(64);
  std::iota(slots.begin(), slots.end(), 0);
  store_and_gather(with_format(plain, f), 1, slots, ElementType::kBFloat16, ScaleRule::kStandard,
                   harness::RowPattern::kNormal, true, 41);
}

// Every format goes through store and gather, bit for bit against the reference: rotations
// (whole head, blocks), K smoothing, different scale rules for K and V, FP8 pages on either
// side (with and without transforms), at D 64, 128 and a padded 80.
TEST_F(Gpu, StoreAndGatherTakeEveryFormat) {
  constexpr ElementFormat kNv = ElementFormat::kNvfp4, kF8 = ElementFormat::kFp8E4M3;
  struct Variant {
    int64_t head_dim;
    ElementFormat k, v;
    int64_t k_rotation, v_rotation;
    bool mean;
    ScaleRule k_rule, v_rule;
  };
  const ScaleRule std_rule = ScaleRule::kStandard, four = ScaleRule::kFourOverSix;
  const std::vector<Variant> variants = {
      {128, kNv, kNv, kRotateWholeHead, kNoRotation, false, std_rule, std_rule},
      {128, kNv, kNv, 32, 16, true, four, std_rule},
      {64, kNv, kNv, kNoRotation, kNoRotation, true, std_rule, four},
      {64, kNv, kNv, kNoRotation, kNoRotation, false, four, std_rule},  // rules only
      {80, kNv, kNv, kRotateWholeHead, kRotateWholeHead, true, std_rule, std_rule},
      {128, kF8, kNv, kNoRotation, kNoRotation, false, std_rule, std_rule},
      {128, kNv, kF8, kNoRotation, kRotateWholeHead, true, four, std_rule},
      {64, kF8, kF8, kRotateWholeHead, kNoRotation, true, std_rule, std_rule},
      // FP8 without transforms: the vectorized store (16 E4M3 bytes a thread and group).
      {64, kF8, kF8, kNoRotation, kNoRotation, false, std_rule, std_rule},
      {128, kNv, kF8, kNoRotation, kNoRotation, false, four, std_rule},  // 4over6 beside FP8
      {80, kF8, kNv, kNoRotation, kNoRotation, false, std_rule, std_rule},
      {256, kNv, kF8, kNoRotation, kNoRotation, false, std_rule, std_rule},
  };
  uint64_t seed = 300;
  for (const Variant& var : variants) {
    const ValidLayout plain =
        validate(instantiate(preset_spec("nvfp4kv-native"), {2, 8, 16, 2, var.head_dim, var.k, var.v}));
    CacheFormat f;
    f.layers = {LayerFormat{}};
    f.layers[0].k = {var.k, var.k_rule, var.k_rotation};
    f.layers[0].v = {var.v, var.v_rule, var.v_rotation};
    if (var.mean) {
      std::mt19937 rng{uint32_t(seed)};
      std::normal_distribution<float> n(0.0f, 0.5f);
      f.k_mean.resize(size_t(2 * 2 * var.head_dim));
      for (float& m : f.k_mean) m = n(rng);
    }
    SCOPED_TRACE(testing::Message() << "D" << var.head_dim << " K " << element_format_name(var.k) << " rot "
                                    << var.k_rotation << " V " << element_format_name(var.v) << " rot "
                                    << var.v_rotation << (var.mean ? " mu" : ""));
    std::vector<int64_t> slots(40);
    std::iota(slots.begin(), slots.end(), 70);
    slots[3] = -1;   // padding
    slots[9] = 999;  // out of range
    for (ElementType type : {ElementType::kBFloat16, ElementType::kFloat16})
      store_and_gather(with_format(plain, f), 1, slots, type, ScaleRule::kStandard, harness::RowPattern::kNormal,
                       true, ++seed);
    // Layer 0 (mu's other rows), int32 slots, a scale read from the wrong group shows.
    store_and_gather(with_format(plain, f), 0, slots, ElementType::kBFloat16, ScaleRule::kStandard,
                     harness::RowPattern::kStructured, false, ++seed);
  }
  // K smoothing in a format of no per-layer entries (mu is the cache's, not a layer's).
  const ValidLayout plain = validate(instantiate(preset_spec("nvfp4kv-native"), {2, 8, 16, 2, 128}));
  CacheFormat smooth_only;
  smooth_only.k_mean.resize(size_t(2 * 2 * 128));
  for (size_t i = 0; i < smooth_only.k_mean.size(); ++i) smooth_only.k_mean[i] = float(int(i % 13) - 6) * 0.25f;
  std::vector<int64_t> slots(40);
  std::iota(slots.begin(), slots.end(), 3);
  store_and_gather(with_format(plain, smooth_only), 1, slots, ElementType::kBFloat16, ScaleRule::kStandard,
                   harness::RowPattern::kNormal, true, ++seed);
  // K's channel scale lambda: alone, then with mu and a rotation of the whole head (the writer's
  // order: - mu, / lambda, rotate; gather: rotate back, * lambda, + mu). Powers of two and not.
  CacheFormat scaled;
  scaled.k_channel_scale.resize(size_t(2 * 2 * 128));
  for (size_t i = 0; i < scaled.k_channel_scale.size(); ++i)
    scaled.k_channel_scale[i] = (i % 3 == 0) ? std::ldexp(1.0f, int(i % 7) - 3) : 0.3f + 0.05f * float(i % 29);
  for (ElementType type : {ElementType::kBFloat16, ElementType::kFloat16})
    store_and_gather(with_format(plain, scaled), 1, slots, type, ScaleRule::kStandard, harness::RowPattern::kNormal,
                     true, ++seed);
  CacheFormat all = scaled;
  all.k_mean = smooth_only.k_mean;
  all.layers = {LayerFormat{}};
  all.layers[0].k.rotation = kRotateWholeHead;
  all.layers[0].k.rule = ScaleRule::kFourOverSix;
  store_and_gather(with_format(plain, all), 1, slots, ElementType::kBFloat16, ScaleRule::kStandard,
                   harness::RowPattern::kNormal, true, ++seed);
  store_and_gather(with_format(plain, all), 0, slots, ElementType::kBFloat16, ScaleRule::kStandard,
                   harness::RowPattern::kStructured, false, ++seed);
  // FP8 K rows aligned to 8 bytes only: the vectorized store writes each FP8 group byte by byte.
  for (int64_t dim : {64, 128}) {
    const ValidLayout odd = validate(instantiate(test_layouts::fp8_k_rows_8_aligned(),
                                                 {2, 8, 16, 2, dim, ElementFormat::kFp8E4M3, ElementFormat::kNvfp4}));
    SCOPED_TRACE(testing::Message() << "K fp8 in 8-byte aligned rows, D" << dim);
    store_and_gather(odd, 1, slots, ElementType::kFloat16, ScaleRule::kStandard, harness::RowPattern::kNormal, true,
                     ++seed);
  }
}

// The row kernels' own edges against the reference: non-finite inputs (zeroed and counted
// before a transform, counted by the block rule or the FP8 rounding without one; the same rows
// unrotated through the vectorized store, FP8 V beside plain K, count alike), and a gather
// over a bad block-table entry, a length past the table and a broken global scale (NaN rows,
// counted, never read).
TEST_F(Gpu, RowKernelsHandleNonFiniteInputsAndBadEntriesAsTheReference) {
  constexpr ElementFormat kNv = ElementFormat::kNvfp4, kF8 = ElementFormat::kFp8E4M3;
  const ValidLayout fp8_v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 4, 16, 2, 64, kNv, kF8}));
  CacheFormat f;
  f.layers = {LayerFormat{}};
  f.layers[0].k.rotation = 32;
  f.layers[0].v.element = kF8;
  const ValidLayout v = with_format(fp8_v, f);
  const CacheDims& d = v.layout().dims;
  const int64_t tokens = 20, row = d.heads * d.head_dim;
  std::vector<uint16_t> k(size_t(tokens * row)), vv(k.size());
  std::mt19937 rng{7u};
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (size_t i = 0; i < k.size(); ++i) k[i] = float_to_bf16(n(rng)), vv[i] = float_to_bf16(n(rng));
  const float specials[4] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(), 3.0e38f};
  for (int i = 0; i < 12; ++i) {
    k[size_t(i * 97 % k.size())] = float_to_bf16(specials[i % 4]);
    vv[size_t(i * 89 % vv.size())] = float_to_bf16(specials[(i + 1) % 4]);
  }
  std::vector<int64_t> slots(static_cast<size_t>(tokens));
  std::iota(slots.begin(), slots.end(), 5);
  const float gs_host[2] = {0.5f, 0.25f};
  StoreArgs a;
  a.rows = {k.data(), vv.data(), tokens, row};
  a.slots = slots.data();
  a.slots_are_int64 = true;
  a.k_global_scale = &gs_host[0];
  a.v_global_scale = &gs_host[1];
  auto dk = DeviceBuffer<uint16_t>::from(k), dv = DeviceBuffer<uint16_t>::from(vv);
  auto dslots = DeviceBuffer<int64_t>::from(slots);
  auto scales = DeviceBuffer<float>::from({gs_host[0], gs_host[1]});
  // The store of `layout` against the reference's: the bytes and the counters.
  const auto store_as_reference = [&](const ValidLayout& layout, reference::HostCache& cpu, DeviceCache& cache) {
    DeviceStatus cpu_status;
    StoreArgs h = a;
    h.status = &cpu_status;
    reference::store(layout, cpu.buffers, h);
    EXPECT_GT(cpu_status.non_finite, 0u);
    auto status = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
    StoreArgs g = a;
    g.rows = {dk.get(), dv.get(), tokens, row};
    g.slots = dslots.get();
    g.k_global_scale = scales.get();
    g.v_global_scale = scales.get() + 1;
    g.status = status.get();
    ASSERT_TRUE(store(layout, cache.view(), g, nullptr).ok());
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = cache.download();
    for (size_t b = 0; b < got.size(); ++b) EXPECT_EQ(got[b], cpu.storage[b]) << "buffer " << b;
    EXPECT_TRUE(same_status(status.download()[0], cpu_status)) << "gpu: " << status_text(status.download()[0])
                                                             << "\ncpu: " << status_text(cpu_status);
  };
  // The same rows without K's rotation go through the vectorized store (FP8 V beside plain K).
  {
    CacheFormat unrotated = f;
    unrotated.layers[0].k.rotation = kNoRotation;
    const ValidLayout vector_layout = with_format(fp8_v, unrotated);
    reference::HostCache cpu(vector_layout.layout(), kPoison);
    DeviceCache cache(vector_layout.layout(), kPoison);
    SCOPED_TRACE("the vectorized store");
    store_as_reference(vector_layout, cpu, cache);
  }
  reference::HostCache cpu(v.layout(), kPoison);
  DeviceCache cache(v.layout(), kPoison);
  store_as_reference(v, cpu, cache);
  // Gather: sequence 0 reads pages 0, 1 and a bad entry (99); sequence 1 claims more tokens
  // than its table holds; then both again with V's global scale broken.
  const std::vector<int32_t> table = {0, 1, 99, 1, 0, 2};
  const std::vector<int32_t> cu = {0, 40, 100};  // 40 and 60 rows: 12 past sequence 1's table of 48 tokens
  for (float v_scale : {gs_host[1], std::numeric_limits<float>::quiet_NaN()}) {
    const float gsx[2] = {gs_host[0], v_scale};
    const size_t out_n = size_t(100 * row);
    std::vector<uint16_t> want_k(out_n, 0xFFFF), want_v(out_n, 0xFFFF);
    GatherArgs ca;
    ca.batch = {.block_table = table.data(), .block_table_stride = 3, .cu_seqlens = cu.data(), .batch = 2};
    ca.k_global_scale = &gsx[0];
    ca.v_global_scale = &gsx[1];
    ca.k_out = want_k.data();
    ca.v_out = want_v.data();
    DeviceStatus cpu_g;
    ca.status = &cpu_g;
    reference::gather(v, cpu.buffers, ca);
    auto dtable = DeviceBuffer<int32_t>::from(table);
    auto dcu = DeviceBuffer<int32_t>::from(cu);
    auto dgs = DeviceBuffer<float>::from({gsx[0], gsx[1]});
    auto gstatus = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
    DeviceBuffer<uint16_t> kout(out_n), vout(out_n);
    kout.fill_bytes(0xFF);
    vout.fill_bytes(0xFF);
    GatherArgs ga = ca;
    ga.batch.block_table = dtable.get();
    ga.batch.cu_seqlens = dcu.get();
    ga.k_global_scale = dgs.get();
    ga.v_global_scale = dgs.get() + 1;
    ga.k_out = kout.get();
    ga.v_out = vout.get();
    ga.status = gstatus.get();
    ASSERT_TRUE(gather(v, cache.view(), ga, nullptr).ok());
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(kout.download(), want_k) << "V scale " << v_scale;
    EXPECT_EQ(vout.download(), want_v) << "V scale " << v_scale;
    EXPECT_TRUE(same_status(gstatus.download()[0], cpu_g)) << "gpu: " << status_text(gstatus.download()[0])
                                                          << "\ncpu: " << status_text(cpu_g);
    EXPECT_GT(cpu_g.bad_pages + cpu_g.bad_lengths, 0u);
  }
}

// What a family cannot honour is refused before anything is launched, never read or written
// as if it were plain NVFP4: a format that smooths K needs its k_mean on the device, one that
// scales K's channels its k_channel_scale, and either without such a format is refused too; a
// code order decode has no placement for.
// (Every family takes every format: FP8 sides are read by decode and prefill, test_decode.cpp
// and test_prefill.cpp.)
TEST_F(Gpu, FormatsAFamilyLacksAreRefused) {
  const ValidLayout plain = validate(instantiate(preset_spec("nvfp4kv-native"), {2, 8, 16, 2, 64}));
  const CacheDims& d = plain.layout().dims;
  DeviceCache cache(plain.layout(), kPoison);
  DeviceBuffer<uint16_t> rows(size_t(16 * d.heads * d.head_dim)), q(size_t(4 * d.head_dim)), out(q.size() * 2);
  auto slots = DeviceBuffer<int64_t>::from({0});
  auto table = DeviceBuffer<int32_t>::from({0, 1});
  auto lengths = DeviceBuffer<int32_t>::from({0, 1});
  auto scales = DeviceBuffer<float>::from({1.0f, 1.0f});
  auto mean = DeviceBuffer<float>::from(std::vector<float>(size_t(d.layers * d.heads * d.head_dim), 0.25f));
  CacheFormat smoothed;
  smoothed.layers = {LayerFormat{}};
  smoothed.k_mean.assign(size_t(d.layers * d.heads * d.head_dim), 0.25f);
  LayoutSpec high_first = preset_spec("nvfp4kv-native");
  high_first.codes = *code_order_named("high-first");
  const ValidLayout reordered = validate(instantiate(high_first, {2, 8, 16, 2, 64}));
  const int32_t q_lens[1] = {1};
  const auto args = [&](const float* k_mean) {
    DecodeArgs a{.q = q.get(), .q_heads = 4,
                 .batch = {.block_table = table.get(), .block_table_stride = 1, .seq_lens = lengths.get() + 1, .batch = 1},
                 .softmax_scale = 0.125f, .k_global_scale = scales.get(), .v_global_scale = scales.get() + 1,
                 .out = out.get()};
    a.k_mean = k_mean;
    PrefillArgs pa{.q = q.get(), .q_heads = 4, .cu_seqlens_q = lengths.get(), .max_q_len = 1,
                   .batch = {.block_table = table.get(), .block_table_stride = 1, .seq_lens = lengths.get() + 1, .batch = 1},
                   .softmax_scale = 0.125f, .k_global_scale = scales.get(), .v_global_scale = scales.get() + 1,
                   .out = out.get()};
    pa.k_mean = k_mean;
    return std::make_pair(a, pa);
  };
  const auto expect_refused = [](const Result& r, Status status, const std::string& needle) {  // by name
    EXPECT_EQ(r.status, status) << r.message;
    EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
  };
  // k_mean: missing where the format smooths K, given where it does not.
  {
    const ValidLayout v = with_format(plain, smoothed);
    const auto [a, pa] = args(nullptr);
    StoreArgs s{.rows = {rows.get(), rows.get(), 1, d.heads * d.head_dim}, .slots = slots.get(), .slots_are_int64 = true,
                .k_global_scale = scales.get(), .v_global_scale = scales.get() + 1};
    expect_refused(store(v, cache.view(), s, nullptr), Status::kInvalidArgument, "pass a device copy of its k_mean");
    expect_refused(decode_attention(v, cache.view(), a, nullptr), Status::kInvalidArgument,
                   "pass a device copy of its k_mean");
    s.k_mean = mean.get();
    expect_refused(store(plain, cache.view(), s, nullptr), Status::kInvalidArgument, "smooths no K");
  }
  // k_channel_scale (lambda): the same, for every family; a format with both needs both.
  {
    CacheFormat scaled = smoothed;
    scaled.k_channel_scale.assign(size_t(d.layers * d.heads * d.head_dim), 2.0f);
    const ValidLayout v = with_format(plain, scaled);
    auto [a, pa] = args(mean.get());
    StoreArgs s{.rows = {rows.get(), rows.get(), 1, d.heads * d.head_dim}, .slots = slots.get(), .slots_are_int64 = true,
                .k_global_scale = scales.get(), .v_global_scale = scales.get() + 1};
    s.k_mean = mean.get();
    GatherArgs g{.batch = {.block_table = table.get(), .block_table_stride = 1, .cu_seqlens = lengths.get(), .batch = 1},
                 .k_global_scale = scales.get(), .v_global_scale = scales.get() + 1, .k_out = rows.get(),
                 .v_out = rows.get()};
    g.k_mean = mean.get();
    const std::string needle = "pass a device copy of its k_channel_scale";
    expect_refused(store(v, cache.view(), s, nullptr), Status::kInvalidArgument, needle);
    expect_refused(gather(v, cache.view(), g, nullptr), Status::kInvalidArgument, needle);
    expect_refused(decode_attention(v, cache.view(), a, nullptr), Status::kInvalidArgument, needle);
    expect_refused(prefill_attention(v, cache.view(), pa, nullptr), Status::kInvalidArgument, needle);
    auto lambda = DeviceBuffer<float>::from(scaled.k_channel_scale);
    a.k_channel_scale = lambda.get();
    a.k_mean = nullptr;  // lambda given, mu still owed
    expect_refused(decode_attention(v, cache.view(), a, nullptr), Status::kInvalidArgument, "pass a device copy of its k_mean");
    a.k_mean = mean.get();
    expect_refused(decode_attention(with_format(plain, smoothed), cache.view(), a, nullptr), Status::kInvalidArgument,
                   "scales no K channels");
  }
  // A code order decode has no placement for (high-first): store, gather and prefill take it,
  // decode and a mixed batch's decode run refuse it (never read it as standard); its writes go
  // to a scratch cache, so the check below stays about the refused calls.
  {
    DeviceCache scratch(plain.layout(), kPoison);
    const auto [a, pa] = args(nullptr);
    StoreArgs s{.rows = {rows.get(), rows.get(), 1, d.heads * d.head_dim}, .slots = slots.get(), .slots_are_int64 = true,
                .k_global_scale = scales.get(), .v_global_scale = scales.get() + 1};
    GatherArgs g{.batch = {.block_table = table.get(), .block_table_stride = 1, .cu_seqlens = lengths.get(), .batch = 1},
                 .k_global_scale = scales.get(), .v_global_scale = scales.get() + 1, .k_out = rows.get(),
                 .v_out = rows.get()};
    EXPECT_TRUE(store(reordered, scratch.view(), s, nullptr).ok());
    EXPECT_TRUE(gather(reordered, scratch.view(), g, nullptr).ok());
    EXPECT_TRUE(prefill_attention(reordered, scratch.view(), pa, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const Result& r : {decode_attention(reordered, scratch.view(), a, nullptr),
                            mixed_attention(reordered, scratch.view(), MixedBatch{.args = pa, .q_lens = q_lens}, nullptr)})
      expect_refused(r, Status::kUnsupported, "codes in the high-first order");
  }
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  for (const auto& buffer : cache.download())
    EXPECT_EQ(std::count(buffer.begin(), buffer.end(), kPoison), std::ptrdiff_t(buffer.size())) << "a refused call wrote";
}

}  // namespace
}  // namespace nvfp4kv
