// Calibration (core/calibration.hpp, reference/calibrate.hpp): the policy spends at most the
// budget and starts with the layers of largest error, the file round-trips and refuses what does
// not fit, and the measurement finds what the samples were built to show.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "nvfp4kv/core/calibration.hpp"
#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/reference/calibrate.hpp"

namespace nvfp4kv {
namespace {

// Layer l's best error is errors_of[l]; mode 5 (4over6 + smoothing) is best everywhere.
Calibration made_up(const std::vector<double>& errors_of) {
  Calibration c;
  c.layers = int64_t(errors_of.size());
  c.heads = 2;
  c.head_dim = 32;
  c.samples = 100;
  for (double e : errors_of) {
    LayerCalibration l;
    l.errors.assign(kCalibrationModes, 2 * e);
    l.errors[5] = e;
    l.best_mode = 5;
    l.k_amax = 3, l.v_amax = 2, l.k_global_scale = 0.015625f, l.v_global_scale = 0.03125f;
    c.per_layer.push_back(l);
  }
  for (int64_t i = 0; i < c.layers * c.heads * c.head_dim; ++i) c.k_mean.push_back(0.25f * float(i % 7));
  return c;
}

// parse_calibration refuses `text` with `from` replaced by `to`, saying `what`.
void expect_refused(std::string text, const std::string& from, const std::string& to, const std::string& what) {
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  try {
    parse_calibration(text);
    ADD_FAILURE() << "accepted with " << to;
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Calibration, PolicyStaysWithinTheBudgetMostSensitiveFirst) {
  const Calibration c = made_up({0.1, 0.5, 0.2, 0.9, 0.05, 0.3, 0.4, 0.15});
  for (double bits : {4.5, 4.9, 5.0, 5.5, 6.25, 7.0, 8.0}) {
    const CacheFormat f = recommend_policy(c, bits);
    EXPECT_LE(bits_per_value(f, c.layers), bits + 1e-12) << bits;
    EXPECT_GT(bits_per_value(f, c.layers) + 1.75 / double(c.layers), bits) << "one more FP8 tensor would fit: " << bits;
    ASSERT_EQ(f.layers.size(), 8u);
    for (const LayerFormat& l : f.layers)
      if (l.k.element == ElementFormat::kNvfp4) {
        EXPECT_EQ(l.k.rule, ScaleRule::kFourOverSix);
        EXPECT_EQ(l.k.rotation, kNoRotation);
      }
    EXPECT_EQ(f.k_mean, c.k_mean);  // every layer smooths: mu as measured
  }
  // 5 bits over 8 layers: two K tensors in FP8, the layers of errors 0.9 and 0.5.
  const CacheFormat f = recommend_policy(c, 5.0);
  for (int l = 0; l < 8; ++l)
    EXPECT_EQ(f.layers[size_t(l)].k.element == ElementFormat::kFp8E4M3, l == 3 || l == 1) << l;
  // Past 6.25 every K is FP8 and V follows in the same order.
  const CacheFormat g = recommend_policy(c, 6.5);
  for (int l = 0; l < 8; ++l) EXPECT_EQ(g.layers[size_t(l)].v.element == ElementFormat::kFp8E4M3, l == 3) << l;
  EXPECT_THROW(recommend_policy(c, 4.4), ArgumentError);
  EXPECT_THROW(recommend_policy(c, 8.5), ArgumentError);
}

TEST(Calibration, FileRoundTripsAndRefusesWhatDoesNotFit) {
  Calibration c = made_up({0.1, 0.5, 0.2});
  c.per_layer[1].best_mode = 2;  // rotation only: mu zero there
  c.bits_budget = 5;
  c.format = recommend_policy(c, 5);
  const std::string text = calibration_to_json(c);
  const Calibration back = parse_calibration(text);
  EXPECT_EQ(calibration_to_json(back), text);
  EXPECT_EQ(back.format, c.format);
  EXPECT_EQ(back.per_layer[1].best_mode, 2);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(back.format.k_mean[size_t(64 + i)], 0.0f);
  EXPECT_EQ(calibration_mismatch(back, 3, 2, 32), "");
  EXPECT_EQ(calibration_mismatch(back, 30, 2, 32), "the calibration is for 3 layers, the cache has 30");
  EXPECT_EQ(calibration_mismatch(back, 3, 1, 32), "the calibration is for 2 kv heads, the cache has 1");
  EXPECT_EQ(calibration_mismatch(back, 3, 2, 64), "the calibration is for 32 head dim, the cache has 64");
  const auto refused = [&](const std::string& from, const std::string& to, const std::string& what) {
    expect_refused(text, from, to, what);
  };
  refused("\"nvfp4kv_calibration\": 2", "\"nvfp4kv_calibration\": 3", "calibration.nvfp4kv_calibration: version 3");
  refused("\"layers\": 3", "\"layers\": 4", "calibration.per_layer: expected an array of 4 layers, got 3 entries");
  refused("\"kv_heads\": 2", "\"kv_heads\": 1", "calibration.k_mean: expected (layers 3, kv heads 1, D 32) values, got 192");
  refused("\"best_mode\": \"rotation\"", "\"best_mode\": \"spin\"", "calibration.per_layer[1].best_mode");
  refused("\"samples\": 100", "\"samples\": 100, \"extra\": 1", "unknown key \"extra\"");
  refused("\"k_global_scale\": 0.015625", "\"k_global_scale\": 0", "calibration.per_layer[0].k_global_scale");
  // A format with lambda: the calibration's global scales were not measured for it.
  Calibration scaled = c;
  scaled.format.k_channel_scale.assign(size_t(3 * 2 * 32), 0.5f);
  try {
    parse_calibration(calibration_to_json(scaled));
    ADD_FAILURE() << "a calibration whose format holds lambda was read";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("calibration.format.k_channel_scale: a calibration does not choose"),
              std::string::npos) << e.what();
  }
}

TEST(Calibration, ModelKlRanksTheLayersAndIsVersioned) {
  // Attention errors rank layer 1 first (0.5); K's model KL ranks 2, 0, 1 and V's 1, 2, 0.
  Calibration c = made_up({0.1, 0.5, 0.2});
  const std::vector<double> k_kl{0.03, 0.001, 0.08}, v_kl{0.002, 0.02, 0.01};
  for (int64_t l = 0; l < 3; ++l) c.per_layer[size_t(l)].k_model_kl = k_kl[size_t(l)];
  for (int64_t l = 0; l < 3; ++l) c.per_layer[size_t(l)].v_model_kl = v_kl[size_t(l)];
  const auto fp8 = [](const CacheFormat& f, Side side) {
    std::vector<int> on;
    for (int64_t l = 0; l < int64_t(f.layers.size()); ++l)
      if (f.layers[size_t(l)].side(side).element == ElementFormat::kFp8E4M3) on.push_back(int(l));
    return on;
  };
  EXPECT_EQ(fp8(recommend_policy(c, 4.5 + 1.75 / 3), Side::kK), std::vector<int>{2});
  EXPECT_EQ(fp8(recommend_policy(c, 4.5 + 2 * 1.75 / 3), Side::kK), (std::vector<int>{0, 2}));
  const CacheFormat all_k_two_v = recommend_policy(c, 4.5 + 5 * 1.75 / 3);
  EXPECT_EQ(fp8(all_k_two_v, Side::kK), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(fp8(all_k_two_v, Side::kV), (std::vector<int>{1, 2}));
  Calibration without = made_up({0.1, 0.5, 0.2});  // no model KL: the attention error decides
  EXPECT_EQ(fp8(recommend_policy(without, 4.5 + 1.75 / 3), Side::kK), std::vector<int>{1});
  without.per_layer[0].k_model_kl = without.per_layer[0].v_model_kl = 0.5;  // on one layer only
  EXPECT_THROW(recommend_policy(without, 5.0), ArgumentError);
  Calibration k_only = c;
  for (LayerCalibration& l : k_only.per_layer) l.v_model_kl.reset();  // one side only
  EXPECT_THROW(recommend_policy(k_only, 5.0), ArgumentError);

  // Written as version 2 with both; read back; a version-1 file (no model KL) still reads.
  c.bits_budget = 5;
  c.format = recommend_policy(c, 5);
  const std::string text = calibration_to_json(c);
  ASSERT_NE(text.find("\"nvfp4kv_calibration\": 2"), std::string::npos);
  const Calibration back = parse_calibration(text);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(back.per_layer[size_t(l)].k_model_kl, k_kl[size_t(l)]) << l;
    EXPECT_EQ(back.per_layer[size_t(l)].v_model_kl, v_kl[size_t(l)]) << l;
  }
  EXPECT_EQ(calibration_to_json(back), text);
  Calibration old = made_up({0.1, 0.5, 0.2});
  old.format = recommend_policy(old, 4.5);
  std::string v1 = calibration_to_json(old);
  for (const char* key : {"\"k_model_kl\": null,", "\"v_model_kl\": null"})  // v_: the last key, after a comma
    for (size_t at; (at = v1.find(key)) != std::string::npos;) v1.erase(at, std::string(key).size());
  for (size_t at; (at = v1.find("\"v_global_scale\": 0.03125,")) != std::string::npos;)
    v1.replace(at, 26, "\"v_global_scale\": 0.03125 ");
  v1.replace(v1.find("\"nvfp4kv_calibration\": 2"), 24, "\"nvfp4kv_calibration\": 1");
  ASSERT_EQ(v1.find("model_kl"), std::string::npos) << v1.substr(0, 400);
  const Calibration from_v1 = parse_calibration(v1);
  EXPECT_FALSE(from_v1.per_layer[0].k_model_kl.has_value());
  EXPECT_EQ(from_v1.format, old.format);
  const auto refused = expect_refused;
  refused(text, "\"v_model_kl\": 0.02", "\"v_model_kl\": null", "per_layer[1]: k_model_kl and v_model_kl measured on some");
  refused(text, "\"k_model_kl\": 0.03", "\"k_model_kl\": -0.03", "per_layer[0].k_model_kl: a KL divergence is >= 0");
  refused(text, "\"nvfp4kv_calibration\": 2", "\"nvfp4kv_calibration\": 1", "unknown key \"k_model_kl\"");
  refused(v1, "\"nvfp4kv_calibration\": 1", "\"nvfp4kv_calibration\": 2", "per_layer[0]: \"k_model_kl\" is required");
  refused(v1, "\"nvfp4kv_calibration\": 1", "\"nvfp4kv_calibration\": 0", "version 0 is not one this build reads");
}

// Samples where layer 1 has an outlier channel (rotation spreads it) and layer 2 a large
// constant part in K (smoothing removes it); layer 0 is plain Gaussian.
reference::CalibrationSamples made_samples() {
  reference::CalibrationSamples s;
  s.layers = 3, s.tokens = 256, s.heads = 2, s.head_dim = 64;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t l = 0; l < s.layers; ++l)
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t e = 0; e < s.head_dim; ++e) {
          float k = n(rng);
          if (l == 1 && e == 5) k *= 40.0f;
          if (l == 2) k += 6.0f * float((e * 37 + h * 11) % 9) - 24.0f;
          s.k.push_back(k);
          s.v.push_back(n(rng));
        }
  return s;
}

