// Our E2M1 encoder against the CUDA toolkit's own definition of the hardware
// conversion cvt.rn.satfinite.e2m1x2.f32 (the host path of
// __nv_cvt_float2_to_fp4x2 in cuda_fp4.hpp, which sm_90 device code also
// runs). The sm_100a/sm_120a store uses that instruction (packed_block.hpp), so
// this pins its semantics here: the rounding, the kept sign of zeros, the
// saturation, and which input lands in which nibble. Built when the CUDA
// toolkit's headers are found; the instruction itself runs only on Blackwell.
#include <cuda_fp4.h>
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "nvfp4kv/core/format.hpp"

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

}  // namespace
}  // namespace nvfp4kv
