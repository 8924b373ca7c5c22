// FP8 pages in the layout contract: a layout fixes each side's element format (NVFP4, or
// FP8 E4M3 with one byte per value and no block scales), the validator proves the rows it
// implies, compare refuses to match different elements, and the reference store, gather,
// decode and prefill write and read every combination from that one object.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "nvfp4kv/core/cache_format.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"
#include "nvfp4kv/core/plan.hpp"
#include "nvfp4kv/core/transform.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "nvfp4kv/reference/quantize.hpp"

namespace nvfp4kv {
namespace {

constexpr ElementFormat kNv = ElementFormat::kNvfp4, kF8 = ElementFormat::kFp8E4M3;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

Layout native(ElementFormat k, ElementFormat v, int64_t layers = 2, int64_t pages = 4, int64_t n = 16,
              int64_t heads = 2, int64_t dim = 64) {
  return instantiate(preset_spec("nvfp4kv-native"), {layers, pages, n, heads, dim, k, v});
}

TEST(Fp8Layout, RowsAndRegionsFollowTheElements) {
  const CacheDims d{1, 1, 16, 1, 128, kF8, kNv};
  EXPECT_EQ(d.columns(Region::kKData), 128);
  EXPECT_EQ(d.columns(Region::kKScale), 0);
  EXPECT_FALSE(d.holds(Region::kKScale));
  EXPECT_EQ(d.columns(Region::kVData), 64);
  EXPECT_EQ(d.columns(Region::kVScale), 8);
  EXPECT_EQ(d.row_bytes(), 128 + 64 + 8);
  EXPECT_DOUBLE_EQ(bits_per_value(d), 6.25);
  EXPECT_DOUBLE_EQ(bits_per_value(CacheDims{1, 1, 16, 1, 128, kF8, kF8}), 8.0);
  EXPECT_DOUBLE_EQ(bits_per_value(CacheDims{1, 1, 16, 1, 128}), 4.5);
}

// The native layout is written over each side's row bytes (kd ks vd vs), so every
// combination of elements is one contiguous span per (page, head), proved sound; at NVFP4
// on both sides it places every byte where it always did.
TEST(Fp8Layout, NativeLayoutHoldsEveryCombination) {
  for (int64_t dim : {64, 80, 128, 256})
    for (ElementFormat k : {kNv, kF8})
      for (ElementFormat v : {kNv, kF8}) {
        const Layout l = native(k, v, 2, 3, 16, 2, dim);
        const CheckResult r = check(l);
        ASSERT_TRUE(r.report.ok) << dim << " " << r.report.summary();
        const auto plane = [&](int64_t bytes) { return (16 * bytes + 15) / 16 * 16; };
        const int64_t span = plane(k == kF8 ? dim : dim / 2) + plane(k == kF8 ? 0 : dim / 16) +
                             plane(v == kF8 ? dim : dim / 2) + plane(v == kF8 ? 0 : dim / 16);
        EXPECT_EQ(l.region(Region::kKData).head, span);
        EXPECT_EQ(l.buffers[0].bytes, 3 * 2 * span);
        // Every element of the regions that hold any: K then V, no gap, no byte twice.
        EXPECT_EQ(r.report.elements, 2 * 3 * 2 * 16 * l.dims.row_bytes());
        EXPECT_EQ(l.region(Region::kKData).token.stride, k == kF8 ? dim : dim / 2);
      }
  // Plain NVFP4: the same bytes as the layout's first version (v1 spells it in dd and sd).
  const Layout v1 = instantiate(preset_spec("nvfp4kv-native-v1"), {2, 4, 16, 2, 64});
  const CompareReport same = compare(native(kNv, kNv), v1);
  EXPECT_EQ(same.misplaced, 0) << same.summary("v2", "v1");
}

// A layout that spells its rows in NVFP4's sizes (dd, sd) cannot hold FP8 rows of D bytes:
// the validator finds the shared bytes. No preset of an engine is sound with FP8 forced on.
TEST(Fp8Layout, NvfpOnlyLayoutsAreRejectedWithFp8Rows) {
  int rejected = 0;
  for (const PresetInfo& p : list_presets()) {
    if (p.name == "nvfp4kv-native" || p.name == "nvfp4kv-native-layers") continue;
    Layout l;
    try {
      l = instantiate(preset_spec(p.name), {1, 4, 16, 2, 128, kF8, std::nullopt});
    } catch (const LayoutError&) {
      continue;  // a preset that fixes its own sizes or elements
    }
    const CheckResult r = check(l);
    EXPECT_FALSE(r.report.ok) << p.name << " accepted D-byte K rows at a stride of D/2";
    if (!r.report.ok) ++rejected;
  }
  EXPECT_GT(rejected, 10);
  // The message names two K elements on one byte.
  const CheckResult r = check(instantiate(preset_spec("nvfp4kv-native-v1"), {1, 4, 16, 2, 128, kF8, kNv}));
  ASSERT_TRUE(r.report.collision.has_value()) << r.report.summary();
  EXPECT_EQ(r.report.collision->a, Region::kKData);
}

TEST(Fp8Layout, TextFormElementsAndRegions) {
  const std::string fp8_file = R"({
    "name": "fp8-both",
    "elements": {"k": "fp8_e4m3", "v": "fp8_e4m3"},
    "buffers": [{"name": "k"}, {"name": "v"}],
    "regions": {
      "k_data": {"buffer": "k", "page": "N*H*kd", "token": "H*kd", "head": "kd"},
      "v_data": {"buffer": "v", "page": "N*H*vd", "token": "H*vd", "head": "vd"}
    }
  })";
  const Layout l = instantiate(parse_layout_spec(fp8_file), {1, 4, 16, 2, 64});
  EXPECT_EQ(l.dims.k_element, kF8);
  EXPECT_EQ(l.region(Region::kKData).token.stride, 2 * 64);
  EXPECT_EQ(l.buffers[0].bytes, 4 * 16 * 2 * 64);  // sized by what the regions reach
  ASSERT_TRUE(check(l).report.ok) << check(l).report.summary();
  // The text form round-trips, elements included, with no scale regions printed.
  const std::string json = to_json(l);
  EXPECT_NE(json.find("\"fp8_e4m3\""), std::string::npos);
  EXPECT_EQ(json.find("k_scale"), std::string::npos);
  const Layout back = instantiate(parse_layout_spec(json), {});
  EXPECT_EQ(back.dims.k_element, kF8);
  EXPECT_EQ(back.dims.v_element, kF8);
  EXPECT_EQ(compare(l, back).misplaced, 0);
  // The same file at NVFP4 lacks the scale regions NVFP4 needs: named.
  EXPECT_NE(error_of([&] { instantiate(parse_layout_spec(fp8_file), {1, 4, 16, 2, 64, kNv, std::nullopt}); })
                .find("fixes K elements as fp8_e4m3; nvfp4 contradicts it"),
            std::string::npos);
  std::string nv = fp8_file;
  nv.replace(nv.find("\"elements\": {\"k\": \"fp8_e4m3\", \"v\": \"fp8_e4m3\"},"), 47, "");
  EXPECT_NE(error_of([&] { instantiate(parse_layout_spec(nv), {1, 4, 16, 2, 64}); })
                .find("regions: \"k_scale\" is missing; K holds nvfp4 elements"),
            std::string::npos);
  // An unknown element format, by name.
  std::string bad = fp8_file;
  bad.replace(bad.find("\"k\": \"fp8_e4m3\""), 15, "\"k\": \"fp6\"");
  EXPECT_NE(error_of([&] { parse_layout_spec(bad); }).find("elements.k: expected \"nvfp4\" or \"fp8_e4m3\""),
            std::string::npos);
  // Data regions are always required.
  std::string no_data = fp8_file;
  no_data.replace(no_data.find("\"v_data\""), 8, "\"v_scale\"");
  EXPECT_NE(error_of([&] { parse_layout_spec(no_data); }).find("\"v_data\" is missing"), std::string::npos);
}

