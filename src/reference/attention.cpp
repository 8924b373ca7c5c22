#include "nvfp4kv/reference/attention.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nvfp4kv/reference/cache.hpp"
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

namespace {

// One sequence's tokens [first, length) dequantized to fp64 (length, kv heads, D)
// (tokens before first stay 0), reading only its block table's entries that hold
// them; a bad entry is counted (its tokens) and makes the result unusable.
struct SequenceKv {
  std::vector<double> k, v;
  bool bad_page = false;
};

SequenceKv sequence_kv(const Layout& l, const CacheBuffers& buffers, const BatchDescriptor& batch, int64_t s,
                       int64_t layer, int64_t first, int64_t length, float kgs, float vgs, DeviceStatus* status) {
  const CacheDims& d = l.dims;
  const int64_t dim = d.head_dim, row = d.heads * dim;
  SequenceKv r;
  r.k.assign(size_t(std::max<int64_t>(length, 1) * row), 0.0);
  r.v.assign(r.k.size(), 0.0);
  for (int64_t e0 = first / d.tokens_per_page; e0 * d.tokens_per_page < length; ++e0) {
    const int64_t page = page_of(batch, s, e0, d.pages);
    const int64_t tokens = std::min(d.tokens_per_page, length - e0 * d.tokens_per_page);
    if (page < 0) {
      if (status) status->bad_pages += (unsigned long long)tokens;
      r.bad_page = true;
      continue;
    }
    for (int64_t t = 0; t < tokens; ++t)
      for (Side side : {Side::kK, Side::kV}) {
        std::vector<double>& dst = side == Side::kK ? r.k : r.v;
        for (int64_t h = 0; h < d.heads; ++h)
          read_row(l, buffers, side, {layer, page, t, h, 0}, side == Side::kK ? kgs : vgs,
                   dst.data() + (e0 * d.tokens_per_page + t) * row + h * dim);
      }
  }
  return r;
}

// One query row (q_heads, D), element `at` of q on, against the first `tokens`
// tokens of kv as the cache holds them (layer `layer` of `format`); NaN everywhere
// when the sequence is poisoned. The cache holds H((k - mu) / lambda) and H v: so
// q.k = (H (lambda q)).(H((k - mu) / lambda)) + q.mu, and the output comes back from V's
// basis with H (its own inverse).
void attend_row(const void* q, ElementType type, int64_t at, int64_t q_heads, const SequenceKv& kv, int64_t tokens,
                const CacheDims& d, const CacheFormat& format, int64_t layer, AttentionOptions o, bool poisoned,
                double* out, double* lse) {
  const int64_t dim = d.head_dim;
  if (poisoned) {
    std::fill(out, out + q_heads * dim, std::numeric_limits<double>::quiet_NaN());
    std::fill(lse, lse + q_heads, std::numeric_limits<double>::quiet_NaN());
    return;
  }
  std::vector<double> row(static_cast<size_t>(q_heads * dim));
  for (size_t i = 0; i < row.size(); ++i) row[i] = element_to_float(q, at + int64_t(i), type);
  const TensorFormat k_format = format.layer(layer).k, v_format = format.layer(layer).v;
  std::vector<double> bias(size_t(q_heads), 0.0);
  const int64_t group = q_heads / d.heads;
  for (int64_t h = 0; h < q_heads; ++h) {
    if (const float* mu = format.k_mean_row(d, layer, h / group))
      for (int64_t e = 0; e < dim; ++e) bias[size_t(h)] += row[size_t(h * dim + e)] * double(mu[e]);
    if (const float* lambda = format.k_channel_scale_row(d, layer, h / group))
      for (int64_t e = 0; e < dim; ++e) row[size_t(h * dim + e)] *= double(lambda[e]);
    rotate_row_f64(k_format, dim, row.data() + h * dim);
  }
  o.score_bias = format.has_k_mean() ? bias.data() : nullptr;
  attend(row.data(), q_heads, kv.k.data(), kv.v.data(), tokens, d.heads, dim, o, out, lse);
  for (int64_t h = 0; h < q_heads; ++h) rotate_row_f64(v_format, dim, out + h * dim);
}

struct GlobalScales {
  float k, v;
  bool ok;
};
GlobalScales global_scales(const float* k, const float* v) {
  return {*k, *v, global_scale_usable(*k) && global_scale_usable(*v)};
}

bool reference_type(ElementType t) {
  return t == ElementType::kBFloat16 || t == ElementType::kFloat16 || t == ElementType::kFloat32;
}

}  // namespace

