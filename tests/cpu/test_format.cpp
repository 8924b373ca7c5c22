// Exhaustive tests of the NVFP4 codecs and hand-computed block quantization.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv {
namespace {

constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

TEST(E2M1, DecodesAllSixteenCodes) {
  for (int code = 0; code < 16; ++code) {
    const float expect = (code & 8) ? -kE2M1Magnitudes[code & 7] : kE2M1Magnitudes[code & 7];
    EXPECT_EQ(e2m1_decode(uint8_t(code)), expect) << "code " << code;
    EXPECT_EQ(std::signbit(e2m1_decode(uint8_t(code))), (code & 8) != 0) << "code " << code;
  }
}

TEST(E2M1, EncodesEveryRepresentableValueToItself) {
  for (int code = 0; code < 16; ++code) EXPECT_EQ(e2m1_encode(e2m1_decode(uint8_t(code))), code);
}

TEST(E2M1, EveryMidpointRoundsToTheEvenCode) {
  for (int m = 0; m < 7; ++m) {
    const float mid = 0.5f * (kE2M1Magnitudes[m] + kE2M1Magnitudes[m + 1]);
    const int even = (m % 2 == 0) ? m : m + 1;
    EXPECT_EQ(e2m1_encode(mid), even) << "midpoint " << mid;
    EXPECT_EQ(e2m1_encode(-mid), 8 | even) << "midpoint " << -mid;
    // Just off the midpoint the nearer neighbour wins.
    EXPECT_EQ(e2m1_encode(std::nextafter(mid, 0.0f)), m);
    EXPECT_EQ(e2m1_encode(std::nextafter(mid, 100.0f)), m + 1);
  }
}

TEST(E2M1, TiesListedInTheReferenceDoc) {
  const std::pair<float, float> ties[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                                          {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f}};
  for (auto [in, out] : ties) {
    EXPECT_EQ(e2m1_decode(e2m1_encode(in)), out) << in;
    EXPECT_EQ(e2m1_decode(e2m1_encode(-in)), -out) << -in;
  }
}

// The definition: thresholds at the midpoints, ties to the even code.
uint8_t e2m1_by_thresholds(float x) {
  const float a = std::fabs(x);
  if (std::isnan(x)) return 0;
  const uint8_t m = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5
                  : a <= 5.0f  ? 6 : 7;
  return uint8_t((std::signbit(x) ? 8 : 0) | m);
}

TEST(E2M1, EncoderEqualsTheThresholdDefinition) {
  // Every float with magnitude in [2^-7, 16) (all thresholds lie there), both signs.
  for (uint32_t u = 0x3C000000u; u < 0x41800000u; ++u) {
    const float x = bits_float(u);
    ASSERT_EQ(e2m1_encode(x), e2m1_by_thresholds(x)) << x;
    ASSERT_EQ(e2m1_encode(-x), e2m1_by_thresholds(-x)) << -x;
  }
  // And a sample of everything else: tiny, huge, subnormal, infinities.
  std::mt19937 rng(17);
  for (int i = 0; i < 2000000; ++i) {
    const float x = bits_float(uint32_t(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(e2m1_encode(x), e2m1_by_thresholds(x)) << x;
  }
}

TEST(E2M1, SaturatesAndHandlesSpecials) {
  EXPECT_EQ(e2m1_encode(5.0001f), 7);
  EXPECT_EQ(e2m1_encode(1e30f), 7);
  EXPECT_EQ(e2m1_encode(-1e30f), 15);
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::infinity()), 7);
  EXPECT_EQ(e2m1_encode(-std::numeric_limits<float>::infinity()), 15);
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(e2m1_encode(-0.1f), 8);  // sign kept on values that round to zero
  EXPECT_EQ(e2m1_encode(0.0f), 0);
}

// Independent E4M3 value for a code, built from the definition with ldexp.
float e4m3_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return float((code & 0x80) ? -mag : mag);
}

