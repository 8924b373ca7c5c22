#include "nvfp4kv/reference/attention.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "nvfp4kv/reference/transform.hpp"

namespace nvfp4kv::reference {

void attend(const double* q, int64_t q_heads, const double* k, const double* v, int64_t tokens, int64_t kv_heads,
            int64_t dim, const AttentionOptions& o, double* out, double* lse) {
  const int64_t group = q_heads / kv_heads;
  const int64_t first = o.window > 0 ? std::max<int64_t>(0, tokens - o.window) : 0;
  std::vector<double> logit(size_t(std::max<int64_t>(tokens, 1)));
  for (int64_t h = 0; h < q_heads; ++h) {
    const int64_t kvh = h / group;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t t = first; t < tokens; ++t) {
      double dot = 0;
      for (int64_t e = 0; e < dim; ++e) dot += q[h * dim + e] * k[(t * kv_heads + kvh) * dim + e];
      if (o.score_bias) dot += o.score_bias[h];
      double z = dot * o.softmax_scale;
      if (o.softcap > 0) z = o.softcap * std::tanh(z / o.softcap);
      logit[size_t(t)] = z;
      mx = std::max(mx, z);
    }
    const double sink = o.sinks ? double(o.sinks[h]) : -std::numeric_limits<double>::infinity();
    mx = std::max(mx, sink);
    double den = o.sinks ? std::exp(sink - mx) : 0.0;
    for (int64_t e = 0; e < dim; ++e) out[h * dim + e] = 0;
    for (int64_t t = first; t < tokens; ++t) {
      const double p = std::exp(logit[size_t(t)] - mx);
      den += p;
      for (int64_t e = 0; e < dim; ++e) out[h * dim + e] += p * v[(t * kv_heads + kvh) * dim + e];
    }
    for (int64_t e = 0; e < dim; ++e) out[h * dim + e] = den > 0 ? out[h * dim + e] / den : 0.0;
    lse[h] = den > 0 ? mx + std::log(den) : -std::numeric_limits<double>::infinity();
  }
}

DecodeResult decode_attention(const ValidLayout& valid, const CacheBuffers& buffers, const DecodeArgs& a) {
  if (std::string p = decode_problem(valid, buffers, a); !p.empty())
    throw ArgumentError("reference::decode_attention: " + p);
  if (a.q_type != ElementType::kBFloat16 && a.q_type != ElementType::kFloat16 && a.q_type != ElementType::kFloat32)
    throw ArgumentError("reference::decode_attention: unsupported query type");
  const CacheFormat& format = valid.format();
  if (std::string p = paged_format_problem(format, a.layer); !p.empty())
    throw ArgumentError("reference::decode_attention: " + p);
  const TensorFormat k_format = format.layer(a.layer).k, v_format = format.layer(a.layer).v;
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  const int64_t dim = d.head_dim, row = d.heads * dim;
  const int64_t q_stride = a.q_token_stride ? a.q_token_stride : a.q_heads * dim;
  DecodeResult r;
  r.out.assign(size_t(a.batch.batch * a.q_heads * dim), 0.0);
  r.lse.assign(size_t(a.batch.batch * a.q_heads), 0.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const float kgs = *a.k_global_scale, vgs = *a.v_global_scale;
  const bool scales_ok = global_scale_usable(kgs) && global_scale_usable(vgs);
  AttentionOptions o{a.softmax_scale, a.window, a.softcap, a.sinks};
  for (int64_t s = 0; s < a.batch.batch; ++s) {
    const SequenceLength len = sequence_length(a.batch, s, d.tokens_per_page);
    const auto count = [&](unsigned long long DeviceStatus::*field, unsigned long long n) {
      if (a.status) a.status->*field += n;
    };
    if (len.bad) count(&DeviceStatus::bad_lengths, 1);
    if (!scales_ok) count(&DeviceStatus::bad_global_scale, (unsigned long long)len.tokens);
    bool poisoned = len.bad || !scales_ok;
    std::vector<double> k(size_t(std::max<int64_t>(len.tokens, 1) * row)), v(k.size());
    const int64_t first = a.window > 0 ? std::max<int64_t>(0, len.tokens - a.window) : 0;
    if (!poisoned)
      for (int64_t e0 = first / d.tokens_per_page; e0 * d.tokens_per_page < len.tokens; ++e0) {
        const int64_t page = page_of(a.batch, s, e0, d.pages);
        const int64_t tokens = std::min(d.tokens_per_page, len.tokens - e0 * d.tokens_per_page);
        if (page < 0) {
          count(&DeviceStatus::bad_pages, (unsigned long long)tokens);
          poisoned = true;
          continue;
        }
        for (int64_t t = 0; t < tokens; ++t)
          for (Side side : {Side::kK, Side::kV}) {
            const SideRegions reg = side_regions(side);
            std::vector<double>& dst = side == Side::kK ? k : v;
            for (int64_t h = 0; h < d.heads; ++h)
              for (int64_t e = 0; e < dim; ++e) {
                const uint8_t byte = *element_address(l, buffers, reg.data, {a.layer, page, t, h, e / 2});
                const uint8_t sf = *element_address(l, buffers, reg.scale, {a.layer, page, t, h, e / kBlockSize});
                dst[size_t((e0 * d.tokens_per_page + t) * row + h * dim + e)] =
                    dequantize_element(byte, int(e % 2), sf, *a.global_scale(side));
              }
          }
      }
    double* out = r.out.data() + s * a.q_heads * dim;
    double* lse = r.lse.data() + s * a.q_heads;
    if (poisoned) {
      std::fill(out, out + a.q_heads * dim, nan);
      std::fill(lse, lse + a.q_heads, nan);
      continue;
    }
    std::vector<double> q(size_t(a.q_heads * dim));
    for (int64_t i = 0; i < a.q_heads * dim; ++i) q[size_t(i)] = element_to_float(a.q, s * q_stride + i, a.q_type);
    // The cache holds H(k - mu) and H v: q.k = (H q).(H(k - mu)) + q.mu, and the output
    // comes back from V's basis with H (its own inverse).
    std::vector<double> bias(size_t(a.q_heads), 0.0);
    const int64_t group = a.q_heads / d.heads;
    for (int64_t h = 0; h < a.q_heads; ++h) {
      if (const float* mu = format.k_mean_row(d, a.layer, h / group))
        for (int64_t e = 0; e < dim; ++e) bias[size_t(h)] += q[size_t(h * dim + e)] * double(mu[e]);
      rotate_row_f64(k_format, dim, q.data() + h * dim);
    }
    o.score_bias = format.has_k_mean() ? bias.data() : nullptr;
    attend(q.data(), a.q_heads, k.data(), v.data(), len.tokens, d.heads, dim, o, out, lse);
    for (int64_t h = 0; h < a.q_heads; ++h) rotate_row_f64(v_format, dim, out + h * dim);
  }
  return r;
}

}  // namespace nvfp4kv::reference
