#include "nvfp4kv/harness/accuracy.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/quantize.hpp"

namespace nvfp4kv::harness {
namespace {

constexpr int64_t kKvHeads = 8, kQHeads = 32, kDim = 128;

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

double rel_l2(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
  return std::sqrt(num / den);
}

}  // namespace

std::vector<AccuracyRow> attention_accuracy(int64_t tokens, uint64_t seed) {
  std::vector<AccuracyRow> rows;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  constexpr int kQueries = 8;  // decode steps: query draws, the errors pooled over all of them
  std::vector<double> q(size_t(kQueries * kQHeads * kDim));
  for (double& x : q) x = n(rng);
  reference::AttentionOptions opt;
  opt.softmax_scale = 1.0 / std::sqrt(double(kDim));
  for (int64_t sinks : {int64_t(0), int64_t(4)}) {
    const std::string cache = sinks ? "heavy tails + 4 sink tokens (values 1e4 - 4e4)" : "heavy tails + K outlier channels";
    const std::vector<float> k = realistic_kv(tokens, kKvHeads, kDim, true, seed + 1, sinks);
    const std::vector<float> v = realistic_kv(tokens, kKvHeads, kDim, false, seed + 2, sinks);
    const auto attend = [&](const std::vector<double>& kk, const std::vector<double>& vv) {
      std::vector<double> out(q.size()), lse(static_cast<size_t>(kQHeads));
      for (int s = 0; s < kQueries; ++s)
        reference::attend(q.data() + s * kQHeads * kDim, kQHeads, kk.data(), vv.data(), tokens, kKvHeads, kDim, opt,
                          out.data() + s * kQHeads * kDim, lse.data());
      return out;
    };
    const std::vector<double> exact = attend(widen(k), widen(v));
    const auto through = [](const std::vector<float>& x, float (*f)(float, float), float s) {
      std::vector<double> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = f(x[i], s);
      return y;
    };
    const std::vector<double> bf16 =
        attend(through(k, [](float x, float) { return bf16_to_float(float_to_bf16(x)); }, 0),
               through(v, [](float x, float) { return bf16_to_float(float_to_bf16(x)); }, 0));
    rows.push_back({cache, "BF16", rel_l2(bf16, exact), 0.0, 2.0 * 2 * kKvHeads * kDim});
    const auto amax = [](const std::vector<float>& x) {
      float m = 0;
      for (float e : x) m = std::max(m, std::fabs(e));
      return m;
    };
    const auto fp8 = [](float x, float s) { return e4m3_decode(e4m3_encode(x / s)) * s; };
    const std::vector<double> e4m3 = attend(through(k, fp8, amax(k) / kE4M3Max), through(v, fp8, amax(v) / kE4M3Max));
    rows.push_back({cache, "FP8 E4M3, per-tensor scale", rel_l2(e4m3, exact), rel_l2(e4m3, bf16), 1.0 * 2 * kKvHeads * kDim});
    const reference::DenseShape shape{tokens, kKvHeads, kDim};
    for (auto [rule, name] : {std::pair{ScaleRule::kStandard, "NVFP4, amax/6 scales"},
                              {ScaleRule::kFourOverSix, "NVFP4, 4over6 scales"}}) {
      const ScaleRule r = rule;  // a structured binding cannot be captured before clang 16 (the fuzz build)
      const auto quantized = [&, r](const std::vector<float>& x) {
        const float gs = recommend_global_scale(amax(x));
        return widen(reference::dequantize(reference::quantize(x.data(), ElementType::kFloat32, shape, gs, r), gs));
      };
      const std::vector<double> fp4 = attend(quantized(k), quantized(v));
      rows.push_back({cache, name, rel_l2(fp4, exact), rel_l2(fp4, bf16), 2.0 * kKvHeads * (kDim / 2 + kDim / 16)});
    }
  }
  return rows;
}

}  // namespace nvfp4kv::harness