// A layout with a buffer per region, written once for every element combination: where K is
// FP8 its scale buffer, sized "P*N*H*ks" bytes, holds nothing and is 0 bytes; that is sound.
// A 0-byte buffer that a region does place bytes in is still refused.
TEST(Fp8Layout, AnEmptyScaleBufferOfAnFp8SideIsSound) {
  const std::string file = R"({
    "name": "four-buffers",
    "buffers": [{"name": "kd", "bytes": "P*N*H*kd"}, {"name": "ks", "bytes": "P*N*H*ks"},
                {"name": "vd", "bytes": "P*N*H*vd"}, {"name": "vs", "bytes": "P*N*H*vs"}],
    "regions": {
      "k_data": {"buffer": "kd", "page": "N*H*kd", "token": "H*kd", "head": "kd"},
      "k_scale": {"buffer": "ks", "page": "N*H*ks", "token": "H*ks", "head": "ks"},
      "v_data": {"buffer": "vd", "page": "N*H*vd", "token": "H*vd", "head": "vd"},
      "v_scale": {"buffer": "vs", "page": "N*H*vs", "token": "H*vs", "head": "vs"}
    }
  })";
  for (ElementFormat k : {kNv, kF8}) {
    const Layout l = instantiate(parse_layout_spec(file), {1, 4, 16, 2, 64, k, kNv});
    EXPECT_EQ(l.buffers[1].bytes, k == kF8 ? 0 : 4 * 16 * 2 * 4);
    const CheckResult r = check(l);
    EXPECT_TRUE(r.report.ok) << element_format_name(k) << ": " << r.report.summary();
  }
  Layout bad = instantiate(parse_layout_spec(file), {1, 4, 16, 2, 64});
  bad.buffers[3].bytes = 0;  // V's scales need their bytes
  EXPECT_NE(check(bad).report.summary().find("buffer \"vs\" has size 0"), std::string::npos)
      << check(bad).report.summary();
}

