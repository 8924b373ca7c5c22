// nvfp4kv calibrate: K/V samples (.npz or .safetensors) in, a calibration file out (docs/calibration.md);
// the measuring is reference::calibrate's.
#include <fstream>
#include <iomanip>
#include <iostream>

#include "cli.hpp"
#include "nvfp4kv/conformance/npy.hpp"
#include "nvfp4kv/core/files.hpp"
#include "nvfp4kv/reference/calibrate.hpp"

namespace nvfp4kv::cli {
namespace {

const CommandSpec& calibrate_spec() {
  static const CommandSpec s{
      "calibrate", "",
      "Measure a model's post-RoPE K/V samples per layer and recommend a per-layer cache format for a budget\n"
      "of bits per value: global scales, K means, each layer's error under every NVFP4 mode, FP8 for K (then V)\n"
      "on the layers of largest error while the budget allows.",
      {{"samples", "FILE", "arrays k_0, v_0, k_1, v_1, ... (tokens, kv heads, D) per layer, optionally q_0, ... "
                           "(tokens, q heads, D); float32, float16 or bf16; an .npz (numpy.savez) or a .safetensors file"},
       {"bits", "B", "bits per value to spend, in [4.5, 8] (default 4.5: NVFP4 everywhere)"},
       {"out", "FILE", "the calibration file to write (JSON)"},
       kJsonOption},
      "Nothing is written unless every array is read and checked."};
  return s;
}

}  // namespace

int run_calibrate(const std::vector<std::string>& argv) {
  const Args a(argv, calibrate_spec());
  if (a.help()) {
    std::cout << help_text(calibrate_spec());
    return kExitOk;
  }
  if (!a.positional().empty()) throw UsageError("calibrate takes no positional arguments");
  const auto samples_path = a.get("samples");
  const auto out = a.get("out");
  if (!samples_path || !out) throw UsageError("--samples FILE (.npz or .safetensors) and --out FILE are required");
  double bits = 4.5;
  if (const auto b = a.get("bits")) {
    try {
      size_t used = 0;
      bits = std::stod(*b, &used);
      if (used != b->size()) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      throw UsageError("--bits: expected a number of bits per value, got " + quote_text(*b));
    }
  }
  require_writable_path(*out, "--out");
  const reference::CalibrationSamples samples =
      conformance::read_calibration_samples(*samples_path, "--samples");
  Calibration c;
  {
    StderrProgress progress("calibrate");
    c = reference::calibrate(samples, bits, progress.callback());
  }
  {
    std::ofstream f(*out);
    f << calibration_to_json(c) << "\n";
    if (!f) throw ArgumentError("--out: cannot write " + *out);
  }
  const double achieved = bits_per_value(c.format, c.layers);
  if (a.flag("json")) {
    Json layers = Json::array();
    for (int64_t l = 0; l < c.layers; ++l) {
      const LayerFormat f = c.format.layer(l);
      layers.push_back({{"layer", l}, {"sensitivity", c.per_layer[size_t(l)].sensitivity()},
                        {"best_mode", mode_name(c.per_layer[size_t(l)].best_mode)},
                        {"k", element_format_name(f.k.element)}, {"v", element_format_name(f.v.element)}});
    }
    print_json("calibrate", {{"samples", *samples_path}, {"out", *out}, {"layers", c.layers}, {"kv_heads", c.heads},
                             {"head_dim", c.head_dim}, {"tokens", c.samples}, {"bits_budget", bits},
                             {"bits_per_value", achieved}, {"per_layer", layers}});
    return kExitOk;
  }
  std::cout << "calibrated " << c.layers << " layers (" << c.heads << " kv heads, D " << c.head_dim << ") on "
            << c.samples << " tokens each; policy for " << bits << " bits per value: " << achieved << "\n";
  std::cout << "  layer  sensitivity  best NVFP4 mode               error   K         V\n";
  for (int64_t l = 0; l < c.layers; ++l) {
    const LayerCalibration& lc = c.per_layer[size_t(l)];
    const LayerFormat f = c.format.layer(l);
    std::cout << "  " << std::setw(5) << l << "  " << std::setw(11) << std::setprecision(4) << lc.sensitivity() << "  "
              << std::left << std::setw(27) << mode_name(lc.best_mode) << std::right << std::setw(8)
              << lc.errors[size_t(lc.best_mode)] << "   " << std::left << std::setw(10)
              << element_format_name(f.k.element) << element_format_name(f.v.element) << std::right << "\n";
  }
  std::cout << "written: " << *out << "\n";
  return kExitOk;
}

}  // namespace nvfp4kv::cli
