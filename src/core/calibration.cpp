#include "nvfp4kv/core/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/files.hpp"
#include "strict_json.hpp"

namespace nvfp4kv {

namespace {

using json = nlohmann::json;
using detail::json_excerpt;
using detail::require_keys;

constexpr size_t kMaxCalibrationBytes = size_t(64) << 20;
constexpr size_t kMaxCalibrationDepth = 8;
constexpr double kFp8Step = (8.0 - 4.5) / 2;  // bits per value one tensor of one layer adds as FP8

const json& field(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key)) throw LayoutError(where + ": \"" + key + "\" is required");
  return obj[key];
}

double number(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw LayoutError(where + "." + key + ": expected a finite number, got " + json_excerpt(v));
  return v.get<double>();
}

int64_t count(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_number_integer() || v.get<int64_t>() < 1)
    throw LayoutError(where + "." + key + ": expected a positive integer, got " + json_excerpt(v));
  return v.get<int64_t>();
}

}  // namespace

std::string mode_name(int mode) {
  std::string s;
  for (auto [bit, name] : {std::pair{1, "4over6"}, {2, "rotation"}, {4, "smoothing"}})
    if (mode & bit) s += (s.empty() ? "" : "+") + std::string(name);
  return s.empty() ? "plain" : s;
}

CacheFormat recommend_policy(const Calibration& c, double bits) {
  if (!(bits >= 4.5 && bits <= 8.0))
    throw ArgumentError("--bits: a budget of bits per value in [4.5, 8] (NVFP4 to FP8), got " + std::to_string(bits));
  if (int64_t(c.per_layer.size()) != c.layers || c.layers < 1)
    throw ArgumentError("recommend_policy: " + std::to_string(c.per_layer.size()) + " layers measured, " +
                        std::to_string(c.layers) + " expected");
  CacheFormat f;
  f.layers.resize(size_t(c.layers));
  bool smooths = false;
  for (int64_t l = 0; l < c.layers; ++l) {
    const int m = c.per_layer[size_t(l)].best_mode;
    for (TensorFormat* t : {&f.layers[size_t(l)].k, &f.layers[size_t(l)].v}) {
      t->rule = (m & 1) ? ScaleRule::kFourOverSix : ScaleRule::kStandard;
      t->rotation = (m & 2) ? kRotateWholeHead : kNoRotation;
    }
    smooths |= (m & 4) != 0;
  }
  if (smooths) {
    f.k_mean.assign(size_t(c.layers * c.heads * c.head_dim), 0.0f);
    for (int64_t l = 0; l < c.layers; ++l)
      if (c.per_layer[size_t(l)].best_mode & 4)
        std::copy_n(c.k_mean.begin() + l * c.heads * c.head_dim, c.heads * c.head_dim,
                    f.k_mean.begin() + l * c.heads * c.head_dim);
  }
  const auto with_kl = std::count_if(c.per_layer.begin(), c.per_layer.end(), [](const LayerCalibration& l) {
    return l.k_model_kl.has_value() && l.v_model_kl.has_value();
  });
  const auto with_any = std::count_if(c.per_layer.begin(), c.per_layer.end(), [](const LayerCalibration& l) {
    return l.k_model_kl.has_value() || l.v_model_kl.has_value();
  });
  if (with_any != 0 && (with_kl != c.layers || with_any != c.layers))
    throw ArgumentError("recommend_policy: a model KL for K and V measured on " + std::to_string(with_kl) + " of " +
                        std::to_string(c.layers) + " layers (all or none)");
  // Per side, layers by rank() (that side's model KL, or the best mode's error), largest first
  // (ties: the lower layer first).
  const auto order = [&](Side side) {
    std::vector<int64_t> o(size_t(c.layers));
    std::iota(o.begin(), o.end(), 0);
    std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) {
      return c.per_layer[size_t(a)].rank(side) > c.per_layer[size_t(b)].rank(side);
    });
    return o;
  };
  double total = 4.5 * double(c.layers);  // bits per value summed over layers
  for (Side side : {Side::kK, Side::kV})
    for (int64_t l : order(side)) {
      if ((total + kFp8Step) / double(c.layers) > bits + 1e-12) return f;
      TensorFormat& t = side == Side::kK ? f.layers[size_t(l)].k : f.layers[size_t(l)].v;
      t = {ElementFormat::kFp8E4M3, ScaleRule::kStandard, kNoRotation};
      total += kFp8Step;
    }
  return f;
}

