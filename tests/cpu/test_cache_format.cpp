// The cache format (core/cache_format.hpp): validation naming the field, the JSON round
// trip, bits per value; the FP8 element codec; the rotation; and the reference store,
// gather and decode honouring the format, with readers that skip a transform caught.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "nvfp4kv/core/cache_format.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/transform.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "nvfp4kv/reference/quantize.hpp"
#include "nvfp4kv/reference/transform.hpp"

namespace nvfp4kv {
namespace {

std::string problem_of(const CacheFormat& f, CacheDims d) { return format_problem(f, d); }

CacheDims dims(int64_t layers, int64_t heads, int64_t head_dim) { return {layers, 4, 16, heads, head_dim}; }

TEST(CacheFormat, ValidatesNamingTheField) {
  CacheFormat f;
  EXPECT_EQ(problem_of(f, dims(2, 2, 64)), "");
  f.layers = {LayerFormat{}};
  f.layers[0].k.rotation = 48;
  EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("format.layers[0].k.rotation: 48 is not a rotation size"),
            std::string::npos);
  f.layers[0].k.rotation = 32;
  EXPECT_EQ(problem_of(f, dims(2, 2, 64)), "");
  EXPECT_NE(problem_of(f, dims(2, 2, 80)).find("format.layers[0].k.rotation: 32 does not divide the head dim 80"),
            std::string::npos);
  f.layers[0].k.rotation = kRotateWholeHead;
  EXPECT_EQ(problem_of(f, dims(2, 2, 80)), "");
  f.layers[0].v.element = ElementFormat::kFp8E4M3;
  f.layers[0].v.rule = ScaleRule::kFourOverSix;
  EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("format.layers[0].v.rule"), std::string::npos);
  f.layers[0].v.rule = ScaleRule::kStandard;
  f.layers = {LayerFormat{}, LayerFormat{}, LayerFormat{}};
  EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("format.layers: 3 entries for a cache of 2 layers"), std::string::npos);
  EXPECT_EQ(problem_of(f, dims(3, 2, 64)), "");
  f.layers.clear();
  f.k_mean.assign(2 * 2 * 64 - 1, 0.5f);
  EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("format.k_mean: 255 values, expected (layers 2, heads 2, D 64) = 256"),
            std::string::npos);
  f.k_mean.assign(256, 0.5f);
  EXPECT_EQ(problem_of(f, dims(2, 2, 64)), "");
  f.k_mean[size_t((1 * 2 + 1) * 64 + 5)] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("format.k_mean[1][1][5]: nan is not finite"), std::string::npos);
  f.k_mean[size_t((1 * 2 + 1) * 64 + 5)] = 1.0f;
  // lambda divides: every value finite, positive and normal, and (layers, heads, D) of them.
  f.k_channel_scale.assign(2 * 2 * 64 + 1, 1.0f);
  EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("format.k_channel_scale: 257 values, expected (layers 2, heads 2, D 64)"),
            std::string::npos);
  f.k_channel_scale.assign(256, 0.75f);
  EXPECT_EQ(problem_of(f, dims(2, 2, 64)), "");
  for (float bad : {0.0f, -0.5f, 1.0e-40f, 1.0e-5f, 70000.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    f.k_channel_scale[size_t((0 * 2 + 1) * 64 + 9)] = bad;
    EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("format.k_channel_scale[0][1][9]: "), std::string::npos) << bad;
    EXPECT_NE(problem_of(f, dims(2, 2, 64)).find("is not a float in [2^-16, 2^16]"), std::string::npos) << bad;
  }
  for (float edge : {0x1p-16f, 0x1p16f}) {
    f.k_channel_scale[size_t((0 * 2 + 1) * 64 + 9)] = edge;
    EXPECT_EQ(problem_of(f, dims(2, 2, 64)), "") << edge;
  }
  f.k_channel_scale.clear();
  f.k_mean[size_t((1 * 2 + 1) * 64 + 5)] = std::numeric_limits<float>::quiet_NaN();
  // with_format refuses the same, naming the layout; a valid one is carried by the ValidLayout.
  const ValidLayout plain = validate(instantiate(preset_spec("nvfp4kv-native"), {2, 4, 16, 2, 64}));
  EXPECT_THROW(with_format(plain, f), LayoutError);
  f.k_mean[size_t((1 * 2 + 1) * 64 + 5)] = 1.0f;
  const ValidLayout v = with_format(plain, f);
  EXPECT_EQ(v.format(), f);
  EXPECT_TRUE(plain.format().implicit());
}

