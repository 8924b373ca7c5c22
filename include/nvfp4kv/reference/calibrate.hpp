#pragma once
// Calibration from K/V samples (docs/calibration.md): per layer the K and V amax, the K mean
// (mu, per KV head and channel), the error of every NVFP4 mode (core/calibration.hpp) measured
// on the samples, the global scales of the recommended format, and that format for a budget of
// bits per value.
#include <map>
#include <string>
#include <vector>

#include "nvfp4kv/core/calibration.hpp"
#include "nvfp4kv/core/progress.hpp"

namespace nvfp4kv::reference {

// Post-RoPE samples of one model: the same token count in every layer.
struct CalibrationSamples {
  int64_t layers = 0, tokens = 0, heads = 0, head_dim = 0;
  std::vector<float> k, v;  // (layers, tokens, heads, D)
  int64_t q_heads = 0;      // 0: no queries given (K rows stand in for them)
  std::vector<float> q;     // (layers, tokens, q_heads, D) or empty
};

// Named arrays as a file holds them: k_L, v_L (tokens, kv heads, D) for every layer L from 0,
// optionally q_L (tokens, q heads, D) for every layer; one shape for all k and v. Throws
// ArgumentError starting with `what` and naming the array (a missing layer, a stray name, a
// shape that differs).
struct SampleArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // C order
};
CalibrationSamples samples_from_arrays(const std::map<std::string, SampleArray>& arrays, const std::string& what);

// Why these samples cannot be calibrated on ("" when they can), naming the array.
std::string samples_problem(const CalibrationSamples& s);

// The error of a mode on a layer: the relative squared error, summed over the probe queries
// and heads, of attention outputs over K/V taken through the mode (transformed, quantized as
// the store does, restored as the gather does) against the exact K/V, in float64. Probe
// queries: up to 32 positions spread over the last three quarters of the samples, each
// attending causally (scale 1/sqrt(D)); their rows of q, or of K where no q is given.
// The first 2048 tokens of each layer are used.
inline constexpr int64_t kCalibrationTokens = 2048;
inline constexpr int kCalibrationProbes = 32;

// Model-level sensitivities measured on the model (nvfp4kv.transformers.calibrate): per layer the
// model's KL with only that layer's K (k) or only its V (v) through its best mode. Both empty, or
// one finite value >= 0 per layer each.
struct ModelKl {
  std::vector<double> k, v;
};
// model_kl: recorded in the file and ranking the layers for FP8 (K by k, V by v). Throws
// ArgumentError as samples_problem and recommend_policy say, and for a model_kl of another
// length or a negative or non-finite value.
Calibration calibrate(const CalibrationSamples& samples, double bits, const Progress& progress = {},
                      const ModelKl& model_kl = {});

}  // namespace nvfp4kv::reference