DecodeResult decode_attention(const ValidLayout& valid, const CacheBuffers& buffers, const DecodeArgs& a) {
  if (std::string p = decode_problem(valid, buffers, a); !p.empty())
    throw ArgumentError("reference::decode_attention: " + p);
  if (!reference_type(a.q_type)) throw ArgumentError("reference::decode_attention: unsupported query type");
  const CacheDims& d = valid.layout().dims;
  const int64_t q_stride = a.q_token_stride ? a.q_token_stride : a.q_heads * d.head_dim;
  DecodeResult r;
  r.out.assign(size_t(a.batch.batch * a.q_heads * d.head_dim), 0.0);
  r.lse.assign(size_t(a.batch.batch * a.q_heads), 0.0);
  const GlobalScales gs = global_scales(a.k_global_scale, a.v_global_scale);
  for (int64_t s = 0; s < a.batch.batch; ++s) {
    const SequenceLength len = sequence_length(a.batch, s, d.tokens_per_page);
    if (a.status && len.bad) a.status->bad_lengths += 1;
    if (a.status && !gs.ok) a.status->bad_global_scale += (unsigned long long)len.tokens;
    bool poisoned = len.bad || !gs.ok;
    const int64_t first = a.window > 0 ? std::max<int64_t>(0, len.tokens - a.window) : 0;
    SequenceKv kv;
    if (!poisoned) {
      kv = sequence_kv(valid.layout(), buffers, a.batch, s, a.layer, first, len.tokens, gs.k, gs.v, a.status);
      poisoned = kv.bad_page;
    }
    attend_row(a.q, a.q_type, s * q_stride, a.q_heads, kv, len.tokens, d, valid.format(), a.layer,
               {a.softmax_scale, a.window, a.softcap, a.sinks}, poisoned, r.out.data() + s * a.q_heads * d.head_dim,
               r.lse.data() + s * a.q_heads);
  }
  return r;
}

PrefillResult prefill_attention(const ValidLayout& valid, const CacheBuffers& buffers, const PrefillArgs& a) {
  if (std::string p = prefill_problem(valid, buffers, a); !p.empty())
    throw ArgumentError("reference::prefill_attention: " + p);
  if (!reference_type(a.q_type)) throw ArgumentError("reference::prefill_attention: unsupported query type");
  const CacheDims& d = valid.layout().dims;
  const int64_t q_stride = a.q_token_stride ? a.q_token_stride : a.q_heads * d.head_dim;
  int64_t rows = 0;
  for (int64_t s = 0; s <= a.batch.batch && a.batch.batch > 0; ++s) rows = std::max<int64_t>(rows, a.cu_seqlens_q[s]);
  PrefillResult r;
  r.out.assign(size_t(rows * a.q_heads * d.head_dim), 0.0);
  r.lse.assign(size_t(rows * a.q_heads), 0.0);
  const GlobalScales gs = global_scales(a.k_global_scale, a.v_global_scale);
  for (int64_t s = 0; s < a.batch.batch; ++s) {
    const SequenceLength len = sequence_length(a.batch, s, d.tokens_per_page);
    const int64_t q_len = a.raw_q_length(s);
    const bool bad_q = q_len < 0 || q_len > a.max_q_len || (!len.bad && q_len > len.tokens);
    if (a.status && (len.bad || bad_q)) a.status->bad_lengths += 1;
    if (q_len <= 0) continue;  // nothing to compute, nothing read
    if (a.status && !gs.ok) a.status->bad_global_scale += (unsigned long long)len.tokens;
    bool poisoned = len.bad || bad_q || !gs.ok;
    SequenceKv kv;
    if (!poisoned) {
      kv = sequence_kv(valid.layout(), buffers, a.batch, s, a.layer, prefill_first_token(q_len, len.tokens, a.window),
                       len.tokens, gs.k, gs.v, a.status);
      poisoned = kv.bad_page;
    }
    // Query i at position p = kv_len - q_len + i: the sequence's first p + 1
    // tokens (attend's window counts back from the last of them).
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t row = a.cu_seqlens_q[s] + i;
      attend_row(a.q, a.q_type, row * q_stride, a.q_heads, kv, len.tokens - q_len + i + 1, d, valid.format(), a.layer,
                 {a.softmax_scale, a.window, a.softcap, a.sinks}, poisoned, r.out.data() + row * a.q_heads * d.head_dim,
                 r.lse.data() + row * a.q_heads);
    }
  }
  return r;
}

}  // namespace nvfp4kv::reference