// transforms() picks the attention kernels' instances with the query and output steps
// (a plain cache must never pay for them, and a transformed one must never miss them), and
// the benchmarks' --transform names build exactly the format they say.
TEST(CacheFormat, TransformsSaysWhenAttentionNeedsItsSteps) {
  CacheFormat f;
  EXPECT_FALSE(f.transforms());
  f.layers = {LayerFormat{}, LayerFormat{}};
  f.layers[1].k.rule = ScaleRule::kFourOverSix;
  f.layers[0].v.element = ElementFormat::kFp8E4M3;
  EXPECT_FALSE(f.transforms());  // rules and element formats need no steps
  f.layers[1].v.rotation = 16;
  EXPECT_TRUE(f.transforms());
  f.layers[1].v.rotation = kNoRotation;
  f.layers[0].k.rotation = kRotateWholeHead;
  EXPECT_TRUE(f.transforms());
  f.layers[0].k.rotation = kNoRotation;
  f.k_mean.assign(2 * 2 * 64, 0.0f);  // mu, even all zeros: the kernels still read it
  EXPECT_TRUE(f.transforms());
  f.k_mean.clear();
  EXPECT_FALSE(f.transforms());
  f.k_channel_scale.assign(2 * 2 * 64, 1.0f);  // lambda, even all ones
  EXPECT_TRUE(f.transforms());
  EXPECT_FALSE(f.plain_nvfp4(1));

  EXPECT_EQ(harness::transform_format("plain", 2, 64, 1), CacheFormat{});
  const CacheFormat all = harness::transform_format("smooth-k+rotate-v+rotate-k", 2, 64, 1);
  ASSERT_EQ(all.layers.size(), 1u);
  EXPECT_EQ(all.layers[0].k.rotation, kRotateWholeHead);
  EXPECT_EQ(all.layers[0].v.rotation, kRotateWholeHead);
  EXPECT_EQ(all.k_mean.size(), 2u * 64u);
  const CacheFormat v_only = harness::transform_format("rotate-v", 2, 64, 1);
  EXPECT_EQ(v_only.layers[0].k.rotation, kNoRotation);
  EXPECT_FALSE(v_only.has_k_mean());
  const CacheFormat mu = harness::transform_format("smooth-k", 2, 64, 1);
  EXPECT_TRUE(mu.implicit());
  EXPECT_TRUE(mu.transforms());
  const CacheFormat lambda = harness::transform_format("scale-k+smooth-k", 2, 64, 1);
  EXPECT_TRUE(lambda.implicit());
  EXPECT_EQ(lambda.k_channel_scale.size(), 2u * 64u);
  EXPECT_EQ(lambda.k_mean.size(), 2u * 64u);
  EXPECT_EQ(format_problem(lambda, dims(1, 2, 64)), "");
  EXPECT_FALSE(all.has_k_channel_scale());
  EXPECT_EQ(format_problem(all, dims(1, 2, 64)), "");
  for (const char* bad : {"", "rotate-k+", "rotate-q", "plain+rotate-k", "rotate-k+rotate-k"})
    EXPECT_THROW(harness::transform_format(bad, 2, 64, 1), ArgumentError) << bad;
}

// `layout show`'s lines: mu and lambda are the cache's, so a format without per-layer entries
// that holds them is not plain NVFP4 and says so.
TEST(CacheFormat, TextNamesEveryTransform) {
  const CacheDims d = dims(1, 2, 64);
  EXPECT_NE(format_text(CacheFormat{}, d).find("plain NVFP4 for K and V in every layer"), std::string::npos);
  const CacheFormat lambda = harness::transform_format("scale-k", 2, 64, 1);
  const std::string t = format_text(lambda, d);
  EXPECT_EQ(t.find("plain NVFP4"), std::string::npos) << t;
  EXPECT_NE(t.find("K channel scale: lambda (1, 2, 64) in ["), std::string::npos) << t;
  EXPECT_NE(t.find("K smoothing: none"), std::string::npos) << t;
  EXPECT_NE(t.find("bits per value: 4.5"), std::string::npos) << t;
  const std::string m = format_text(harness::transform_format("smooth-k+rotate-k", 2, 64, 1), d);
  EXPECT_NE(m.find("K smoothing: mu (1, 2, 64)"), std::string::npos) << m;
  EXPECT_EQ(m.find("K channel scale"), std::string::npos) << m;
}

TEST(CacheFormat, RotationBlocks) {
  EXPECT_EQ(rotation_block(kNoRotation, 128), 0);
  EXPECT_EQ(rotation_block(64, 128), 64);
  EXPECT_EQ(rotation_block(kRotateWholeHead, 128), 128);
  EXPECT_EQ(rotation_block(kRotateWholeHead, 256), 256);
  EXPECT_EQ(rotation_block(kRotateWholeHead, 80), 16);
  EXPECT_EQ(rotation_block(kRotateWholeHead, 96), 32);
}

