// The store kernel's fast path (core/packed_block.hpp) against quantize_block on
// the widened floats: the same scale byte and the same 8 data bytes for every
// block, over inputs built to hit every rounding case.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "nvfp4kv/core/packed_block.hpp"

namespace nvfp4kv {
namespace {

template <ElementType kType>
uint16_t to_bits(float x) {
  return kType == ElementType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x);
}

template <ElementType kType>
float from_bits(uint16_t b) {
  return kType == ElementType::kBFloat16 ? bf16_to_float(b) : fp16_to_float(b);
}

// One block of 16 input elements in one of several shapes.
template <ElementType kType>
void make_block(std::mt19937& rng, int shape, uint16_t (&e)[16]) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  const float mag = std::ldexp(1.0f, std::uniform_int_distribution<int>(-12, 12)(rng));
  for (int i = 0; i < 16; ++i) {
    float x = normal(rng) * mag;
    if (shape == 1) x = float(pick(rng) - 8) * 0.25f * mag;  // multiples of a quarter step: many exact ties
    if (shape == 2) x = (i % 3 == 0) ? 0.0f : (i % 3 == 1 ? -0.0f : x * 1e-3f);  // zeros, -0, tiny
    if (shape == 3) x = i == 0 ? 6.0f * mag : normal(rng) * mag * 1e-3f;  // one outlier
    e[i] = to_bits<kType>(x);
  }
  if (shape == 4)  // raw random patterns, non-finite ones replaced
    for (auto& b : e) {
      b = uint16_t(rng());
      if (!std::isfinite(from_bits<kType>(b))) b &= 0x8000u;
    }
}

template <ElementType kType>
void check_against_reference(uint32_t seed) {
  std::mt19937 rng(seed);
  const float global_scales[] = {1.0f, 1.0f / 2688.0f, 0.37f, 3.0e-6f, 7.5e4f, kMinGlobalScale, kMaxGlobalScale};
  int checked = 0;
  for (const float gs : global_scales) {
    for (int n = 0; n < 20000; ++n) {
      uint16_t e[16];
      make_block<kType>(rng, n % 5, e);
      uint32_t w[8];
      float x[16];
      for (int i = 0; i < 8; ++i) w[i] = uint32_t(e[2 * i]) | uint32_t(e[2 * i + 1]) << 16;
      for (int i = 0; i < 16; ++i) x[i] = from_bits<kType>(e[i]);
      const uint32_t amax = packed_amax<kType>(w);
      ASSERT_LT(amax, non_finite_floor<kType>());
      const QuantizedBlock want = quantize_block(x, gs, ScaleRule::kStandard);
      const PackedBlock got = quantize_finite_block<kType>(w, amax, gs);
      ASSERT_EQ(got.scale, want.scale) << "gs " << gs << " block " << n;
      for (int j = 0; j < 8; ++j)
        ASSERT_EQ(uint8_t(got.data[j / 4] >> (8 * (j % 4))), want.packed[j]) << "gs " << gs << " block " << n << " byte " << j;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7 * 20000);
}

TEST(PackedBlock, Bf16MatchesQuantizeBlock) { check_against_reference<ElementType::kBFloat16>(1); }
TEST(PackedBlock, Fp16MatchesQuantizeBlock) { check_against_reference<ElementType::kFloat16>(2); }

TEST(PackedBlock, AmaxRevealsNonFiniteElements) {
  const uint16_t bf16_specials[] = {0x7F80u, 0xFF80u, 0x7FC0u, 0xFFC1u, 0x7F81u};
  const uint16_t fp16_specials[] = {0x7C00u, 0xFC00u, 0x7E00u, 0xFE01u, 0x7C01u};
  for (int pos = 0; pos < 16; ++pos) {
    for (int k = 0; k < 5; ++k) {
      uint32_t wb[8], wh[8];
      for (int i = 0; i < 8; ++i) wb[i] = 0x3F80BF80u, wh[i] = 0x3C00BC00u;  // +-1.0
      const int shift = 16 * (pos % 2);
      wb[pos / 2] = (wb[pos / 2] & ~(0xFFFFu << shift)) | uint32_t(bf16_specials[k]) << shift;
      wh[pos / 2] = (wh[pos / 2] & ~(0xFFFFu << shift)) | uint32_t(fp16_specials[k]) << shift;
      EXPECT_GE(packed_amax<ElementType::kBFloat16>(wb), non_finite_floor<ElementType::kBFloat16>()) << pos << " " << k;
      EXPECT_GE(packed_amax<ElementType::kFloat16>(wh), non_finite_floor<ElementType::kFloat16>()) << pos << " " << k;
    }
  }
  // The largest finite magnitudes stay below the floor, and amax is the magnitude.
  const uint32_t wmax[8] = {0xFF7F0000u, 0, 0, 0, 0, 0, 0, 0x00017F7Fu};
  EXPECT_EQ(packed_amax<ElementType::kBFloat16>(wmax), 0x7F7Fu);
}

// The gather's table decode against dequantize_element rounded to the output
// type, for every non-NaN scale byte, all 16 codes in every position.
template <ElementType kOut>
void check_decode(uint32_t seed) {
  std::mt19937 rng(seed);
  const float global_scales[] = {1.0f, 1.0f / 2688.0f, 0.37f, 3.0e-6f, 7.5e4f, kMinGlobalScale, kMaxGlobalScale};
  const auto round = [](float x) { return kOut == ElementType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x); };
  int words = 0;
  for (const float gs : global_scales)
    for (int scale = 0; scale < 256; ++scale) {
      if ((scale & 0x7F) == 0x7F) continue;  // E4M3 NaN: never written by the store
      const DecodeTable t = decode_table<kOut>(uint8_t(scale), gs);
      for (int n = 0; n < 8; ++n) {
        // n < 2: the codes 0-7 and 8-15 in order; then random words.
        const uint32_t d = n == 0 ? 0x76543210u : n == 1 ? 0xFEDCBA98u : uint32_t(rng());
        uint32_t out[4];
        decode_eight(t, d, out);
        for (int i = 0; i < 8; ++i) {
          const uint16_t want = round(dequantize_element(uint8_t(d >> (8 * (i / 2))), i % 2, uint8_t(scale), gs));
          ASSERT_EQ(uint16_t(out[i / 2] >> (16 * (i % 2))), want)
              << "scale " << scale << " gs " << gs << " word " << std::hex << d << " element " << i;
        }
        ++words;
      }
    }
  EXPECT_EQ(words, 7 * 254 * 8);
}

TEST(PackedBlock, DecodeTableMatchesDequantizeBf16) { check_decode<ElementType::kBFloat16>(3); }
TEST(PackedBlock, DecodeTableMatchesDequantizeFp16) { check_decode<ElementType::kFloat16>(4); }

TEST(PackedBlock, BytePermMatchesPrmt) {
  // Spot values of PTX prmt's default mode.
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x3210u), 0x33221100u);
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x7654u), 0x77665544u);
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x5173u), 0x55117733u);
  // Replicate mode: the selected byte's top bit fills the byte.
  EXPECT_EQ(byte_perm(0x00800000u, 0x7F000000u, 0x8F2Au), 0x000080FFu);
}

}  // namespace
}  // namespace nvfp4kv
