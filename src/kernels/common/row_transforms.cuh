#pragma once
// A cache format's transforms on one (token, head) row held in shared memory by one
// warp: the writer's side in float32, bit for bit as the reference writes
// (core/transform.hpp: non-finite inputs to +0, K - mu, divided by lambda, butterflies of span 1, 2, 4, ...,
// one multiplication by hadamard_scale), and the readers' way back in float64 as the
// reference reads (reference/transform.hpp). Every butterfly is one rounding of its own,
// so a stage's butterflies run in parallel over the lanes and still give the sequential
// order's bits; the explicit _rn operations keep the compiler from contracting any two.
#include <cstdint>

#include "nvfp4kv/core/transform.hpp"

namespace nvfp4kv::kernels {

template <typename T>
struct RowArith;
template <>
struct RowArith<float> {
  __device__ static float add(float a, float b) { return __fadd_rn(a, b); }
  __device__ static float sub(float a, float b) { return __fsub_rn(a, b); }
  __device__ static float mul(float a, float b) { return __fmul_rn(a, b); }
  __device__ static float norm(int n) { return hadamard_scale(n); }  // the writer's float32 constant
};
template <>
struct RowArith<double> {
  __device__ static double add(double a, double b) { return __dadd_rn(a, b); }
  __device__ static double sub(double a, double b) { return __dsub_rn(a, b); }
  __device__ static double mul(double a, double b) { return __dmul_rn(a, b); }
  __device__ static double norm(int n) { return __ddiv_rn(1.0, __dsqrt_rn(double(n))); }  // the reference's 1 / sqrt(n)
};

// row (dim values) -> the block-diagonal H_n row / sqrt(n), n a power of two dividing dim;
// the warp's lanes together, every lane of the warp calling.
template <typename T>
__device__ void hadamard_row(T* row, int64_t dim, int n, int lane) {
  using A = RowArith<T>;
  __syncwarp();
  for (int span = 1; span < n; span *= 2) {
    // Pair i: position j (its bit `span` clear) and j + span; 2 span divides n, so no pair
    // crosses a block of n.
    for (int64_t i = lane; i < dim / 2; i += 32) {
      const int64_t j = (i / span) * 2 * span + i % span;
      const T a = row[j], b = row[j + span];
      row[j] = A::add(a, b);
      row[j + span] = A::sub(a, b);
    }
    __syncwarp();
  }
  const T s = A::norm(n);
  for (int64_t e = lane; e < dim; e += 32) row[e] = A::mul(row[e], s);
  __syncwarp();
}

}  // namespace nvfp4kv::kernels