TEST(CacheFormat, JsonRoundTripAndRefusals) {
  CacheFormat f;
  f.layers.resize(3);
  f.layers[0].k = {ElementFormat::kFp8E4M3, ScaleRule::kStandard, kNoRotation};
  f.layers[1].k = {ElementFormat::kNvfp4, ScaleRule::kFourOverSix, 64};
  f.layers[1].v = {ElementFormat::kNvfp4, ScaleRule::kStandard, kRotateWholeHead};
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 7.0f);
  for (int i = 0; i < 3 * 2 * 64; ++i) f.k_mean.push_back(n(rng));
  f.k_mean[7] = 1.0e-30f;  // subnormal-adjacent and odd values survive the text form exactly
  for (int i = 0; i < 3 * 2 * 64; ++i) f.k_channel_scale.push_back(std::exp2(float(i % 11) * 0.37f - 2.0f));
  const std::string text = format_to_json(f);
  EXPECT_NE(text.find("\"nvfp4kv_format\": 1"), std::string::npos);
  const CacheFormat back = parse_format(text);
  EXPECT_EQ(back, f);
  EXPECT_EQ(format_problem(back, dims(3, 2, 64)), "");
  const auto refused = [](const std::string& t, const std::string& what) {
    try {
      parse_format(t);
      ADD_FAILURE() << "accepted: " << t;
    } catch (const LayoutError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(R"({"layers": []})", "\"nvfp4kv_format\"");
  refused(R"({"nvfp4kv_format": 2})", "format.nvfp4kv_format: version 2");
  refused(R"({"nvfp4kv_format": 1, "layer": []})", "unknown key \"layer\"");
  refused(R"({"nvfp4kv_format": 1, "layers": [{"k": {"element": "fp4"}}]})", "format.layers[0].k.element");
  refused(R"({"nvfp4kv_format": 1, "layers": [{"k": {"rotation": -3}}]})", "format.layers[0].k.rotation");
  refused(R"({"nvfp4kv_format": 1, "layers": [{"v": {"rule": "6over4"}}]})", "format.layers[0].v.rule");
  refused(R"({"nvfp4kv_format": 1, "k_mean": [0, 1e39]})", "format.k_mean[1]");
  refused(R"({"nvfp4kv_format": 1, "k_mean": [0, "x"]})", "format.k_mean[1]");
  refused(R"({"nvfp4kv_format": 1, "k_channel_scale": [1, null]})", "format.k_channel_scale[1]: expected a number");
  refused(R"({"nvfp4kv_format": 1, "k_channel_scale": 2})", "format.k_channel_scale: expected an array");
  refused(R"({"nvfp4kv_format": 1, "nvfp4kv_format": 1})", "twice");
}

TEST(CacheFormat, BitsPerValue) {
  CacheFormat f;
  EXPECT_EQ(bits_per_value(f, 30), 4.5);
  LayerFormat k8;
  k8.k.element = ElementFormat::kFp8E4M3;
  LayerFormat both8 = k8;
  both8.v.element = ElementFormat::kFp8E4M3;
  EXPECT_EQ(bits_per_value(k8), 6.25);
  EXPECT_EQ(bits_per_value(both8), 8.0);
  f.layers = {both8};
  EXPECT_EQ(bits_per_value(f, 30), 8.0);
  f.layers.assign(30, LayerFormat{});
  for (int l : {0, 3, 5, 7, 11, 13, 17, 19}) f.layers[size_t(l)] = k8;
  EXPECT_DOUBLE_EQ(bits_per_value(f, 30), (8 * 6.25 + 22 * 4.5) / 30);
  f.k_mean.assign(30 * 3 * 64, 0.0f);  // mu is per layer, not per token: no bits
  f.k_channel_scale.assign(30 * 3 * 64, 1.0f);  // nor lambda
  EXPECT_DOUBLE_EQ(bits_per_value(f, 30), (8 * 6.25 + 22 * 4.5) / 30);
}

// ---- FP8 E4M3 elements ----------------------------------------------------------------
TEST(Fp8Elements, EveryCodeRoundTripsAndTiesGoToEven) {
  for (int s : {0, 1, -3, 5}) {  // per-tensor scales 2^s: the codes must come back exactly
    const float scale = std::ldexp(1.0f, s), inv = 1.0f / scale;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) == 0x7F) continue;  // NaN codes
      const float x = fp8_decode_element(uint8_t(c), scale);
      ASSERT_EQ(fp8_encode_element(x, inv), uint8_t(c)) << "code " << c << " scale 2^" << s;
    }
  }
  // Midpoints between neighbouring positive codes go to the even code; just above, up.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_decode_bits(uint8_t(c)), hi = e4m3_decode_bits(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;  // exact: one more bit than E4M3 has
    ASSERT_EQ(fp8_encode_element(mid, 1.0f), uint8_t((c % 2 == 0) ? c : c + 1)) << c;
    ASSERT_EQ(fp8_encode_element(std::nextafter(mid, 1e9f), 1.0f), uint8_t(c + 1)) << c;
    ASSERT_EQ(fp8_encode_element(-std::nextafter(mid, 0.0f), 1.0f), uint8_t(0x80 | c)) << c;
  }
  // Saturation at +-448 (satfinite), non-finite inputs stored as +0.
  EXPECT_EQ(fp8_encode_element(464.0f, 1.0f), 0x7E);
  EXPECT_EQ(fp8_encode_element(-1.0e30f, 1.0f), 0xFE);
  EXPECT_EQ(e4m3_decode_bits(fp8_encode_element(1000.0f, 0.25f)), 256.0f);
  EXPECT_EQ(fp8_encode_element(std::numeric_limits<float>::infinity(), 1.0f), 0);
  EXPECT_EQ(fp8_encode_element(std::numeric_limits<float>::quiet_NaN(), 1.0f), 0);
}