// Without a format the store call's rule applies to the NVFP4 sides: asking for 4over6 of a
// layout with no NVFP4 side is refused (it would be silently ignored), not of a mixed one.
TEST(Fp8Layout, AStoreRuleNeedsAnNvfp4Side) {
  const float gs = 1.0f;
  StoreArgs a;
  a.k_global_scale = a.v_global_scale = &gs;
  a.rule = ScaleRule::kFourOverSix;
  const ValidLayout both = validate(native(kF8, kF8));
  reference::HostCache cache(both.layout(), 0);
  EXPECT_NE(store_problem(both, cache.buffers, a).find("4over6 is NVFP4's block rule, and this layout holds K and V as "
                                                       "fp8_e4m3"),
            std::string::npos);
  const ValidLayout mixed = validate(native(kF8, kNv));
  reference::HostCache mixed_cache(mixed.layout(), 0);
  EXPECT_EQ(store_problem(mixed, mixed_cache.buffers, a), "");
  a.rule = ScaleRule::kStandard;
  EXPECT_EQ(store_problem(both, cache.buffers, a), "");
}

TEST(Fp8Layout, CompareRefusesDifferentElementsAndIgnoresCodesOfFp8) {
  const std::string why = error_of([] { compare(native(kF8, kNv), native(kNv, kNv)); });
  EXPECT_NE(why.find("describe different caches: K elements fp8_e4m3 vs nvfp4"), std::string::npos) << why;
  // FP8 bytes are whole E4M3 codes: a code order (of NVFP4 nibbles) cannot misread them ...
  Layout a = native(kF8, kF8), b = a;
  b.codes = CodeOrder{};
  EXPECT_TRUE(compare(a, b).agree);
  // ... but with one NVFP4 side it matters.
  Layout c = native(kF8, kNv), e = c;
  e.codes = CodeOrder{};
  EXPECT_FALSE(compare(c, e).agree);
}

