#pragma once
// A cache format's transforms on one (token, head) row, as the reference writer and
// readers apply them: the writer in float32 in the order the format fixes
// (core/transform.hpp), the readers undo them in float64.
#include <cstdint>
#include <string>

#include "nvfp4kv/core/cache_format.hpp"

namespace nvfp4kv::reference {

// The writer's side of the format, in place on D floats of (layer, side, head): non-finite
// inputs become +0 (counted in *non_finite) when a transform follows, then K - mu, then
// (K - mu) / lambda (one float32 division per element), then the rotation. Without a transform the row is left as it is (the block rule handles non-finite
// inputs then).
void transform_row(const CacheFormat& format, const CacheDims& dims, int64_t layer, Side side, int64_t head,
                   float* row, int64_t* non_finite);

// x -> H x / sqrt(n) in float64 for one power-of-two block (its own inverse).
void hadamard_f64(double* x, int64_t n);

// The tensor's block-diagonal rotation applied to a row of D doubles (nothing without one).
// The rotation is symmetric and orthonormal, so this both rotates a query into the stored
// basis and takes stored values back to the original one.
void rotate_row_f64(const TensorFormat& t, int64_t head_dim, double* row);

// Stored values of (layer, side, head) back to original ones, in place: rotation undone,
// then multiplied by lambda and mu added (K only).
void restore_row_f64(const CacheFormat& format, const CacheDims& dims, int64_t layer, Side side, int64_t head,
                     double* row);

}  // namespace nvfp4kv::reference