TEST(Fp8Elements, DenseTensorPerTensorScale) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 30.0f);
  const reference::DenseShape shape{5, 2, 32};
  std::vector<float> x(static_cast<size_t>(shape.elements()));
  for (float& v : x) v = n(rng);
  x[9] = std::numeric_limits<float>::quiet_NaN();
  x[40] = 1.0e6f;  // saturates
  float amax = 0;
  for (float v : x)
    if (std::isfinite(v) && v < 1e5f) amax = std::max(amax, std::fabs(v));
  const float scale = amax / 448.0f;
  const auto q = reference::quantize_fp8(x.data(), ElementType::kFloat32, shape, scale);
  EXPECT_EQ(q.non_finite, 1);
  const auto back = reference::dequantize_fp8(q, scale);
  EXPECT_EQ(back[9], 0.0f);
  EXPECT_EQ(back[40], 448.0f * scale);
  // Each code is the nearest E4M3 value of x / scale: no other code is closer.
  for (size_t i = 0; i < x.size(); ++i) {
    if (i == 9 || i == 40) continue;
    const float y = x[i] * (1.0f / scale);
    const double got = std::fabs(double(e4m3_decode_bits(q.codes[i])) - y);
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) != 0x7F) {
        ASSERT_LE(got, std::fabs(double(e4m3_decode_bits(uint8_t(c))) - y)) << i;
      }
    }
  }
  EXPECT_THROW(reference::quantize_fp8(x.data(), ElementType::kFloat32, shape, 0.0f), ArgumentError);
}