TEST(Calibration, MeasurementFindsWhatTheSamplesShow) {
  const reference::CalibrationSamples s = made_samples();
  const Calibration c = reference::calibrate(s, 4.5 + 1.75 / 3);
  ASSERT_EQ(c.per_layer.size(), 3u);
  // The K mean is the samples' own mean.
  double mean = 0;
  for (int64_t t = 0; t < s.tokens; ++t) mean += s.k[size_t(((2 * s.tokens + t) * s.heads + 1) * s.head_dim + 9)];
  EXPECT_NEAR(c.k_mean[size_t((2 * s.heads + 1) * s.head_dim + 9)], mean / double(s.tokens), 1e-4);
  EXPECT_TRUE(c.per_layer[1].best_mode & 2) << mode_name(c.per_layer[1].best_mode);  // rotation helps the outlier
  EXPECT_TRUE(c.per_layer[2].best_mode & 4) << mode_name(c.per_layer[2].best_mode);  // smoothing helps the offset
  for (const LayerCalibration& l : c.per_layer) EXPECT_LE(l.errors[size_t(l.best_mode)], l.sensitivity());
  // The budget buys one FP8 K: the layer of largest error after its best mode.
  int fp8 = 0;
  for (int64_t l = 0; l < 3; ++l) fp8 += c.format.layer(l).k.element == ElementFormat::kFp8E4M3;
  EXPECT_EQ(fp8, 1);
  int64_t worst = 0;
  for (int64_t l = 1; l < 3; ++l)
    if (c.per_layer[size_t(l)].errors[size_t(c.per_layer[size_t(l)].best_mode)] >
        c.per_layer[size_t(worst)].errors[size_t(c.per_layer[size_t(worst)].best_mode)])
      worst = l;
  EXPECT_EQ(c.format.layer(worst).k.element, ElementFormat::kFp8E4M3);
  EXPECT_EQ(format_problem(c.format, {3, 1, 1, 2, 64}), "");
  EXPECT_NEAR(c.per_layer[size_t(worst)].k_global_scale * 448.0f, c.per_layer[size_t(worst)].k_amax, 
              c.per_layer[size_t(worst)].k_amax);  // FP8's per-tensor scale: amax (after mu) / 448
}