std::string calibration_to_json(const Calibration& c) {
  json layers = json::array();
  for (const LayerCalibration& l : c.per_layer) {
    json errors = json::object();
    for (int m = 0; m < kCalibrationModes && m < int(l.errors.size()); ++m) errors[mode_name(m)] = l.errors[size_t(m)];
    layers.push_back({{"k_amax", l.k_amax}, {"v_amax", l.v_amax}, {"k_global_scale", l.k_global_scale},
                      {"v_global_scale", l.v_global_scale}, {"sensitivity", l.sensitivity()}, {"errors", errors},
                      {"best_mode", mode_name(l.best_mode)},
                      {"k_model_kl", l.k_model_kl ? json(*l.k_model_kl) : json(nullptr)},
                      {"v_model_kl", l.v_model_kl ? json(*l.v_model_kl) : json(nullptr)}});
  }
  json doc = {{"nvfp4kv_calibration", kCalibrationVersion},
              {"layers", c.layers},
              {"kv_heads", c.heads},
              {"head_dim", c.head_dim},
              {"samples", c.samples},
              {"bits_budget", c.bits_budget},
              {"bits_per_value", bits_per_value(c.format, c.layers)},
              {"per_layer", layers},
              {"k_mean", c.k_mean},
              {"format", json::parse(format_to_json(c.format))}};
  return doc.dump(1);
}

