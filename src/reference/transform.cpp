#include "nvfp4kv/reference/transform.hpp"

#include <cmath>

#include "nvfp4kv/core/transform.hpp"

namespace nvfp4kv::reference {

void transform_row(const CacheFormat& f, const CacheDims& d, int64_t layer, Side side, int64_t head, float* row,
                   int64_t* non_finite) {
  const TensorFormat t = f.layer(layer).side(side);
  const float* mu = side == Side::kK ? f.k_mean_row(d, layer, head) : nullptr;
  const float* lambda = side == Side::kK ? f.k_channel_scale_row(d, layer, head) : nullptr;
  if (!mu && !lambda && t.rotation == kNoRotation) return;
  for (int64_t e = 0; e < d.head_dim; ++e)
    if (!fp8_input_finite(row[e])) {  // a NaN rotated would spread over its whole block
      row[e] = 0.0f;
      ++*non_finite;
    }
  if (mu)
    for (int64_t e = 0; e < d.head_dim; ++e) row[e] = row[e] - mu[e];
  if (lambda)
    for (int64_t e = 0; e < d.head_dim; ++e) row[e] = row[e] / lambda[e];
  if (const int64_t n = rotation_block(t.rotation, d.head_dim); n > 0)
    for (int64_t b = 0; b < d.head_dim; b += n) hadamard_rotate(row + b, n);
}

void hadamard_f64(double* x, int64_t n) {
  hadamard_butterflies(x, n);
  const double s = 1.0 / std::sqrt(double(n));
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

void rotate_row_f64(const TensorFormat& t, int64_t head_dim, double* row) {
  if (const int64_t n = rotation_block(t.rotation, head_dim); n > 0)
    for (int64_t b = 0; b < head_dim; b += n) hadamard_f64(row + b, n);
}

void restore_row_f64(const CacheFormat& f, const CacheDims& d, int64_t layer, Side side, int64_t head,
                     double* row) {
  rotate_row_f64(f.layer(layer).side(side), d.head_dim, row);
  if (const float* lambda = side == Side::kK ? f.k_channel_scale_row(d, layer, head) : nullptr)
    for (int64_t e = 0; e < d.head_dim; ++e) row[e] *= double(lambda[e]);
  if (const float* mu = side == Side::kK ? f.k_mean_row(d, layer, head) : nullptr)
    for (int64_t e = 0; e < d.head_dim; ++e) row[e] += double(mu[e]);
}

}  // namespace nvfp4kv::reference