// ---- rotation ---------------------------------------------------------------------------
// Sylvester's Hadamard entry (i, j): (-1)^popcount(i & j).
double hadamard_entry(int64_t i, int64_t j, int64_t n) {
  return (__builtin_popcountll(uint64_t(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(double(n));
}

TEST(Rotation, MatchesTheMatrixAndIsItsOwnInverse) {
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t size : {16, 32, 64, 128, 256}) {
    std::vector<float> x(static_cast<size_t>(size));
    for (float& v : x) v = n(rng);
    std::vector<float> y = x;
    hadamard_rotate(y.data(), size);
    std::vector<double> z(x.begin(), x.end());
    reference::hadamard_f64(z.data(), size);
    for (int64_t i = 0; i < size; ++i) {
      double want = 0;
      for (int64_t j = 0; j < size; ++j) want += hadamard_entry(i, j, size) * x[size_t(j)];
      ASSERT_NEAR(y[size_t(i)], want, 1e-5) << size;
      ASSERT_NEAR(z[size_t(i)], want, 1e-12) << size;
    }
    reference::hadamard_f64(z.data(), size);
    for (int64_t i = 0; i < size; ++i) ASSERT_NEAR(z[size_t(i)], x[size_t(i)], 1e-12);
    EXPECT_EQ(hadamard_scale(size), float(1.0 / std::sqrt(double(size))));
  }
}

// ---- the paged reference with a format --------------------------------------------------
struct Fixture {
  static constexpr int64_t kTokens = 40, kHeads = 2, kDim = 64, kLayers = 2;
  ValidLayout plain = validate(instantiate(preset_spec("nvfp4kv-native"), {kLayers, 4, 16, kHeads, kDim}));
  std::vector<float> k, v, mu, lambda;
  Fixture() {
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 1.0f);
    mu.resize(size_t(kLayers * kHeads * kDim));
    for (float& m : mu) m = 4.0f * n(rng);  // a large constant part, as real K has
    // lambda: larger on the outlier channels (as calibration chooses it), 2^+-1 elsewhere.
    lambda.resize(mu.size());
    for (size_t i = 0; i < lambda.size(); ++i) {
      const int64_t e = int64_t(i) % kDim;
      lambda[i] = (e == 3 || e == 40) ? 3.5f : std::exp2(float(int64_t(i) % 5) * 0.5f - 1.0f);
    }
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t e = 0; e < kDim; ++e) {
          // Outlier channels (3 and 40) that a rotation spreads out.
          const float outlier = (e == 3 || e == 40) ? 12.0f : 1.0f;
          k.push_back(mu[size_t((1 * kHeads + h) * kDim + e)] + outlier * n(rng));
          v.push_back(outlier * n(rng));
        }
  }
  CacheFormat transformed() const {
    CacheFormat f;
    f.layers = {LayerFormat{}};
    f.layers[0].k = {ElementFormat::kNvfp4, ScaleRule::kFourOverSix, 32};
    f.layers[0].v = {ElementFormat::kNvfp4, ScaleRule::kStandard, kRotateWholeHead};
    f.k_mean = mu;
    f.k_channel_scale = lambda;
    return f;
  }
};

void store_layer(const ValidLayout& layout, const reference::HostCache& cache, const Fixture& x, int64_t layer,
                 float gs) {
  std::vector<int64_t> slots(size_t(Fixture::kTokens));
  for (int64_t i = 0; i < Fixture::kTokens; ++i) slots[size_t(i)] = i;
  reference::store(layout, cache.buffers,
                   {.rows = {x.k.data(), x.v.data(), Fixture::kTokens, Fixture::kHeads * Fixture::kDim},
                    .type = ElementType::kFloat32, .slots = slots.data(), .slots_are_int64 = true, .layer = layer,
                    .k_global_scale = &gs, .v_global_scale = &gs});
}

// Layer 1 of the fixture stored with its transformed format.
class StoredFormat : public ::testing::Test {
 protected:
  Fixture x;
  ValidLayout layout = with_format(x.plain, x.transformed());
  reference::HostCache cache{layout.layout(), 0xA5};
  float gs = recommend_global_scale(64.0f);
  StoredFormat() { store_layer(layout, cache, x, 1, gs); }
};

double rel_l2(const std::vector<float>& want, const std::vector<float>& got) {
  return reference::error_stats(want, got).rel_l2;
}

TEST_F(StoredFormat, StoreFollowsTheFormatBitForBit) {
  // The stored bytes are the block rule on H((k - mu) / lambda) in float32, the format's rule per side.
  const CacheDims& d = layout.layout().dims;
  for (int64_t t = 0; t < Fixture::kTokens; ++t)
    for (Side side : {Side::kK, Side::kV})
      for (int64_t h = 0; h < d.heads; ++h) {
        const std::vector<float>& src = side == Side::kK ? x.k : x.v;
        std::vector<float> row(src.begin() + (t * d.heads + h) * d.head_dim,
                               src.begin() + (t * d.heads + h + 1) * d.head_dim);
        const TensorFormat tf = layout.format().layer(1).side(side);
        if (side == Side::kK)
          for (int64_t e = 0; e < d.head_dim; ++e) {
            row[size_t(e)] -= x.mu[size_t((1 * d.heads + h) * d.head_dim + e)];
            row[size_t(e)] /= x.lambda[size_t((1 * d.heads + h) * d.head_dim + e)];
          }
        const int64_t n = rotation_block(tf.rotation, d.head_dim);
        for (int64_t b = 0; b < d.head_dim; b += n) hadamard_rotate(row.data() + b, n);
        const SideRegions reg = side_regions(side);
        for (int64_t g = 0; g < d.scale_bytes(); ++g) {
          const QuantizedBlock q = quantize_block(row.data() + g * 16, gs, tf.rule);
          const Coord c{1, t / 16, t % 16, h, g};
          ASSERT_EQ(*element_address(layout.layout(), cache.buffers, reg.scale, c), q.scale);
          for (int j = 0; j < 8; ++j)
            ASSERT_EQ(*element_address(layout.layout(), cache.buffers, reg.data, Coord{1, t / 16, t % 16, h, g * 8 + j}),
                      layout.layout().codes.encode(q.packed[j]));  // the layout's code order (native: fp16-split)
        }
      }
  // The call may repeat the format's rules, not contradict them.
  std::vector<int64_t> slots{0};
  StoreArgs bad{.rows = {x.k.data(), x.v.data(), 1, Fixture::kHeads * Fixture::kDim}, .type = ElementType::kFloat32,
                .slots = slots.data(), .slots_are_int64 = true, .layer = 1, .k_global_scale = &gs,
                .v_global_scale = &gs, .rule = ScaleRule::kFourOverSix};
  try {
    reference::store(layout, cache.buffers, bad);
    ADD_FAILURE() << "a rule contradicting the format was accepted";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("stores V of layer 1 with standard"), std::string::npos) << e.what();
  }
}