Calibration parse_calibration(std::string_view text) {
  json doc;
  try {
    doc = detail::parse_json_strict(text, {"calibration", kMaxCalibrationBytes, kMaxCalibrationDepth, false});
  } catch (const ArgumentError& e) {
    throw LayoutError(e.what());
  }
  const std::string root = "calibration";
  require_keys(doc, {"nvfp4kv_calibration", "layers", "kv_heads", "head_dim", "samples", "bits_budget",
                     "bits_per_value", "per_layer", "k_mean", "format"},
               root);
  const json& version = field(doc, "nvfp4kv_calibration", root);
  if (!version.is_number_integer() || version.get<int64_t>() < 1 || version.get<int64_t>() > kCalibrationVersion)
    throw LayoutError("calibration.nvfp4kv_calibration: version " + json_excerpt(version) +
                      " is not one this build reads (1 to " + std::to_string(kCalibrationVersion) + ")");
  const bool v1 = version.get<int64_t>() == 1;
  Calibration c;
  c.layers = count(doc, "layers", root);
  c.heads = count(doc, "kv_heads", root);
  c.head_dim = count(doc, "head_dim", root);
  c.samples = count(doc, "samples", root);
  c.bits_budget = number(doc, "bits_budget", root);
  const json& layers = field(doc, "per_layer", root);
  if (!layers.is_array() || int64_t(layers.size()) != c.layers)
    throw LayoutError("calibration.per_layer: expected an array of " + std::to_string(c.layers) + " layers, got " +
                      (layers.is_array() ? std::to_string(layers.size()) + " entries" : json_excerpt(layers)));
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string where = "calibration.per_layer[" + std::to_string(i) + "]";
    const json& e = layers[i];
    if (v1)
      require_keys(e, {"k_amax", "v_amax", "k_global_scale", "v_global_scale", "sensitivity", "errors", "best_mode"},
                   where);
    else
      require_keys(e, {"k_amax", "v_amax", "k_global_scale", "v_global_scale", "sensitivity", "errors", "best_mode",
                       "k_model_kl", "v_model_kl"},
                   where);
    LayerCalibration l;
    l.k_amax = float(number(e, "k_amax", where));
    l.v_amax = float(number(e, "v_amax", where));
    l.k_global_scale = float(number(e, "k_global_scale", where));
    l.v_global_scale = float(number(e, "v_global_scale", where));
    for (auto [v, key] : {std::pair{l.k_global_scale, "k_global_scale"}, {l.v_global_scale, "v_global_scale"}})
      if (!global_scale_usable(v))
        throw LayoutError(where + "." + key + ": " + std::to_string(v) + " is not a usable global scale ([2^-100, 2^100])");
    const json& errors = field(e, "errors", where);
    require_keys(errors, {"plain", "4over6", "rotation", "4over6+rotation", "smoothing", "4over6+smoothing",
                          "rotation+smoothing", "4over6+rotation+smoothing"},
                 where + ".errors");
    for (int m = 0; m < kCalibrationModes; ++m) l.errors.push_back(number(errors, mode_name(m).c_str(), where + ".errors"));
    const json& best = field(e, "best_mode", where);
    l.best_mode = -1;
    for (int m = 0; m < kCalibrationModes; ++m)
      if (best == mode_name(m)) l.best_mode = m;
    if (l.best_mode < 0) throw LayoutError(where + ".best_mode: " + json_excerpt(best) + " is not a mode");
    for (auto [kl, key] : {std::pair{&l.k_model_kl, "k_model_kl"}, {&l.v_model_kl, "v_model_kl"}}) {
      if (v1 || field(e, key, where).is_null()) continue;
      *kl = number(e, key, where);
      if (**kl < 0) throw LayoutError(where + "." + key + ": a KL divergence is >= 0, got " + json_excerpt(e[key]));
    }
    if (l.k_model_kl.has_value() != l.v_model_kl.has_value() ||
        (i > 0 && l.k_model_kl.has_value() != c.per_layer[0].k_model_kl.has_value()))
      throw LayoutError(where + ": k_model_kl and v_model_kl measured on some layers or sides only (all or none: null)");
    c.per_layer.push_back(l);
  }
  const json& mu = field(doc, "k_mean", root);
  if (!mu.is_array() || int64_t(mu.size()) != c.layers * c.heads * c.head_dim)
    throw LayoutError("calibration.k_mean: expected (layers " + std::to_string(c.layers) + ", kv heads " +
                      std::to_string(c.heads) + ", D " + std::to_string(c.head_dim) + ") values, got " +
                      (mu.is_array() ? std::to_string(mu.size()) : json_excerpt(mu)));
  for (size_t i = 0; i < mu.size(); ++i) {
    if (!mu[i].is_number() || !std::isfinite(float(mu[i].get<double>())))
      throw LayoutError("calibration.k_mean[" + std::to_string(i) + "]: expected a finite number, got " +
                        json_excerpt(mu[i]));
    c.k_mean.push_back(float(mu[i].get<double>()));
  }
  c.format = parse_format(field(doc, "format", root).dump());
  const CacheDims dims{c.layers, 1, 1, c.heads, c.head_dim};
  if (std::string p = format_problem(c.format, dims); !p.empty()) throw LayoutError("calibration." + p);
  // The calibration's global scales are measured on K - mu; a lambda in its format would change
  // the values they must cover, and calibrate does not choose lambda yet.
  if (c.format.has_k_channel_scale())
    throw LayoutError("calibration.format.k_channel_scale: a calibration does not choose K's channel scale yet, "
                      "so its global scales do not cover one; give the format with lambda and its global scales to "
                      "the cache directly (docs/format.md)");
  return c;
}

Calibration load_calibration(const std::string& path) {
  try {
    return parse_calibration(read_text_file(path, int64_t(kMaxCalibrationBytes), "calibration file"));
  } catch (const LayoutError& e) {
    throw LayoutError(path + ": " + e.what());
  }
}

std::string calibration_mismatch(const Calibration& c, int64_t layers, int64_t heads, int64_t head_dim) {
  for (auto [have, want, what] : {std::tuple{c.layers, layers, "layers"}, {c.heads, heads, "kv heads"},
                                  {c.head_dim, head_dim, "head dim"}})
    if (have != want)
      return std::string("the calibration is for ") + std::to_string(have) + " " + what + ", the cache has " +
             std::to_string(want);
  return "";
}

}  // namespace nvfp4kv