TEST(E4M3, DecodesAll256Bytes) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(e4m3_decode(uint8_t(code)))) << code;
      continue;
    }
    EXPECT_EQ(e4m3_decode(uint8_t(code)), e4m3_value(code)) << "code " << code;
  }
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_decode(0x08), std::ldexp(1.0f, -6));  // smallest normal
}

TEST(E4M3, EncodesEveryRepresentableValueToItself) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    EXPECT_EQ(e4m3_encode(e4m3_value(code)), code) << "code " << code;
  }
}

TEST(E4M3, EveryMidpointBetweenNeighboursRoundsToEven) {
  for (int code = 0; code < 0x7E; ++code) {  // positive neighbours (code, code + 1)
    const float lo = e4m3_value(code), hi = e4m3_value(code + 1);
    const float mid = 0.5f * (lo + hi);  // exact: both fit in 4 significant bits
    const int even = (code % 2 == 0) ? code : code + 1;
    EXPECT_EQ(e4m3_encode(mid), even) << "between " << lo << " and " << hi;
    EXPECT_EQ(e4m3_encode(-mid), 0x80 | even);
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 0.0f)), code);
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 1e9f)), code + 1);
  }
}

TEST(E4M3, SaturatesAtFiniteMaxAndKeepsNaN) {
  EXPECT_EQ(e4m3_encode(448.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(464.0f), 0x7E);  // the tie above 448 rounds to even 448 anyway
  EXPECT_EQ(e4m3_encode(465.0f), 0x7E);  // satfinite, not NaN
  EXPECT_EQ(e4m3_encode(1e30f), 0x7E);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(e4m3_encode(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -10)), 0x00);         // half the smallest subnormal: tie to 0
  EXPECT_EQ(e4m3_encode(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(e4m3_encode(std::ldexp(15.0f, -10)), 0x08);        // 7.5 * 2^-9 ties up to 2^-6
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -30)), 0x00);
}

TEST(Halves, Bf16AndFp16RoundTripAndRoundToEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_fp16(f), h);
    const float g = bf16_to_float(uint16_t(h));
    if (!std::isnan(g)) {
      EXPECT_EQ(float_to_bf16(g), h);
    }
  }
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie to even
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);
}

// ---- blocks ---------------------------------------------------------------
std::vector<float> dequant(const QuantizedBlock& q, float gs) {
  std::vector<float> out(kBlockSize);
  for (int i = 0; i < kBlockSize; ++i) out[i] = dequantize_element(q.packed[i / 2], i % 2, q.scale, gs);
  return out;
}

TEST(Block, HandComputedStandardBlock) {
  // amax 6 with global scale 1: SF = e4m3(1) = 0x38; values land on the grid.
  float x[16] = {6, -6, 0.5f, 1, 1.5f, 2, 3, 4, 0, -0.5f, 0.25f, 0.75f, 5, 2.5f, -3.5f, 1.25f};
  const QuantizedBlock q = quantize_block(x, 1.0f, ScaleRule::kStandard);
  EXPECT_EQ(q.scale, 0x38);
  const float expect[16] = {6, -6, 0.5f, 1, 1.5f, 2, 3, 4, 0, -0.5f, 0, 1, 4, 2, -4, 1};
  EXPECT_EQ(dequant(q, 1.0f), std::vector<float>(expect, expect + 16));
  EXPECT_EQ(q.packed[0], 0xF7);  // element 0 (+6 = 0x7) low nibble, element 1 (-6 = 0xF) high
  EXPECT_EQ(q.non_finite, 0);
}

TEST(Block, AmaxForcesASubnormalBlockScale) {
  // global scale 1, amax 0.0234375 = 6 * 2^-8 -> SF = 2^-8 = 2 * 2^-9 (code 0x02).
  float x[16] = {};
  x[3] = 0.0234375f;
  x[7] = -0.00390625f;  // 2^-8 = 1 * SF -> code 2 (1.0)
  const QuantizedBlock q = quantize_block(x, 1.0f, ScaleRule::kStandard);
  EXPECT_EQ(q.scale, 0x02);
  const auto d = dequant(q, 1.0f);
  EXPECT_EQ(d[3], 0.0234375f);
  EXPECT_EQ(d[7], -0.00390625f);
}

