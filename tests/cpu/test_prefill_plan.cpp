// The prefill planner and the mixed-batch routing on the CPU.
#include <gtest/gtest.h>

#include <map>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/prefill_plan.hpp"

namespace nvfp4kv {
namespace {

using namespace prefill_limits;
constexpr int kH200Smem = 232448;

const ValidLayout& layout(int64_t dim, int64_t heads) {
  static std::map<std::pair<int64_t, int64_t>, ValidLayout> made;
  auto it = made.find({dim, heads});
  if (it == made.end())
    it = made.emplace(std::pair{dim, heads}, validate(instantiate(preset_spec("nvfp4kv-native"), {1, 64, 16, heads, dim})))
             .first;
  return it->second;
}

PrefillGeometry plan(int64_t dim, int64_t heads, int64_t q_heads, int64_t max_q_len, std::string* why = nullptr,
                     int smem = kH200Smem) {
  const ValidLayout& v = layout(dim, heads);
  PrefillArgs a;
  a.q_heads = q_heads;
  a.max_q_len = max_q_len;
  PrefillGeometry g;
  const std::string p = plan_prefill_geometry(v.view(), a, smem, &g);
  if (why) *why = p;
  else EXPECT_EQ(p, "");
  return g;
}

TEST(PrefillPlan, TilesCoverEveryQueryRowWithTheGroupSharingEachTile) {
  for (int64_t dim : {16, 48, 64, 96, 128, 160, 256})
    for (int64_t group = 1; group <= 16; ++group)
      for (int64_t q_len : {0, 1, 2, 63, 64, 65, 4096, 100000}) {
        const PrefillGeometry g = plan(dim, 2, 2 * group, q_len);
        SCOPED_TRACE("D " + std::to_string(dim) + " group " + std::to_string(group) + " q " + std::to_string(q_len));
        EXPECT_EQ(g.head_dim, dim <= 64 ? 64 : dim <= 128 ? 128 : 256);
        EXPECT_EQ(g.group, group);
        EXPECT_LE(g.tokens_per_tile * group, kRows);
        EXPECT_GT((g.tokens_per_tile + 1) * group, kRows);  // no room for one more token
        EXPECT_GE(g.q_tiles * g.tokens_per_tile, q_len);
        EXPECT_LT((g.q_tiles - 1) * g.tokens_per_tile, std::max<int64_t>(q_len, 1));  // no empty tile
        EXPECT_EQ(g.smem_bytes, int(prefill_smem_bytes(g.head_dim, g.kv_tile, g.stages)));
        EXPECT_LE(g.smem_bytes, kH200Smem);
        EXPECT_GE(g.stages, kMinStages);
        EXPECT_LE(g.stages, kMaxStages);
        if (g.stages < kMaxStages)  // as many stages as fit
          EXPECT_GT(prefill_smem_bytes(g.head_dim, g.kv_tile, g.stages + 1), size_t(kH200Smem));
      }
}

TEST(PrefillPlan, RefusesWhatTheKernelCannotRun) {
  std::string why;
  plan(320, 1, 1, 10, &why);
  EXPECT_NE(why.find("head dims up to 256"), std::string::npos) << why;
  plan(128, 2, 3, 10, &why);
  EXPECT_NE(why.find("multiple"), std::string::npos) << why;
  plan(128, 1, 17, 10, &why);
  EXPECT_NE(why.find("at most 16"), std::string::npos) << why;
  plan(256, 1, 8, 10, &why, 48 * 1024);
  EXPECT_NE(why.find("shared memory"), std::string::npos) << why;
  // With less room the ring shrinks, down to one stage: D 64 in the default 48 KB, D 128 in
  // the 99 KB a block of compute capability 12.0 may have (one stage: 70 KB).
  PrefillGeometry g = plan(64, 1, 8, 10, &why, 48 * 1024);
  EXPECT_EQ(why, "");
  EXPECT_EQ(g.stages, 1);
  g = plan(128, 1, 8, 10, &why, 101376);
  EXPECT_EQ(why, "");
  EXPECT_EQ(g.stages, 1);
  EXPECT_LE(g.smem_bytes, 101376);
  plan(128, 1, 8, 10, &why, 64 * 1024);
  EXPECT_NE(why.find("shared memory"), std::string::npos) << why;
  g = plan(64, 1, 8, 10, &why);
  EXPECT_EQ(g.stages, kMaxStages);
}

TEST(PrefillPlan, MixedBatchesSplitIntoRunsOfOneRoute) {
  const int32_t q[] = {1, 1, 5, 0, 1, 3, 2, 4, 1};
  std::vector<AttentionRun> runs;
  const auto expect = [&](size_t i, int64_t first, int64_t count, AttentionRoute route, int64_t row, int64_t max_q) {
    ASSERT_LT(i, runs.size());
    EXPECT_EQ(runs[i].first, first) << i;
    EXPECT_EQ(runs[i].count, count) << i;
    EXPECT_EQ(attention_route_name(runs[i].route), std::string(attention_route_name(route))) << i;
    EXPECT_EQ(runs[i].first_row, row) << i;
    EXPECT_EQ(runs[i].max_q_len, max_q) << i;
  };
  using R = AttentionRoute;
  // Group 4: q length 2-4 fit 16 rows (short-query); 5 does not; 0 goes to prefill.
  ASSERT_EQ(plan_mixed_runs(q, 9, 4, &runs), "");
  ASSERT_EQ(runs.size(), 5u);
  expect(0, 0, 2, R::kDecode, 0, 1);
  expect(1, 2, 2, R::kPrefill, 2, 5);
  expect(2, 4, 1, R::kDecode, 7, 1);
  expect(3, 5, 3, R::kShortQuery, 8, 4);
  expect(4, 8, 1, R::kDecode, 17, 1);
  // Group 16: no q length above 1 fits; group 1: up to 16 do.
  ASSERT_EQ(plan_mixed_runs(q, 9, 16, &runs), "");
  ASSERT_EQ(runs.size(), 5u);
  expect(3, 5, 3, R::kPrefill, 8, 4);
  ASSERT_EQ(plan_mixed_runs(q, 9, 1, &runs), "");
  ASSERT_EQ(runs.size(), 6u);
  expect(1, 2, 1, R::kShortQuery, 2, 5);
  expect(2, 3, 1, R::kPrefill, 7, 0);
  expect(4, 5, 3, R::kShortQuery, 8, 4);
  EXPECT_EQ(attention_route(16, 1), R::kShortQuery);
  EXPECT_EQ(attention_route(17, 1), R::kPrefill);
  EXPECT_EQ(attention_route(8, 2), R::kShortQuery);
  EXPECT_EQ(attention_route(9, 2), R::kPrefill);
  ASSERT_EQ(plan_mixed_runs(q, 0, 4, &runs), "");
  EXPECT_TRUE(runs.empty());
  const int32_t bad[] = {1, -2};
  EXPECT_NE(plan_mixed_runs(bad, 2, 4, &runs).find("negative"), std::string::npos);
  EXPECT_NE(plan_mixed_runs(nullptr, 2, 4, &runs).find("required"), std::string::npos);
  EXPECT_NE(plan_mixed_runs(q, 2, 17, &runs).find("group"), std::string::npos);
}

}  // namespace
}  // namespace nvfp4kv
