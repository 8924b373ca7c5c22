// Our codecs against the CUDA toolkit's own definitions of the conversion
// instructions the kernels use instead of them (the host paths of cuda_fp4.hpp
// and cuda_fp8.hpp, which emulate the instructions bit for bit):
//  - cvt.rn.satfinite.e2m1x2.f32 (sm_100a/sm_120a store, packed_block.hpp): the
//    rounding, the kept sign of zeros, the saturation, and which input lands in
//    which nibble. No Blackwell GPU is lent here, so this is its only check;
//  - cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2 (sm_89 and newer, block
//    scales, format.hpp), which tests/gpu also checks on the GPU itself.
// Built when the CUDA toolkit's headers are found.
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv {
namespace {

uint8_t toolkit_pair(float low, float high) {
  return uint8_t(__nv_cvt_float2_to_fp4x2(make_float2(low, high), __NV_E2M1, cudaRoundNearest));
}

TEST(ToolkitFp4, EncoderEqualsTheToolkitsConversion) {
  // Every float with magnitude in [2^-7, 16) (all thresholds lie there), both
  // signs, paired with a differently signed neighbour so the nibbles differ.
  for (uint32_t u = 0x3C000000u; u < 0x41800000u; u += 1) {
    const float x = bits_float(u), y = -bits_float(u ^ 0x00400000u);
    ASSERT_EQ(toolkit_pair(x, y), uint8_t(e2m1_code(x) | e2m1_code(y) << 4)) << x << " " << y;
    ASSERT_EQ(toolkit_pair(y, x), uint8_t(e2m1_code(y) | e2m1_code(x) << 4)) << y << " " << x;
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 1000000; ++i) {
    const float x = bits_float(uint32_t(rng())), y = bits_float(uint32_t(rng()));
    if (x != x || y != y) continue;  // NaN: the block rule never converts one
    ASSERT_EQ(toolkit_pair(x, y), uint8_t(e2m1_code(x) | e2m1_code(y) << 4)) << x << " " << y;
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(toolkit_pair(inf, -inf), 0xF7);
  EXPECT_EQ(toolkit_pair(-0.0f, 0.0f), 0x08);
}

uint8_t toolkit_e4m3(float x) { return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }

TEST(ToolkitFp8, E4M3EncoderEqualsTheToolkitsConversion) {
  // Every float with magnitude in [2^-12, 2^10): below half the smallest
  // subnormal, through the subnormal and normal grids, past 448's saturation.
  for (uint32_t u = 0x39800000u; u < 0x44800000u; ++u) {
    const float x = bits_float(u);
    ASSERT_EQ(e4m3_encode_bits(x), toolkit_e4m3(x)) << x;
    ASSERT_EQ(e4m3_encode_bits(-x), toolkit_e4m3(-x)) << -x;
  }
  std::mt19937 rng(6);
  for (int i = 0; i < 1000000; ++i) {
    const float x = bits_float(uint32_t(rng()));
    if (x != x) continue;
    ASSERT_EQ(e4m3_encode_bits(x), toolkit_e4m3(x)) << x;
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(toolkit_e4m3(inf), 0x7E);
  EXPECT_EQ(toolkit_e4m3(-inf), 0xFE);
  EXPECT_EQ(toolkit_e4m3(0.0f), 0x00);
  EXPECT_EQ(toolkit_e4m3(-0.0f), 0x80);
  // NaN: both give a NaN code (the block rule never encodes one).
  EXPECT_EQ(toolkit_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
}

TEST(ToolkitFp8, E4M3DecoderEqualsTheToolkitsConversion) {
  for (int code = 0; code < 256; ++code) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code), __NV_E4M3);
    const float want = fp16_to_float(h.x);
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(want != want && e4m3_decode_bits(uint8_t(code)) != e4m3_decode_bits(uint8_t(code))) << code;
      continue;
    }
    EXPECT_EQ(float_bits(e4m3_decode_bits(uint8_t(code))), float_bits(want)) << code;
  }
}

}  // namespace
}  // namespace nvfp4kv