TEST(Fp8Layout, PlanByteMapAndInterleaveRefusal) {
  PlanRequest q;
  q.layers = 4, q.kv_heads = 8, q.head_dim = 128, q.pages = 10;
  const Plan nv = plan(q);
  q.k_element = kF8;
  const Plan k8 = plan(q);
  // One page of one layer, 8 heads of 16 tokens: (64 + 8 + 64 + 8) * 16 vs (128 + 64 + 8) * 16 bytes.
  EXPECT_EQ(nv.bytes_per_page_per_layer, 8 * 16 * 144);
  EXPECT_EQ(k8.bytes_per_page_per_layer, 8 * 16 * 200);
  EXPECT_NE(k8.summary().find("elements        K fp8_e4m3, V nvfp4"), std::string::npos) << k8.summary();
  const std::string map = byte_map(k8.layout.layout());
  EXPECT_EQ(map.substr(map.find("\n", map.find("buffer"))).find('k'), std::string::npos) << "no K scale bytes";
  q.v_element = kF8;
  q.interleave_v_scales = true;
  EXPECT_NE(error_of([&] { plan(q); }).find("interleaved V scales need V in NVFP4"), std::string::npos);
  Layout l = native(kNv, kF8);
  EXPECT_NE(error_of([&] { interleave_scale_plane(l, Region::kVScale); }).find("no block scales"), std::string::npos);
}

TEST(Fp8Layout, FormatMustAgreeWithTheLayout) {
  const ValidLayout nv = validate(native(kNv, kNv)), k8 = validate(native(kF8, kNv));
  CacheFormat f;
  f.layers.assign(2, LayerFormat{});
  f.layers[1].k.element = kF8;
  const std::string why = error_of([&] { with_format(nv, f); });
  EXPECT_NE(why.find("format.layers[1].k.element: fp8_e4m3, but the layout holds K as nvfp4"), std::string::npos)
      << why;
  EXPECT_NE(error_of([&] { with_format(k8, f); }).find("format.layers[0].k.element: nvfp4, but the layout holds K as "
                                                       "fp8_e4m3"),
            std::string::npos);
  f.layers[0].k.element = kF8;
  EXPECT_EQ(with_format(k8, f).format().layer(0).k.element, kF8);
  EXPECT_EQ(element_problem(f, k8.layout().dims), "");
}

// ---- the reference writer and readers --------------------------------------------------
struct Rows {
  static constexpr int64_t kTokens = 37, kHeads = 2, kDim = 64;
  std::vector<float> k, v;
  std::vector<int64_t> slots;
  explicit Rows(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int64_t i = 0; i < kTokens * kHeads * kDim; ++i) {
      const int64_t e = i % kDim;
      k.push_back((e == 5 ? 20.0f : 2.0f) * n(rng) + (e % 7 == 0 ? 3.0f : 0.0f));
      v.push_back(n(rng));
    }
    for (int64_t t = 0; t < kTokens; ++t) slots.push_back(t);
  }
};

StoreArgs store_args(const Rows& r, const float* kgs, const float* vgs, DeviceStatus* status, int64_t layer = 1) {
  return {.rows = {r.k.data(), r.v.data(), Rows::kTokens, Rows::kHeads * Rows::kDim}, .type = ElementType::kFloat32,
          .slots = r.slots.data(), .slots_are_int64 = true, .layer = layer, .k_global_scale = kgs,
          .v_global_scale = vgs, .status = status};
}