// A block whose scale is 0 keeps only each input's sign: code 0 for +0 and positive
// inputs, code 8 (-0) for -0 and negative ones (docs/format.md).
TEST(Block, AllZeroBlockHasScaleZero) {
  float x[16] = {};
  x[5] = -0.0f;
  const QuantizedBlock q = quantize_block(x, 0.37f, ScaleRule::kFourOverSix);
  EXPECT_EQ(q.scale, 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.packed[i], i == 2 ? 0x80 : 0x00) << i;  // element 5: high nibble of byte 2
  for (float v : dequant(q, 0.37f)) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(std::signbit(dequant(q, 0.37f)[5]));
  // Values too small for any E4M3 scale behave the same way.
  float tiny[16] = {1e-30f, -1e-30f};
  const QuantizedBlock t = quantize_block(tiny, 1.0f, ScaleRule::kStandard);
  EXPECT_EQ(t.scale, 0);
  EXPECT_EQ(t.packed[0], 0x80);
}

TEST(Block, FourOverSixPicksAmaxOverFourWhenItIsCloser) {
  // Values {4, 3, 1}: with SF = 4/6 (e4m3 -> 0.6875) 3 -> 4.36 -> 4 (x^ 2.75), with SF = 1
  // (amax / 4) everything is exact.
  float x[16] = {4, 3, 1};
  const QuantizedBlock std6 = quantize_block(x, 1.0f, ScaleRule::kStandard);
  const QuantizedBlock alt = quantize_block(x, 1.0f, ScaleRule::kFourOverSix);
  EXPECT_EQ(std6.scale, e4m3_encode(4.0f / 6.0f));
  EXPECT_EQ(alt.scale, 0x38);  // 1.0
  const auto d = dequant(alt, 1.0f);
  EXPECT_EQ(d[0], 4.0f);
  EXPECT_EQ(d[1], 3.0f);
  EXPECT_EQ(d[2], 1.0f);
  // 4over6 keeps SF6 when it is better ({6, .5}: exact with SF6 = 1, while SF4 = 1.5 moves
  // .5 to .75) and on a tie ({6, 3}: exact with both scales).
  float better[16] = {6, 0.5f};
  EXPECT_EQ(quantize_block(better, 1.0f, ScaleRule::kFourOverSix).scale, 0x38);
  float tie[16] = {6, 3};
  EXPECT_EQ(quantize_block(tie, 1.0f, ScaleRule::kFourOverSix).scale, 0x38);
  EXPECT_EQ(e4m3_encode(6.0f / 4.0f), 0x3C);  // the SF4 that lost
}

TEST(Block, NonFiniteInputsAreStoredAsZeroAndCounted) {
  float x[16] = {1, 2, 3};
  x[4] = std::numeric_limits<float>::quiet_NaN();
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = -std::numeric_limits<float>::infinity();
  const QuantizedBlock q = quantize_block(x, 1.0f, ScaleRule::kStandard);
  EXPECT_EQ(q.non_finite, 3);
  EXPECT_EQ(q.scale, e4m3_encode(3.0f / 6.0f));  // amax ignores them
  const auto d = dequant(q, 1.0f);
  EXPECT_EQ(d[4], 0.0f);
  EXPECT_EQ(d[5], 0.0f);
  EXPECT_EQ(d[6], 0.0f);
  EXPECT_EQ(d[2], 3.0f);
}

// Half the distance to the next E2M1 grid point, at magnitude v.
float half_step(float v) { return v < 2.0f ? 0.25f : v < 4.0f ? 0.5f : 1.0f; }