TEST_F(StoredFormat, GatherUndoesTheTransformsAndASkippingReaderFails) {
  const std::vector<int32_t> pages{0, 1, 2};
  const auto right = reference::gather_sequence(layout, cache.buffers, pages, Fixture::kTokens, 1, gs, gs);
  // NVFP4's error on these values: about 0.1 of the norm (the error of K is relative to k - mu
  // (smaller than k) so the original K comes back closer).
  EXPECT_LT(rel_l2(x.k, right.k), 0.05);
  EXPECT_LT(rel_l2(x.v, right.v), 0.15);
  // A reader that ignores the format (the same bytes through the plain layout) is far off:
  const auto skipping = reference::gather_sequence(x.plain, cache.buffers, pages, Fixture::kTokens, 1, gs, gs);
  EXPECT_GT(rel_l2(x.k, skipping.k), 0.5);
  EXPECT_GT(rel_l2(x.v, skipping.v), 0.5);
  // ... and so is one that undoes the rotation but forgets mu.
  CacheFormat no_mu = x.transformed();
  no_mu.k_mean.clear();
  const auto forgets_mu =
      reference::gather_sequence(with_format(x.plain, no_mu), cache.buffers, pages, Fixture::kTokens, 1, gs, gs);
  EXPECT_GT(rel_l2(x.k, forgets_mu.k), 0.5);
  EXPECT_LT(rel_l2(x.v, forgets_mu.v), 0.15);
  // ... and one that forgets lambda.
  CacheFormat no_lambda = x.transformed();
  no_lambda.k_channel_scale.clear();
  const auto forgets_lambda =
      reference::gather_sequence(with_format(x.plain, no_lambda), cache.buffers, pages, Fixture::kTokens, 1, gs, gs);
  EXPECT_GT(rel_l2(x.k, forgets_lambda.k), 0.1);
  EXPECT_EQ(forgets_lambda.v, right.v);
  // stored_values: exactly what the plain reader decodes.
  std::vector<float> k(right.k.size()), v(right.v.size());
  const int32_t cu[2] = {0, int32_t(Fixture::kTokens)};
  GatherArgs a{.batch = {.block_table = pages.data(), .block_table_stride = 3, .cu_seqlens = cu, .batch = 1},
               .layer = 1, .k_global_scale = &gs, .v_global_scale = &gs, .out_type = ElementType::kFloat32,
               .k_out = k.data(), .v_out = v.data()};
  a.stored_values = true;
  reference::gather(layout, cache.buffers, a);
  EXPECT_EQ(k, skipping.k);
  EXPECT_EQ(v, skipping.v);
}