// Every K byte is fp8_encode_element(k, 1 / scale) at the layout's place; V's NVFP4 bytes
// are exactly those an all-NVFP4 cache holds for the same rows; a NaN or Inf is +0, counted.
TEST(Fp8Reference, StoreIsBitExact) {
  Rows r(3);
  r.k[7] = std::numeric_limits<float>::quiet_NaN();
  r.k[300] = std::numeric_limits<float>::infinity();
  r.k[301] = 1.0e30f;  // saturates at 448 * scale
  const float kgs = 25.0f / 448.0f, vgs = recommend_global_scale(4.0f);
  const ValidLayout k8 = validate(native(kF8, kNv)), nv = validate(native(kNv, kNv));
  reference::HostCache c8(k8.layout(), 0xA5), cn(nv.layout(), 0xA5);
  DeviceStatus s8{}, sn{};
  reference::store(k8, c8.buffers, store_args(r, &kgs, &vgs, &s8));
  reference::store(nv, cn.buffers, store_args(r, &kgs, &vgs, &sn));
  EXPECT_EQ(s8.stored, uint64_t(Rows::kTokens));
  EXPECT_EQ(s8.non_finite, 2u);
  const float inv = 1.0f / kgs;
  const CacheDims& d = k8.layout().dims;
  for (int64_t t = 0; t < Rows::kTokens; ++t)
    for (int64_t h = 0; h < d.heads; ++h) {
      for (int64_t e = 0; e < d.head_dim; ++e) {
        const float x = r.k[size_t((t * d.heads + h) * d.head_dim + e)];
        const Coord c{1, t / 16, t % 16, h, e};
        ASSERT_EQ(*element_address(k8.layout(), c8.buffers, Region::kKData, c), fp8_encode_element(x, inv));
      }
      for (int64_t j = 0; j < d.head_dim / 2; ++j) {
        const Coord c{1, t / 16, t % 16, h, j};
        ASSERT_EQ(*element_address(k8.layout(), c8.buffers, Region::kVData, c),
                  *element_address(nv.layout(), cn.buffers, Region::kVData, c));
      }
      for (int64_t g = 0; g < d.head_dim / 16; ++g) {
        const Coord c{1, t / 16, t % 16, h, g};
        ASSERT_EQ(*element_address(k8.layout(), c8.buffers, Region::kVScale, c),
                  *element_address(nv.layout(), cn.buffers, Region::kVScale, c));
      }
    }
  EXPECT_EQ(*element_address(k8.layout(), c8.buffers, Region::kKData, Coord{1, 0, 0, 0, 7}), 0);
  EXPECT_EQ(*element_address(k8.layout(), c8.buffers, Region::kKData, Coord{1, 0, 2, 0, 45}), 0x7E);
}

// gather gives back exactly the float each stored byte means (E4M3 code times the scale for
// FP8, the block decode for NVFP4), and FP8 K is far closer to the input than NVFP4 K.
TEST(Fp8Reference, GatherDecodesEachSideByItsElements) {
  const Rows r(4);
  float amax = 0;
  for (float x : r.k) amax = std::max(amax, std::fabs(x));
  const float kgs = amax / 448.0f, vgs = recommend_global_scale(4.0f);  // FP8's per-tensor scale: amax at 448
  const std::vector<int32_t> pages{0, 1, 2};
  double err[2] = {0, 0};
  for (ElementFormat k : {kNv, kF8}) {
    const ValidLayout l = validate(native(k, kF8));
    reference::HostCache cache(l.layout(), 0);
    reference::store(l, cache.buffers, store_args(r, &kgs, &vgs, nullptr));
    const auto got = reference::gather_sequence(l, cache.buffers, pages, Rows::kTokens, 1, kgs, vgs);
    for (int64_t t = 0; t < Rows::kTokens; ++t)
      for (int64_t h = 0; h < Rows::kHeads; ++h) {
        std::vector<double> kr(size_t(Rows::kDim)), vr(size_t(Rows::kDim));
        reference::read_row(l.layout(), cache.buffers, Side::kK, {1, t / 16, t % 16, h, 0}, kgs, kr.data());
        reference::read_row(l.layout(), cache.buffers, Side::kV, {1, t / 16, t % 16, h, 0}, vgs, vr.data());
        for (int64_t e = 0; e < Rows::kDim; ++e) {
          const size_t i = size_t((t * Rows::kHeads + h) * Rows::kDim + e);
          ASSERT_EQ(got.v[i], float(vr[size_t(e)]));
          ASSERT_EQ(got.v[i], fp8_decode_element(fp8_encode_element(r.v[i], 1.0f / vgs), vgs));
          ASSERT_EQ(got.k[i], float(kr[size_t(e)]));
          if (k == kF8) ASSERT_EQ(got.k[i], fp8_decode_element(fp8_encode_element(r.k[i], 1.0f / kgs), kgs));
        }
      }
    err[k == kF8] = reference::error_stats(r.k, got.k).rel_l2;
  }
  // E4M3 keeps 3 mantissa bits everywhere; E2M1 one, relative to its block: several times less error.
  EXPECT_LT(err[1] * 3, err[0]) << "fp8 " << err[1] << " nvfp4 " << err[0];
}

