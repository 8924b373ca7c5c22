#include "nvfp4kv/conformance/rounding.hpp"

#include <cmath>
#include <cstring>

namespace nvfp4kv::conformance {
namespace {

constexpr double kTolerance = 1.0 / (1 << 20);  // relative, on every quotient of the fast-math policy

float amax_of(const float* x) {
  float a = 0;
  for (int i = 0; i < kBlockSize; ++i) a = std::fmax(a, std::fabs(x[i]));
  return a;
}

// Quantize with a given scale code and the multiplier that takes x to E2M1 units.
QuantizedBlock with_inverse(const float* x, uint8_t scale, float inv) {
  QuantizedBlock q{};
  q.scale = scale;
  for (int i = 0; i < kBlockSize; i += 2)
    q.packed[i / 2] = uint8_t(e2m1_code(x[i] * inv) | (e2m1_code(x[i + 1] * inv) << 4));
  return q;
}

// The E4M3 codes of every value within kTolerance of t (t >= 0): one, or the
// two neighbours of a rounding boundary inside the interval.
bool e4m3_admits(double t, uint8_t code) {
  const uint8_t lo = e4m3_encode(float(t * (1 - kTolerance))), hi = e4m3_encode(float(t * (1 + kTolerance)));
  return code >= lo && code <= hi;  // positive codes are ordered like their values
}

// Whether E2M1 code c (with sign) is the rounding of a value within kTolerance of y.
bool e2m1_admits(double y, uint8_t c) {
  const double a = std::fabs(y);
  const uint8_t lo = e2m1_counts(float(a * (1 - kTolerance))).sum() & 7u;
  const uint8_t hi = e2m1_counts(float(a * (1 + kTolerance))).sum() & 7u;
  const uint8_t mag = c & 7u;
  if (mag < lo || mag > hi) return false;
  if (mag == 0) return true;  // either sign of a zero
  return bool(c & 8u) == std::signbit(y);
}

}  // namespace

const char* policy_name(RoundingPolicy p) {
  switch (p) {
    case RoundingPolicy::kNvfp4kv: return "nvfp4kv";
    case RoundingPolicy::kReciprocalMultiply: return "reciprocal-multiply";
    default: return "fast-math-division";
  }
}

QuantizedBlock quantize_block_as(RoundingPolicy p, const float* x, float gs) {
  if (p == RoundingPolicy::kNvfp4kv) return quantize_block(x, gs, ScaleRule::kStandard);
  const float amax = amax_of(x);
  if (p == RoundingPolicy::kReciprocalMultiply) {
    const float g = 1.0f / gs;  // what the engine is given: the quant multiplier
    const uint8_t scale = e4m3_encode(g * (amax * (1.0f / 6.0f)));
    const float sf = e4m3_decode(scale);
    return with_inverse(x, scale, sf == 0 ? 0.0f : 1.0f / (sf * (1.0f / g)));
  }
  // A representative of fast-math division: nvfp4kv's scale, and x times the
  // reciprocal one ulp high, as far as an approximate reciprocal may be off.
  const uint8_t scale = block_scale_code(amax, gs, 6.0f);
  const float sf = e4m3_decode(scale);
  return with_inverse(x, scale, sf == 0 ? 0.0f : std::nextafter(1.0f / (sf * gs), 1e30f));
}

bool policy_explains(RoundingPolicy p, const float* x, float gs, uint8_t scale, const uint8_t* packed) {
  if (p != RoundingPolicy::kFastMathDivision) {
    const QuantizedBlock q = quantize_block_as(p, x, gs);
    return q.scale == scale && std::memcmp(q.packed, packed, sizeof q.packed) == 0;
  }
  if (scale & 0x80u || !e4m3_admits(double(amax_of(x)) / double(gs) / 6.0, scale)) return false;
  const double s = double(e4m3_decode(scale)) * double(gs);
  for (int i = 0; i < kBlockSize; ++i) {
    const uint8_t c = (packed[i / 2] >> (4 * (i % 2))) & 15u;
    const double y = s == 0 ? 0.0 * double(x[i]) : double(x[i]) / s;
    if (!e2m1_admits(y, c)) return false;
  }
  return true;
}

std::optional<RoundingPolicy> explaining_policy(const float* x, float gs, uint8_t scale, const uint8_t* packed) {
  for (RoundingPolicy p : {RoundingPolicy::kNvfp4kv, RoundingPolicy::kReciprocalMultiply, RoundingPolicy::kFastMathDivision})
    if (policy_explains(p, x, gs, scale, packed)) return p;
  return std::nullopt;
}

std::optional<RoundingPolicy> data_explaining_policy(const float* x, float gs, const uint8_t* packed) {
  for (RoundingPolicy p : {RoundingPolicy::kNvfp4kv, RoundingPolicy::kReciprocalMultiply, RoundingPolicy::kFastMathDivision})
    if (policy_explains(p, x, gs, quantize_block_as(p, x, gs).scale, packed)) return p;
  return std::nullopt;
}

std::optional<RoundingPolicy> scale_explaining_policy(const float* x, float gs, uint8_t scale) {
  for (RoundingPolicy p : {RoundingPolicy::kNvfp4kv, RoundingPolicy::kReciprocalMultiply})
    if (quantize_block_as(p, x, gs).scale == scale) return p;
  if (!(scale & 0x80u) && e4m3_admits(double(amax_of(x)) / double(gs) / 6.0, scale)) return RoundingPolicy::kFastMathDivision;
  return std::nullopt;
}

}  // namespace nvfp4kv::conformance
