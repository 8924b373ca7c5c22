#include <gtest/gtest.h>

#include "nvfp4kv/core/plan.hpp"

namespace nvfp4kv {
namespace {

std::string plan_error(const PlanRequest& q) {
  try {
    plan(q);
  } catch (const LayoutError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Plan, Llama8BOnOneRank) {
  PlanRequest q;
  q.layers = 32;
  q.kv_heads = 8;
  q.head_dim = 128;
  q.tokens_per_page = 16;
  q.memory_bytes = int64_t(40) << 30;
  const Plan p = plan(q);
  EXPECT_EQ(p.heads_per_rank, 8);
  EXPECT_EQ(p.bytes_per_page_per_layer, 8 * 2 * 16 * 72);  // no padding needed: 1024 + 128 per side
  EXPECT_EQ(p.bytes_per_page, 32 * 8 * 2 * 16 * 72);
  EXPECT_EQ(p.layout.layout().dims.pages, (int64_t(40) << 30) / p.bytes_per_page);
  EXPECT_EQ(p.token_capacity, p.layout.layout().dims.pages * 16);
  EXPECT_LE(p.total_bytes, int64_t(40) << 30);
  EXPECT_TRUE(p.layout.report().ok);
  EXPECT_EQ(p.layout.report().access[0].vector_bytes, 16);
}

TEST(Plan, TensorParallelSplitsAndReplicatesHeads) {
  PlanRequest q{32, 8, 128, 16, std::nullopt, 1000, 4, 3};
  Plan p = plan(q);
  EXPECT_EQ(p.heads_per_rank, 2);
  EXPECT_EQ(p.first_head, 6);
  q.tp_size = 16;
  q.tp_rank = 5;
  p = plan(q);
  EXPECT_EQ(p.heads_per_rank, 1);
  EXPECT_EQ(p.first_head, 2);
}

TEST(Plan, PadsPlanesTo16Bytes) {
  const Plan p = plan({1, 1, 80, 3, std::nullopt, 10});  // D 80, N 3: data plane 120 -> 128, scales 15 -> 16
  EXPECT_EQ(p.bytes_per_page_per_layer, 2 * (128 + 16));
  EXPECT_EQ(p.layout.report().access[0].vector_bytes, 8);  // 40-byte rows
}

TEST(Plan, ImpossibleParametersSayWhatToChange) {
  EXPECT_NE(plan_error({32, 8, 100, 16, std::nullopt, 10}).find("pad the head dim up to 112"), std::string::npos);
  EXPECT_NE(plan_error({32, 8, 128, 16, int64_t(1) << 18}).find("holds no page"), std::string::npos);
  EXPECT_NE(plan_error({32, 8, 128, 16, std::nullopt, 10, 3}).find("one must divide the other"), std::string::npos);
  EXPECT_NE(plan_error({32, 8, 128, 16, std::nullopt, 10, 2, 2}).find("rank"), std::string::npos);
  EXPECT_NE(plan_error({0, 8, 128, 16, std::nullopt, 10}).find("layers"), std::string::npos);
  EXPECT_NE(plan_error({32, 8, 128, 16, int64_t(1) << 30, 10}).find("not both"), std::string::npos);
  EXPECT_NE(plan_error({32, 8, 128, 16}).find("--memory"), std::string::npos);
  EXPECT_NE(plan_error({32, 8, 128, 16, std::nullopt, int64_t(1) << 60}).find("overflow"), std::string::npos);
  // Sizes past the layout's bound are refused before any work grows with them
  // (the rank's heads were once listed one by one: 2^62 kv heads never returned).
  EXPECT_NE(plan_error({1, int64_t(1) << 62, 128, 16, std::nullopt, 1}).find("k_data.page: expression \"H*HS\": integer overflow"),
            std::string::npos);
  EXPECT_EQ(plan({1, int64_t(1) << 40, 128, 16, std::nullopt, 1}).total_bytes, (int64_t(1) << 40) * 2304);
  EXPECT_NE(plan_error({1, int64_t(1) << 51, 128, 16, std::nullopt, 1}).find("elements, the bound on any count"),
            std::string::npos);
  EXPECT_NE(plan_error({int64_t(1) << 62, 8, 128, 16, int64_t(80) << 30}).find("one page of all 4611686018427387904 layers"),
            std::string::npos);
  EXPECT_NE(plan_error({32, 8, INT64_MAX, 16, std::nullopt, 1}).find("pad the head dim up to 9223372036854775808"),
            std::string::npos);
  PlanRequest q{32, 8, 128, 6, std::nullopt, 10};
  q.interleave_v_scales = true;
  EXPECT_NE(plan_error(q).find("tokens per page % 4"), std::string::npos);
  for (int64_t dim : {96, 128}) {  // TensorRT-LLM's interleave stays in its plane at every head dim
    q.head_dim = dim;
    q.tokens_per_page = 16;
    EXPECT_EQ(plan(q).layout.layout().region(Region::kVScale).token, Mode(4, 1, 4 * dim / 16));
  }
}

}  // namespace
}  // namespace nvfp4kv