// Decode and prefill over every element combination, with a rotation, K smoothing and K's
// channel scale on the FP8 side too, equal attention in float64 over the values gather restores; a reader
// whose layout holds K as NVFP4 cannot be attached to these bytes (compare refuses it).
TEST(Fp8Reference, AttentionOverEveryCombinationEqualsFloat64) {
  const Rows r(5);
  const float kgs = 40.0f / 448.0f, vgs = 5.0f / 448.0f;
  const int64_t q_heads = 4, dim = Rows::kDim, q_len = 3;
  std::mt19937 rng(12);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> q(size_t(q_len * q_heads * dim));
  for (float& e : q) e = n(rng);
  std::vector<float> mu(size_t(2 * Rows::kHeads * dim));
  for (size_t i = 0; i < mu.size(); ++i) mu[i] = (i % 7 == 0) ? 3.0f : 0.0f;
  const std::vector<int32_t> pages{0, 1, 2};
  const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
  for (ElementFormat k : {kNv, kF8})
    for (ElementFormat v : {kNv, kF8})
      for (bool transforms : {false, true}) {
        ValidLayout l = validate(native(k, v));
        if (transforms) {
          CacheFormat f;
          f.layers = {LayerFormat{}};
          f.layers[0].k = {k, ScaleRule::kStandard, 32};
          f.layers[0].v = {v, ScaleRule::kStandard, kRotateWholeHead};
          f.k_mean = mu;
          f.k_channel_scale.assign(mu.size(), 1.0f);  // lambda, not a power of two on every third channel
          for (size_t i = 0; i < mu.size(); i += 3) f.k_channel_scale[i] = (i % 2) ? 0.7f : 1.3f;
          l = with_format(l, f);
        }
        reference::HostCache cache(l.layout(), 0);
        reference::store(l, cache.buffers, store_args(r, &kgs, &vgs, nullptr));
        const auto kv = reference::gather_sequence(l, cache.buffers, pages, Rows::kTokens, 1, kgs, vgs);
        const std::vector<double> kd(kv.k.begin(), kv.k.end()), vd(kv.v.begin(), kv.v.end());
        for (float softcap : {0.0f, 8.0f}) {
          const int32_t cu[2] = {0, int32_t(q_len)}, len = int32_t(Rows::kTokens);
          PrefillArgs a{.q = q.data(), .q_type = ElementType::kFloat32, .q_heads = q_heads, .cu_seqlens_q = cu,
                        .max_q_len = q_len,
                        .batch = {.block_table = pages.data(), .block_table_stride = 3, .seq_lens = &len, .batch = 1},
                        .layer = 1, .softmax_scale = 0.125f, .k_global_scale = &kgs, .v_global_scale = &vgs,
                        .softcap = softcap, .sinks = sinks};
          const auto got = reference::prefill_attention(l, cache.buffers, a);
          double worst = 0;
          for (int64_t i = 0; i < q_len; ++i) {
            const int64_t tokens = Rows::kTokens - q_len + i + 1;
            std::vector<double> qd(q.begin() + i * q_heads * dim, q.begin() + (i + 1) * q_heads * dim);
            std::vector<double> want(static_cast<size_t>(q_heads * dim)), lse(static_cast<size_t>(q_heads));
            reference::attend(qd.data(), q_heads, kd.data(), vd.data(), tokens, Rows::kHeads, dim,
                              {.softmax_scale = 0.125, .softcap = softcap, .sinks = sinks}, want.data(), lse.data());
            for (int64_t j = 0; j < q_heads * dim; ++j)
              worst = std::max(worst, std::fabs(got.out[size_t(i * q_heads * dim + j)] - want[size_t(j)]));
            for (int64_t h = 0; h < q_heads; ++h)
              worst = std::max(worst, std::fabs(got.lse[size_t(i * q_heads + h)] - lse[size_t(h)]));
          }
          // The restored K/V went through float32 once (gather's output): the bound is that rounding.
          // Without transforms the restored values are the stored floats themselves: equal. With them
          // gather's float32 rounding of the restored K/V is the difference (measured up to 4.2e-7).
          const std::string what = std::string(element_format_name(k)) + "/" + element_format_name(v) +
                                   " transforms " + std::to_string(transforms) + " softcap " + std::to_string(softcap);
          if (transforms) EXPECT_LT(worst, 2e-6) << what;
          else EXPECT_EQ(worst, 0.0) << what;
          // A reader that takes the other side's scale for K is caught by these bounds.
          PrefillArgs swapped = a;
          swapped.k_global_scale = &vgs;
          const auto wrong = reference::prefill_attention(l, cache.buffers, swapped);
          double off = 0;
          for (size_t j = 0; j < wrong.out.size(); ++j) off = std::max(off, std::fabs(wrong.out[j] - got.out[j]));
          EXPECT_GT(off, 1e-2) << what;
        }
      }
}