// lambda alone (a format without per-layer entries: no rotation, no mu): the stored K is the
// block rule on k / lambda in float32, gather multiplies back, attention equals attention over
// what gather restores; a reader without lambda is off.
TEST(StoredFormatLambda, AloneIsStoredReadAndAttendedOver) {
  Fixture x;
  CacheFormat f;
  f.k_channel_scale = x.lambda;
  const ValidLayout layout = with_format(x.plain, f);
  reference::HostCache cache(layout.layout(), 0xA5);
  const float gs = recommend_global_scale(64.0f);
  store_layer(layout, cache, x, 1, gs);
  const CacheDims& d = layout.layout().dims;
  const SideRegions reg = side_regions(Side::kK);
  for (int64_t t = 0; t < Fixture::kTokens; ++t)
    for (int64_t h = 0; h < d.heads; ++h) {
      std::vector<float> row(x.k.begin() + (t * d.heads + h) * d.head_dim, x.k.begin() + (t * d.heads + h + 1) * d.head_dim);
      for (int64_t e = 0; e < d.head_dim; ++e) row[size_t(e)] /= x.lambda[size_t((1 * d.heads + h) * d.head_dim + e)];
      for (int64_t g = 0; g < d.scale_bytes(); ++g) {
        const QuantizedBlock q = quantize_block(row.data() + g * 16, gs, ScaleRule::kStandard);
        ASSERT_EQ(*element_address(layout.layout(), cache.buffers, reg.scale, Coord{1, t / 16, t % 16, h, g}), q.scale);
        for (int j = 0; j < 8; ++j)
          ASSERT_EQ(*element_address(layout.layout(), cache.buffers, reg.data, Coord{1, t / 16, t % 16, h, g * 8 + j}),
                    layout.layout().codes.encode(q.packed[j]));
      }
    }
  const std::vector<int32_t> pages{0, 1, 2};
  const auto right = reference::gather_sequence(layout, cache.buffers, pages, Fixture::kTokens, 1, gs, gs);
  const auto skipping = reference::gather_sequence(x.plain, cache.buffers, pages, Fixture::kTokens, 1, gs, gs);
  EXPECT_LT(rel_l2(x.k, right.k), 0.15);
  EXPECT_GT(rel_l2(x.k, skipping.k), 0.1);
  EXPECT_EQ(right.v, skipping.v);  // V untouched
  const int64_t q_heads = 4, dim = d.head_dim;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> q(size_t(q_heads * dim));
  for (float& e : q) e = n(rng);
  const std::vector<double> qd(q.begin(), q.end()), kd(right.k.begin(), right.k.end()), vd(right.v.begin(), right.v.end());
  std::vector<double> want(static_cast<size_t>(q_heads * dim)), lse(static_cast<size_t>(q_heads));
  reference::attend(qd.data(), q_heads, kd.data(), vd.data(), Fixture::kTokens, d.heads, dim, {.softmax_scale = 0.125},
                    want.data(), lse.data());
  const int32_t len = int32_t(Fixture::kTokens);
  const DecodeArgs a{.q = q.data(), .q_type = ElementType::kFloat32, .q_heads = q_heads,
                     .batch = {.block_table = pages.data(), .block_table_stride = 3, .seq_lens = &len, .batch = 1},
                     .layer = 1, .softmax_scale = 0.125f, .k_global_scale = &gs, .v_global_scale = &gs};
  const auto diff = [&](const ValidLayout& reader) {
    const auto got = reference::decode_attention(reader, cache.buffers, a);
    double m = 0;
    for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(got.out[i] - want[i]));
    for (size_t i = 0; i < lse.size(); ++i) m = std::max(m, std::fabs(got.lse[i] - lse[i]));
    return m;
  };
  EXPECT_LT(diff(layout), 2e-6);  // gather's float32 rounding of the restored K
  EXPECT_GT(diff(x.plain), 1e-2);
}