TEST(Calibration, SamplesAreCheckedByName) {
  std::map<std::string, reference::SampleArray> a;
  const auto arr = [](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    return reference::SampleArray{shape, std::vector<float>(size_t(n), 1.0f)};
  };
  a["k_0"] = arr({32, 2, 64});
  a["v_0"] = arr({32, 2, 64});
  a["k_1"] = arr({32, 2, 64});
  const auto refused = [&](const std::string& what) {
    try {
      reference::samples_from_arrays(a, "samples.npz");
      ADD_FAILURE() << "accepted";
    } catch (const ArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused("samples.npz: missing v_1");
  a["v_1"] = arr({32, 2, 48});
  refused("v_1 has shape (32, 2, 48), k_0 has (32, 2, 64)");
  a["v_1"] = arr({32, 2, 64});
  a["k_3"] = arr({32, 2, 64});
  refused("unexpected array \"k_3\"");
  a.erase("k_3");
  a["q_0"] = arr({32, 3, 64});
  refused("missing q_1");
  a["q_1"] = arr({32, 3, 64});
  refused("q heads must be a positive multiple of the 2 kv heads, got 3");
  a["q_0"] = a["q_1"] = arr({32, 4, 64});
  const reference::CalibrationSamples s = reference::samples_from_arrays(a, "samples.npz");
  EXPECT_EQ(s.layers, 2);
  EXPECT_EQ(s.q_heads, 4);
  a["k_0"].values[3] = std::nanf("");
  refused("K samples hold a non-finite value");
}

TEST(Calibration, MeasurementTakesTheModelKl) {
  const reference::CalibrationSamples s = made_samples();
  const Calibration plain = reference::calibrate(s, 4.5 + 1.75 / 3);
  // The layer the attention error would not pick gets the FP8 K when K's model KL says so.
  int64_t by_error = 0;
  for (int64_t l = 0; l < 3; ++l)
    if (plain.format.layer(l).k.element == ElementFormat::kFp8E4M3) by_error = l;
  reference::ModelKl kl{{0.01, 0.01, 0.01}, {0.5, 0.5, 0.5}};
  const int64_t other = (by_error + 1) % 3;
  kl.k[size_t(other)] = 0.2;
  const Calibration c = reference::calibrate(s, 4.5 + 1.75 / 3, {}, kl);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(c.format.layer(l).k.element == ElementFormat::kFp8E4M3, l == other) << l;
    EXPECT_EQ(c.format.layer(l).v.element, ElementFormat::kNvfp4) << l;  // K first, whatever V's KL
    EXPECT_EQ(c.per_layer[size_t(l)].k_model_kl, kl.k[size_t(l)]);
    EXPECT_EQ(c.per_layer[size_t(l)].v_model_kl, kl.v[size_t(l)]);
    EXPECT_EQ(c.per_layer[size_t(l)].errors, plain.per_layer[size_t(l)].errors);  // measured as before
    EXPECT_FALSE(plain.per_layer[size_t(l)].k_model_kl.has_value());
  }
  EXPECT_THROW(reference::calibrate(s, 5.0, {}, {{0.1, 0.2}, {0.1, 0.2, 0.3}}), ArgumentError);
  EXPECT_THROW(reference::calibrate(s, 5.0, {}, {{0.1, 0.2, 0.3}, {}}), ArgumentError);
  EXPECT_THROW(reference::calibrate(s, 5.0, {}, {{0.1, -0.2, 0.3}, {0.1, 0.2, 0.3}}), ArgumentError);
  EXPECT_THROW(reference::calibrate(s, 5.0, {}, {{0.1, 0.2, 0.3}, {0.1, std::nan(""), 0.3}}), ArgumentError);
}

}  // namespace
}  // namespace nvfp4kv
