#include "nvfp4kv/reference/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/transform.hpp"

namespace nvfp4kv::reference {

namespace {

// The one-layer format of a mode on layer rows of `heads` heads; mu (heads, D) or null.
CacheFormat mode_format(int mode, const float* mu, int64_t heads, int64_t dim) {
  CacheFormat f;
  f.layers.resize(1);
  for (TensorFormat* t : {&f.layers[0].k, &f.layers[0].v}) {
    t->rule = (mode & 1) ? ScaleRule::kFourOverSix : ScaleRule::kStandard;
    t->rotation = (mode & 2) ? kRotateWholeHead : kNoRotation;
  }
  if ((mode & 4) && mu) f.k_mean.assign(mu, mu + heads * dim);
  return f;
}

// One side of a layer (tokens, heads, D) through a one-layer format: the amax of the
// transformed rows gives the global scale (recommend_global_scale), then each row is
// transformed, quantized block by block, dequantized and restored in float64.
std::vector<double> through_format(const float* rows, int64_t tokens, const CacheDims& d, const CacheFormat& f,
                                   Side side, float* global_scale) {
  const int64_t dim = d.head_dim;
  std::vector<float> transformed(rows, rows + tokens * d.heads * dim);
  int64_t non_finite = 0;
  float amax = 0;
  for (int64_t r = 0; r < tokens * d.heads; ++r) {
    transform_row(f, d, 0, side, r % d.heads, transformed.data() + r * dim, &non_finite);
    for (int64_t e = 0; e < dim; ++e)
      if (std::isfinite(transformed[size_t(r * dim + e)]))
        amax = std::max(amax, std::fabs(transformed[size_t(r * dim + e)]));
  }
  const float gs = recommend_global_scale(amax);
  *global_scale = gs;
  const ScaleRule rule = f.layer(0).side(side).rule;
  std::vector<double> out(transformed.size());
  for (int64_t r = 0; r < tokens * d.heads; ++r) {
    for (int64_t g = 0; g < dim / kBlockSize; ++g) {
      const QuantizedBlock q = quantize_block(transformed.data() + r * dim + g * kBlockSize, gs, rule);
      for (int e = 0; e < kBlockSize; ++e)
        out[size_t(r * dim + g * kBlockSize + e)] = dequantize_element(q.packed[e / 2], e % 2, q.scale, gs);
    }
    restore_row_f64(f, d, 0, side, r % d.heads, out.data() + r * dim);
  }
  return out;
}

// Attention outputs of the probe queries over (k, v): (probes, q_heads, D).
std::vector<double> probe_outputs(const std::vector<double>& q, const std::vector<int64_t>& probes, int64_t q_heads,
                                  const std::vector<double>& k, const std::vector<double>& v, const CacheDims& d) {
  std::vector<double> out(probes.size() * size_t(q_heads * d.head_dim));
  std::vector<double> lse(static_cast<size_t>(q_heads));
  const AttentionOptions o{.softmax_scale = 1.0 / std::sqrt(double(d.head_dim))};
  for (size_t i = 0; i < probes.size(); ++i)
    attend(q.data() + probes[i] * q_heads * d.head_dim, q_heads, k.data(), v.data(), probes[i] + 1, d.heads,
           d.head_dim, o, out.data() + i * size_t(q_heads * d.head_dim), lse.data());
  return out;
}

}  // namespace

CalibrationSamples samples_from_arrays(const std::map<std::string, SampleArray>& arrays, const std::string& what) {
  CalibrationSamples s;
  while (arrays.count("k_" + std::to_string(s.layers))) ++s.layers;
  const auto fail = [&](const std::string& why) { throw ArgumentError(what + ": " + why); };
  if (s.layers == 0) fail("no array k_0 (expected k_0, v_0, k_1, v_1, ... one pair per layer)");
  // Queries in one layer mean queries in every layer: a stray q_L without q_0 is reported as q_0 missing.
  const bool with_q = std::any_of(arrays.begin(), arrays.end(), [](const auto& a) { return a.first.rfind("q_", 0) == 0; });
  const auto dims = [](const std::vector<int64_t>& sh) {
    std::string t;
    for (int64_t x : sh) t += (t.empty() ? "" : ", ") + std::to_string(x);
    return "(" + t + ")";
  };
  for (const auto& [name, a] : arrays) {
    const size_t cut = name.find('_');
    const std::string kind = name.substr(0, cut);
    int64_t layer = -1;
    if (cut != std::string::npos && cut + 1 < name.size() && name.size() - cut < 8 &&
        name.find_first_not_of("0123456789", cut + 1) == std::string::npos)
      layer = std::stoll(name.substr(cut + 1));
    if ((kind != "k" && kind != "v" && kind != "q") || layer < 0 || layer >= s.layers ||
        name != kind + "_" + std::to_string(layer))
      fail("unexpected array " + quote_text(name) + " (k_L, v_L and optionally q_L for layers L in [0, " +
           std::to_string(s.layers) + "))");
    if (a.shape.size() != 3) fail(name + " must be (tokens, heads, D), got shape " + dims(a.shape));
    int64_t n = 1;
    for (int64_t x : a.shape) n *= x;
    if (int64_t(a.values.size()) != n) fail(name + ": " + std::to_string(a.values.size()) + " values for shape " + dims(a.shape));
  }
  const std::vector<int64_t>& first = arrays.at("k_0").shape;
  s.tokens = first[0], s.heads = first[1], s.head_dim = first[2];
  for (int64_t l = 0; l < s.layers; ++l)
    for (const char* kind : {"k", "v", "q"}) {
      const std::string name = std::string(kind) + "_" + std::to_string(l);
      if (kind[0] == 'q' && !with_q) continue;
      if (!arrays.count(name)) fail("missing " + name + " (every layer needs k, v" + (with_q ? " and q" : "") + ")");
      const SampleArray& a = arrays.at(name);
      if (kind[0] == 'q') {
        if (a.shape[0] != s.tokens || a.shape[2] != s.head_dim || (s.q_heads && a.shape[1] != s.q_heads))
          fail(name + " has shape " + dims(a.shape) + "; q arrays must be (" + std::to_string(s.tokens) + ", q heads, " +
               std::to_string(s.head_dim) + "), one shape in every layer");
        s.q_heads = a.shape[1];
      } else if (a.shape != first) {
        fail(name + " has shape " + dims(a.shape) + ", k_0 has " + dims(first) +
             ": every layer's k and v must have one shape");
      }
      std::vector<float>& to = kind[0] == 'k' ? s.k : kind[0] == 'v' ? s.v : s.q;
      to.insert(to.end(), a.values.begin(), a.values.end());  // layer by layer: (layers, tokens, heads, D)
    }
  if (std::string p = samples_problem(s); !p.empty()) fail(p);
  return s;
}

std::string samples_problem(const CalibrationSamples& s) {
  if (s.layers < 1) return "no layers: give k_0, v_0, ... for every layer";
  if (s.tokens < 16) return "each layer needs at least 16 sample tokens, got " + std::to_string(s.tokens);
  if (s.heads < 1) return "kv heads must be >= 1, got " + std::to_string(s.heads);
  if (std::string p = head_dim_problem(s.head_dim); !p.empty()) return p;
  const size_t want = size_t(s.layers * s.tokens * s.heads * s.head_dim);
  if (s.k.size() != want || s.v.size() != want)
    return "K and V samples must hold (layers " + std::to_string(s.layers) + ", tokens " + std::to_string(s.tokens) +
           ", kv heads " + std::to_string(s.heads) + ", D " + std::to_string(s.head_dim) + ") values each";
  if (!s.q.empty() || s.q_heads) {
    if (s.q_heads < 1 || s.q_heads % s.heads != 0)
      return "q heads must be a positive multiple of the " + std::to_string(s.heads) + " kv heads, got " +
             std::to_string(s.q_heads);
    if (s.q.size() != size_t(s.layers * s.tokens * s.q_heads * s.head_dim))
      return "Q samples must hold (layers, tokens, q heads, D) values";
  }
  for (const std::vector<float>* a : {&s.k, &s.v, &s.q})
    for (float x : *a)
      if (!std::isfinite(x)) return std::string(a == &s.k ? "K" : a == &s.v ? "V" : "Q") + " samples hold a non-finite value";
  return "";
}

Calibration calibrate(const CalibrationSamples& s, double bits, const Progress& progress, const ModelKl& model_kl) {
  if (std::string p = samples_problem(s); !p.empty()) throw ArgumentError("calibrate: " + p);
  if (!(bits >= 4.5 && bits <= 8.0))
    throw ArgumentError("calibrate: --bits: a budget of bits per value in [4.5, 8] (NVFP4 to FP8), got " +
                        std::to_string(bits));
  const bool with_kl = !model_kl.k.empty() || !model_kl.v.empty();
  for (auto [values, side] : {std::pair{&model_kl.k, "k"}, {&model_kl.v, "v"}}) {
    if (with_kl && int64_t(values->size()) != s.layers)
      throw ArgumentError(std::string("calibrate: model_kl.") + side + ": " + std::to_string(values->size()) +
                          " values for " + std::to_string(s.layers) + " layers (one per layer for K and V, or none)");
    for (size_t l = 0; l < values->size(); ++l)
      if (!(std::isfinite((*values)[l]) && (*values)[l] >= 0))
        throw ArgumentError(std::string("calibrate: model_kl.") + side + "[" + std::to_string(l) +
                            "]: a KL divergence, finite and >= 0, got " + std::to_string((*values)[l]));
  }
  const int64_t tokens = std::min(s.tokens, kCalibrationTokens), dim = s.head_dim;
  const CacheDims d{1, 1, 1, s.heads, dim};
  const int64_t q_heads = s.q.empty() ? s.heads : s.q_heads;
  Calibration c;
  c.layers = s.layers;
  c.heads = s.heads;
  c.head_dim = dim;
  c.samples = tokens;
  c.bits_budget = bits;
  c.k_mean.assign(size_t(s.layers * s.heads * dim), 0.0f);
  std::vector<int64_t> probes;
  for (int i = 0; i < kCalibrationProbes; ++i) {
    const int64_t p = tokens / 4 + (tokens - 1 - tokens / 4) * i / (kCalibrationProbes - 1);
    if (probes.empty() || probes.back() != p) probes.push_back(p);
  }
  for (int64_t l = 0; l < s.layers; ++l) {
    report_progress(progress, "layer " + std::to_string(l), double(l) / double(s.layers));
    const float* k = s.k.data() + l * s.tokens * s.heads * dim;
    const float* v = s.v.data() + l * s.tokens * s.heads * dim;
    LayerCalibration lc;
    std::vector<double> mu(size_t(s.heads * dim), 0.0);
    for (int64_t i = 0; i < tokens * s.heads * dim; ++i) {
      lc.k_amax = std::max(lc.k_amax, std::fabs(k[i]));
      lc.v_amax = std::max(lc.v_amax, std::fabs(v[i]));
      mu[size_t(i % (s.heads * dim))] += double(k[i]);
    }
    float* mu_out = c.k_mean.data() + l * s.heads * dim;
    for (size_t i = 0; i < mu.size(); ++i) mu_out[i] = float(mu[i] / double(tokens));
    std::vector<double> q(size_t(tokens * q_heads * dim));
    const float* qsrc = s.q.empty() ? k : s.q.data() + l * s.tokens * s.q_heads * dim;
    for (size_t i = 0; i < q.size(); ++i) q[i] = double(qsrc[i]);
    const std::vector<double> k_exact(k, k + tokens * s.heads * dim), v_exact(v, v + tokens * s.heads * dim);
    const std::vector<double> want = probe_outputs(q, probes, q_heads, k_exact, v_exact, d);
    double norm = 0;
    for (double x : want) norm += x * x;
    std::vector<std::pair<float, float>> scales(kCalibrationModes);
    for (int m = 0; m < kCalibrationModes; ++m) {
      const CacheFormat f = mode_format(m, mu_out, s.heads, dim);
      const std::vector<double> kq = through_format(k, tokens, d, f, Side::kK, &scales[size_t(m)].first);
      const std::vector<double> vq = through_format(v, tokens, d, f, Side::kV, &scales[size_t(m)].second);
      const std::vector<double> got = probe_outputs(q, probes, q_heads, kq, vq, d);
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) err += (got[i] - want[i]) * (got[i] - want[i]);
      lc.errors.push_back(norm > 0 ? err / norm : err);
    }
    lc.best_mode = int(std::min_element(lc.errors.begin(), lc.errors.end()) - lc.errors.begin());
    lc.k_global_scale = scales[size_t(lc.best_mode)].first;
    lc.v_global_scale = scales[size_t(lc.best_mode)].second;
    if (with_kl) lc.k_model_kl = model_kl.k[size_t(l)], lc.v_model_kl = model_kl.v[size_t(l)];
    c.per_layer.push_back(lc);
  }
  c.format = recommend_policy(c, bits);
  // FP8 tensors: the per-tensor scale that puts amax (after mu, for K) at 448.
  for (int64_t l = 0; l < s.layers; ++l)
    for (Side side : {Side::kK, Side::kV}) {
      if (c.format.layers[size_t(l)].side(side).element != ElementFormat::kFp8E4M3) continue;
      const float* rows = (side == Side::kK ? s.k.data() : s.v.data()) + l * s.tokens * s.heads * dim;
      const float* mu = side == Side::kK && c.format.has_k_mean() ? c.format.k_mean.data() + l * s.heads * dim : nullptr;
      float amax = 0;
      for (int64_t i = 0; i < tokens * s.heads * dim; ++i)
        amax = std::max(amax, std::fabs(rows[i] - (mu ? mu[i % (s.heads * dim)] : 0.0f)));
      float& gs = side == Side::kK ? c.per_layer[size_t(l)].k_global_scale : c.per_layer[size_t(l)].v_global_scale;
      gs = amax > 0 ? std::clamp(amax / kE4M3Max, kMinGlobalScale, kMaxGlobalScale) : 1.0f;
    }
  report_progress(progress, "done", 1.0);
  return c;
}

}  // namespace nvfp4kv::reference