TEST(Block, ReconstructionErrorIsAtMostHalfAStepTimesTheBlockScale) {
  std::mt19937 rng(1234);
  std::student_t_distribution<float> heavy(3.0f);
  std::uniform_real_distribution<float> mag(-8.0f, 8.0f);
  int checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    float x[16];
    const float spread = std::exp2(mag(rng));
    for (float& v : x) v = heavy(rng) * spread;
    const float gs = recommend_global_scale(spread * 20.0f);
    for (ScaleRule rule : {ScaleRule::kStandard, ScaleRule::kFourOverSix}) {
      const QuantizedBlock q = quantize_block(x, gs, rule);
      const float block_scale = e4m3_decode(q.scale) * gs;
      if (q.scale == 0) continue;
      const auto d = dequant(q, gs);
      for (int i = 0; i < 16; ++i) {
        const float v = std::fabs(x[i]) / block_scale;
        if (v > 6.0f) continue;  // out of range: saturated, not covered by the bound
        const float bound = half_step(v) * block_scale * (1.0f + 1e-6f) + 1e-6f * std::fabs(x[i]);
        ASSERT_LE(std::fabs(d[i] - x[i]), bound) << "trial " << trial << " element " << i;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 500000);
}

TEST(GlobalScale, ConventionsConvertToTheDequantMultiplier) {
  EXPECT_EQ(recommend_global_scale(2688.0f), 1.0f);
  EXPECT_EQ(recommend_global_scale(0.0f), 1.0f);
  EXPECT_THROW(recommend_global_scale(std::numeric_limits<float>::infinity()), ArgumentError);
  EXPECT_EQ(global_scale_from_flashinfer(4.0f), 0.25f);
  EXPECT_EQ(global_scale_from_trtllm_orig_quant(8.0f), 0.125f);
  EXPECT_EQ(global_scale_from_trtllm_quant_orig(0.125f), 0.125f);
  EXPECT_EQ(global_scale_from_vllm(0.5f), 0.5f);
  // With the recommended scale the largest block uses the top E4M3 code.
  float x[16] = {};
  x[0] = 100.0f;
  EXPECT_EQ(quantize_block(x, recommend_global_scale(100.0f), ScaleRule::kStandard).scale, 0x7E);
  // amax/448 caps the largest block scale at 448 / 6 = 74.7 -> e4m3 72.
  EXPECT_EQ(e4m3_decode(quantize_block(x, 100.0f / 448.0f, ScaleRule::kStandard).scale), 72.0f);
  EXPECT_THROW(require_valid_global_scale(0.0f, "t"), ArgumentError);
  EXPECT_THROW(require_valid_global_scale(1e-45f, "t"), ArgumentError);
  EXPECT_THROW(require_valid_global_scale(3e-31f, "t"), ArgumentError);  // below 2^-100
  EXPECT_NO_THROW(require_valid_global_scale(kMinGlobalScale, "t"));
  EXPECT_NO_THROW(require_valid_global_scale(kMaxGlobalScale, "t"));
  EXPECT_EQ(recommend_global_scale(1e-35f), kMinGlobalScale);  // clamped into the usable range
}

}  // namespace
}  // namespace nvfp4kv

namespace nvfp4kv {
namespace {

// The GPU's division by 6 in block_scale_code (one multiply and one fused
// correction after clamping to 4096, see scale_quotient) gives the same E4M3 scale code as the
// definition's IEEE division for every non-negative float, infinity included.
TEST(E4M3, FastDivisionBySixGivesTheSameScaleCodeForEveryFloat) {
  uint64_t differing_quotients = 0;
  for (uint64_t u = 0; u <= 0x7F800000u; ++u) {
    const float t = bits_float(uint32_t(u)), clamped = std::fmin(t, 4096.0f);
    const float q = clamped * (1.0f / 6.0f);
    const float fast = std::fma(std::fma(-q, 6.0f, clamped), 1.0f / 6.0f, q);
    const float exact = t / 6.0f;
    if (float_bits(fast) != float_bits(exact)) {
      ++differing_quotients;
      ASSERT_TRUE(t < 0x1p-125f || t > 4096.0f) << "quotients differ at " << t;
    }
    ASSERT_EQ(e4m3_encode_bits(fast), e4m3_encode_bits(exact)) << t;
  }
  // The quotients do differ (below 2^-125): the two computations are not the same one.
  EXPECT_GT(differing_quotients, 0u);
}

}  // namespace
}  // namespace nvfp4kv
