// Failure class 3 of the reference doc, measured: V scales written with the
// trtllm-gen 4-token interleave and read as linear. The error metric the tests use
// (relative L2 against the input) tells the two apart by a wide margin.
#include <gtest/gtest.h>

#include <random>

#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "nvfp4kv/reference/quantize.hpp"

namespace nvfp4kv {
namespace {

TEST(Mismatch, SwizzledVScalesReadAsLinearAreGarbage) {
  const DimsOverride dims{1, 8, 16, 4, 128};
  const ValidLayout writer = validate(instantiate(preset_spec("flashinfer-trtllm-gen-hnd"), dims));
  const ValidLayout reader = validate(instantiate(preset_spec("flashinfer-hnd"), dims));
  const int64_t tokens = 8 * 16, row = 4 * 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::lognormal_distribution<float> spread(0.0f, 1.0f);
  std::vector<float> k(size_t(tokens * row)), v(k.size());
  float block_spread = 1.0f;
  for (size_t i = 0; i < k.size(); ++i) {
    if (i % 16 == 0) block_spread = spread(rng);  // Gaussian blocks whose scales differ
    k[i] = n(rng);
    v[i] = n(rng) * block_spread;
  }
  std::vector<int64_t> slots(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) slots[size_t(i)] = i;
  reference::HostCache cache(writer.layout(), 0);
  const float gs = recommend_global_scale(40.0f);
  reference::store(writer, cache.buffers,
                   {.rows = {k.data(), v.data(), tokens, row}, .type = ElementType::kFloat32, .slots = slots.data(),
                    .slots_are_int64 = true, .k_global_scale = &gs, .v_global_scale = &gs});
  std::vector<int32_t> table(8);
  for (int32_t p = 0; p < 8; ++p) table[size_t(p)] = p;
  const auto right = reference::gather_sequence(writer, cache.buffers, table, tokens, 0, gs, gs);
  const auto wrong = reference::gather_sequence(reader, cache.buffers, table, tokens, 0, gs, gs);
  const double ok = reference::error_stats(v, right.v).rel_l2, bad = reference::error_stats(v, wrong.v).rel_l2;
  EXPECT_LT(ok, 0.15);   // normal NVFP4 error
  EXPECT_GT(bad, 0.5);   // the doc reports 0.76-0.79 for this mistake
  EXPECT_EQ(right.k, wrong.k);  // K scales are linear in both: K reads fine either way
  std::printf("V rel-L2: read as written %.3f, swizzled read as linear %.3f\n", ok, bad);
}

}  // namespace
}  // namespace nvfp4kv