// Attention over the transformed cache equals, in float64, attention over the original-domain
// dequantized K/V (un-rotated by the Hadamard matrix written out here, times lambda, mu added), with and
// without soft-capping and sinks; readers that skip a transform do not.
TEST_F(StoredFormat, DecodeEqualsAttentionOverTheRestoredValues) {
  const CacheFormat& format = layout.format();
  const CacheDims& d = layout.layout().dims;
  const int64_t q_heads = 4, dim = d.head_dim;
  // Stored values (plain decode), taken to the original basis with the explicit matrices.
  const std::vector<int32_t> pages{0, 1, 2};
  const auto stored = reference::gather_sequence(x.plain, cache.buffers, pages, Fixture::kTokens, 1, gs, gs);
  std::vector<double> k(stored.k.size()), v(stored.v.size());
  for (int64_t t = 0; t < Fixture::kTokens; ++t)
    for (int64_t h = 0; h < d.heads; ++h)
      for (Side side : {Side::kK, Side::kV}) {
        const int64_t n = rotation_block(format.layer(1).side(side).rotation, dim);
        const std::vector<float>& src = side == Side::kK ? stored.k : stored.v;
        std::vector<double>& dst = side == Side::kK ? k : v;
        const int64_t row = (t * d.heads + h) * dim;
        for (int64_t i = 0; i < dim; ++i) {
          double s = 0;
          const int64_t b = i / n * n;
          for (int64_t j = b; j < b + n; ++j) s += hadamard_entry(i - b, j - b, n) * double(src[size_t(row + j)]);
          if (side == Side::kK)
            s = s * double(x.lambda[size_t((1 * d.heads + h) * dim + i)]) + double(x.mu[size_t((1 * d.heads + h) * dim + i)]);
          dst[size_t(row + i)] = s;
        }
      }
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> q(size_t(q_heads * dim));
  for (float& e : q) e = n(rng);
  std::vector<double> qd(q.begin(), q.end());
  const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
  const int32_t len = int32_t(Fixture::kTokens);
  for (auto [softcap, with_sinks] : {std::pair{0.0f, false}, {20.0f, false}, {0.0f, true}, {5.0f, true}}) {
    DecodeArgs a{.q = q.data(), .q_type = ElementType::kFloat32, .q_heads = q_heads,
                 .batch = {.block_table = pages.data(), .block_table_stride = 3, .seq_lens = &len, .batch = 1},
                 .layer = 1, .softmax_scale = 0.125f, .k_global_scale = &gs, .v_global_scale = &gs,
                 .softcap = softcap, .sinks = with_sinks ? sinks : nullptr};
    std::vector<double> want(static_cast<size_t>(q_heads * dim)), want_lse(static_cast<size_t>(q_heads));
    reference::attend(qd.data(), q_heads, k.data(), v.data(), Fixture::kTokens, d.heads, dim,
                      {.softmax_scale = 0.125, .softcap = softcap, .sinks = a.sinks}, want.data(), want_lse.data());
    const auto max_diff = [&](const ValidLayout& reader) {
      const auto got = reference::decode_attention(reader, cache.buffers, a);
      double m = 0;
      for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(got.out[i] - want[i]));
      for (size_t i = 0; i < want_lse.size(); ++i) m = std::max(m, std::fabs(got.lse[i] - want_lse[i]));
      return m;
    };
    EXPECT_LT(max_diff(layout), 1e-12) << "softcap " << softcap << " sinks " << with_sinks;
    EXPECT_GT(max_diff(x.plain), 1e-2) << "a reader that skips every transform";
    CacheFormat no_mu = format, no_rotation = format, no_lambda = format;
    no_mu.k_mean.clear();
    no_lambda.k_channel_scale.clear();
    EXPECT_GT(max_diff(with_format(x.plain, no_lambda)), 1e-2) << "a reader that skips lambda";
    no_rotation.layers[0].k.rotation = no_rotation.layers[0].v.rotation = kNoRotation;
    EXPECT_GT(max_diff(with_format(x.plain, no_mu)), 1e-2) << "a reader that skips mu";
    EXPECT_GT(max_diff(with_format(x.plain, no_rotation)), 1e-2) << "a reader that skips the rotation";
  }
}

// Prefill reads the same format: each of the last three positions, as new tokens of one
// call, equals decode (shown above to equal attention over the restored values) on the
// sequence cut after that position; a reader that skips the transforms does not.
TEST_F(StoredFormat, PrefillRowsEqualDecodeAtTheirPositions) {
  const CacheDims& d = layout.layout().dims;
  const int64_t q_heads = 4, dim = d.head_dim, q_len = 3;
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> q(size_t(q_len * q_heads * dim));
  for (float& e : q) e = n(rng);
  const std::vector<int32_t> pages{0, 1, 2};
  const int32_t len = int32_t(Fixture::kTokens), cu[2] = {0, int32_t(q_len)};
  const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
  PrefillArgs a{.q = q.data(), .q_type = ElementType::kFloat32, .q_heads = q_heads, .cu_seqlens_q = cu,
                .max_q_len = q_len,
                .batch = {.block_table = pages.data(), .block_table_stride = 3, .seq_lens = &len, .batch = 1},
                .layer = 1, .softmax_scale = 0.125f, .k_global_scale = &gs, .v_global_scale = &gs, .softcap = 5.0f,
                .sinks = sinks};
  const auto max_diff = [&](const ValidLayout& reader) {
    const auto got = reference::prefill_attention(reader, cache.buffers, a);
    double m = 0;
    for (int64_t i = 0; i < q_len; ++i) {
      const int32_t cut = int32_t(Fixture::kTokens - q_len + i + 1);
      DecodeArgs one = decode_args_of(a);
      one.q = q.data() + i * q_heads * dim;
      one.batch.seq_lens = &cut;
      const auto want = reference::decode_attention(layout, cache.buffers, one);
      for (int64_t j = 0; j < q_heads * dim; ++j)
        m = std::max(m, std::fabs(got.out[size_t(i * q_heads * dim + j)] - want.out[size_t(j)]));
      for (int64_t h = 0; h < q_heads; ++h) m = std::max(m, std::fabs(got.lse[size_t(i * q_heads + h)] - want.lse[size_t(h)]));
    }
    return m;
  };
  EXPECT_LT(max_diff(layout), 1e-12);
  EXPECT_GT(max_diff(x.plain), 1e-2) << "a prefill reader that skips every transform";
}

}  // namespace
}  // namespace nvfp4kv