// The GPU tests poison the slots no sequence reads with E4M3 NaN (engines leave a page's
// unwritten slots as they were): the helper poisons exactly those slots' FP8 elements and block
// scales, and the reference, which reads only tokens that count, gives the same bits with them.
TEST(Fp8Reference, UnreadSlotsPoisonedChangeNothingARightReaderReads) {
  for (auto [k, v] : {std::pair{kF8, kNv}, {kNv, kF8}, {kF8, kF8}}) {
    const ValidLayout valid = validate(native(k, v, 1, 4, 16, 2, 64));
    const CacheDims& d = valid.layout().dims;
    auto bytes = harness::random_cache(valid, 0, 3);
    // Two sequences: 20 tokens over pages 2 and 0, 16 over page 3; page 1 and tokens 4..15 of
    // page 0 are read by neither (the third entry, page 1, lies past the first's length).
    const std::vector<int32_t> table{2, 0, 1, 3, 1, 1};
    const std::vector<int32_t> lengths{20, 16};
    auto poisoned = bytes;
    EXPECT_EQ(harness::poison_unread_slots(valid, 0, table, 3, lengths, poisoned), 16 + 12);
    int64_t changed = 0, to_nan = 0;
    for (size_t b = 0; b < bytes.size(); ++b)
      for (size_t i = 0; i < bytes[b].size(); ++i) {
        changed += bytes[b][i] != poisoned[b][i];
        to_nan += bytes[b][i] != poisoned[b][i] && poisoned[b][i] == 0x7F;
      }
    // Per poisoned slot and head: the FP8 side's 64 element bytes, the NVFP4 side's 4 scale
    // bytes (random_cache never writes 0x7F there, so each of them changes).
    const int64_t per_slot = d.heads * ((k == kF8 ? 64 : 4) + (v == kF8 ? 64 : 4));
    EXPECT_EQ(changed, 28 * per_slot);
    EXPECT_EQ(to_nan, changed);
    reference::HostCache clean(valid.layout(), 0), dirty(valid.layout(), 0);
    for (size_t b = 0; b < bytes.size(); ++b) clean.storage[b] = bytes[b], dirty.storage[b] = poisoned[b];
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> q(size_t(2 * 4 * d.head_dim));
    for (float& e : q) e = n(rng);
    const float gs = 0.5f;
    DecodeArgs a{.q = q.data(), .q_type = ElementType::kFloat32, .q_heads = 4,
                 .batch = {.block_table = table.data(), .block_table_stride = 3, .seq_lens = lengths.data(), .batch = 2},
                 .softmax_scale = 0.125f, .k_global_scale = &gs, .v_global_scale = &gs};
    const auto want = reference::decode_attention(valid, clean.buffers, a);
    const auto got = reference::decode_attention(valid, dirty.buffers, a);
    ASSERT_EQ(got.out.size(), want.out.size());
    for (size_t i = 0; i < want.out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got.out[i]));
      EXPECT_EQ(got.out[i], want.out[i]) << i;
    }
  }
}

}  // namespace
}  // namespace nvfp4kv
