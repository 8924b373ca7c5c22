#pragma once
// A calibration: what K/V samples of a model say about its cache, and the per-layer format a
// byte budget buys (docs/calibration.md). The measuring is the reference's
// (reference/calibrate.hpp); this is the file and the policy, which need no arithmetic of
// the format.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvfp4kv/core/cache_format.hpp"

namespace nvfp4kv {

// Version 2 added per_layer[].k_model_kl and v_model_kl; version-1 files (without them) are still read.
inline constexpr int kCalibrationVersion = 2;

// The NVFP4 modes a calibration measures on every layer: a mode is a set of transforms, each
// applied to K and V alike (smoothing to K only). Index i is the mode whose bits are i:
// 1 = 4over6, 2 = rotation of the whole head, 4 = K smoothing.
inline constexpr int kCalibrationModes = 8;
std::string mode_name(int mode);  // "plain", "4over6", "rotation", "4over6+rotation", ... "4over6+rotation+smoothing"

struct LayerCalibration {
  float k_amax = 0, v_amax = 0;     // over the samples, original values
  float k_global_scale = 1, v_global_scale = 1;  // for the recommended format of this layer
  std::vector<double> errors;       // (kCalibrationModes) relative attention-output error per mode
  int best_mode = 0;                // argmin of errors
  double sensitivity() const { return errors.empty() ? 0.0 : errors[0]; }  // plain NVFP4's error
  // The model-level sensitivity of each side where it was measured (nvfp4kv.transformers.calibrate):
  // the mean next-token KL divergence of the model from its unquantized-KV self when only this
  // layer's K (k_model_kl) or only its V (v_model_kl) goes through its best mode. Absent in
  // version-1 files and in calibrations from samples alone; both or neither.
  std::optional<double> k_model_kl, v_model_kl;
  // What the policy ranks this side of the layer by for FP8: its model KL where measured, else the
  // best mode's attention error (one figure for K and V).
  double rank(Side side) const {
    const std::optional<double>& kl = side == Side::kK ? k_model_kl : v_model_kl;
    return kl ? *kl : errors.at(size_t(best_mode));
  }
};

struct Calibration {
  int64_t layers = 0, heads = 0, head_dim = 0;
  int64_t samples = 0;              // tokens per layer measured
  double bits_budget = 0;           // what the policy was asked for
  std::vector<LayerCalibration> per_layer;
  std::vector<float> k_mean;        // (layers, heads, D): post-RoPE K mean over the samples
  CacheFormat format;               // the recommended policy (its k_mean zero where a layer does not smooth)
};

// The recommended per-layer policy: each layer's best mode (NVFP4, 4.5 bits), then FP8 for K on
// the layers of largest rank(K) first (K's model KL where every layer has it, else the best
// mode's attention error), then FP8 for V by rank(V), while the mean bits per value stay within
// `bits`. Fills c.format and the global scales' choice of divisor is the caller's
// (reference::calibrate). Throws ArgumentError for a budget below 4.5 or above 8, or a model KL
// on some layers or sides only.
CacheFormat recommend_policy(const Calibration& c, double bits);

// Versioned JSON (docs/calibration.md).
std::string calibration_to_json(const Calibration& c);
// Throws LayoutError naming the field: unknown keys, a missing or newer version, arrays of the
// wrong length, non-finite numbers, a format that does not fit the sizes.
Calibration parse_calibration(std::string_view text);
Calibration load_calibration(const std::string& path);
// Why this calibration cannot serve a cache of these sizes ("" when it can):
// "the calibration is for 30 layers, the cache has 24".
std::string calibration_mismatch(const Calibration& c, int64_t layers, int64_t heads, int64_t head_dim);

}  // namespace nvfp4kv
