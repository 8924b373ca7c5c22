#include <gtest/gtest.h>

#include <random>

#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/quantize.hpp"

namespace nvfp4kv::reference {
namespace {

TEST(Reference, QuantizeMatchesBlockwiseAndDtypesAgree) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 3.0f);
  const DenseShape shape{7, 3, 64};
  std::vector<float> f(size_t(shape.elements()));
  for (float& v : f) v = n(rng);
  std::vector<uint16_t> b(f.size()), h(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    b[i] = float_to_bf16(f[i]);
    h[i] = float_to_fp16(bf16_to_float(b[i]));  // bf16 values with <= 8 bits fit fp16 exactly here
    f[i] = bf16_to_float(b[i]);
  }
  const float gs = recommend_global_scale(12.0f);
  const auto qf = quantize(f.data(), ElementType::kFloat32, shape, gs, ScaleRule::kStandard);
  const auto qb = quantize(b.data(), ElementType::kBFloat16, shape, gs, ScaleRule::kStandard);
  const auto qh = quantize(h.data(), ElementType::kFloat16, shape, gs, ScaleRule::kStandard);
  EXPECT_EQ(qf.data, qb.data);
  EXPECT_EQ(qf.scales, qb.scales);
  EXPECT_EQ(qf.data, qh.data);
  ASSERT_EQ(qf.data.size(), size_t(7 * 3 * 32));
  ASSERT_EQ(qf.scales.size(), size_t(7 * 3 * 4));
  // Block b of the tensor is quantize_block of elements [16b, 16b + 16).
  for (int64_t blk = 0; blk < int64_t(qf.scales.size()); ++blk) {
    const QuantizedBlock q = quantize_block(&f[size_t(blk * 16)], gs, ScaleRule::kStandard);
    ASSERT_EQ(q.scale, qf.scales[size_t(blk)]);
    for (int i = 0; i < 8; ++i) ASSERT_EQ(q.packed[i], qf.data[size_t(blk * 8 + i)]);
  }
  const auto back = dequantize(qf, gs);
  const auto err = error_stats(f, back);
  EXPECT_GT(err.rel_l2, 0.05);  // normal NVFP4 error on Gaussian data is about 0.1
  EXPECT_LT(err.rel_l2, 0.15);
}

TEST(Reference, RejectsBadShapesAndScales) {
  float x[32] = {};
  EXPECT_THROW(quantize(x, ElementType::kFloat32, {1, 1, 24}, 1.0f, ScaleRule::kStandard), ArgumentError);
  EXPECT_THROW(quantize(x, ElementType::kFloat32, {1, 1, 16}, 0.0f, ScaleRule::kStandard), ArgumentError);
  EXPECT_THROW(quantize(x, ElementType::kFloat32, {1, 1, 16}, -1.0f, ScaleRule::kStandard), ArgumentError);
}

TEST(Reference, CountsNonFiniteInputs) {
  std::vector<float> x(32, 6.0f);  // amax 6 with global scale 1: block scale 1, exact
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[20] = -std::numeric_limits<float>::infinity();
  const auto q = quantize(x.data(), ElementType::kFloat32, {1, 2, 16}, 1.0f, ScaleRule::kStandard);
  EXPECT_EQ(q.non_finite, 2);
  const auto back = dequantize(q, 1.0f);
  EXPECT_EQ(back[3], 0.0f);
  EXPECT_EQ(back[20], 0.0f);
  EXPECT_EQ(back[4], 6.0f);
}

}  // namespace
}  // namespace nvfp4kv::reference
