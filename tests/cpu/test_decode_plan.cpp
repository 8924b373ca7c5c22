// The decode planner on the CPU: stage shapes, stages in flight, the split of
// each block table and the split workspace, over page sizes, head dims, batch
// sizes and strides, with the H200's sizes and a shared-memory model of the
// kernel's shape (a model: the kernel's carve counts a few more small tables; the
// planner only compares the sizes it is given).
#include <gtest/gtest.h>

#include "nvfp4kv/core/decode_plan.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace {

using namespace decode_limits;

const DecodeDeviceFacts kH200{.sms = 132, .max_smem_per_block = 232448, .smem_per_sm = 233472};

// Shared memory of a block: the stage slots (or the combine, if larger), the
// page ids of a split, per-token tables and the query. Blocks per SM: by shared
// memory, at most the register budget's.
DecodeKernelFacts model_kernel(int* blocks_queries = nullptr) {
  DecodeKernelFacts k;
  k.smem_bytes = [](const DecodeGeometry& g) {
    const size_t stages = size_t(g.stages) * g.pages_per_stage * g.slot_bytes;
    const size_t combine = size_t(kConsumerWarps) * 16 * g.head_dim * 4;
    return int(std::max(stages, combine) + size_t(g.entries_per_split) * 4 + 8 * kMaxStageTokens * 2 + 16 * g.head_dim * 4);
  };
  k.blocks_per_sm = [blocks_queries, k](const DecodeGeometry& g) {
    if (blocks_queries) ++*blocks_queries;
    const int by_smem = kH200.smem_per_sm / (k.smem_bytes(g) + 1024);
    return std::min(by_smem, decode_blocks_per_sm(g.head_dim, decode_instance_rows(g)));
  };
  return k;
}

struct Case {
  int64_t tokens_per_page = 16, head_dim = 128, heads = 8, q_heads = 32, batch = 16, stride = 2048;
  const char* preset = "nvfp4kv-native";
  int64_t max_q_len = 1;  // > 1: the short-query route
  ElementFormat k_element = ElementFormat::kNvfp4, v_element = ElementFormat::kNvfp4;
};

DecodeGeometry plan(const Case& c, std::string* why = nullptr) {
  const ValidLayout v = validate(
      instantiate(preset_spec(c.preset), {1, 4096, c.tokens_per_page, c.heads, c.head_dim, c.k_element, c.v_element}));
  DecodeArgs a;
  a.q_heads = c.q_heads;
  a.batch.batch = c.batch;
  a.batch.block_table_stride = c.stride;
  DecodeGeometry g;
  const std::string problem = plan_decode_geometry(v.view(), a, kH200, model_kernel(), &g, c.max_q_len);
  if (why) *why = problem;
  else EXPECT_EQ(problem, "");
  return g;
}

TEST(DecodePlan, StagesHoldWholePagesWithinTheMaskAndTheTables) {
  for (int64_t n : {1, 2, 3, 8, 16, 24, 32, 40, 64, 128, 200, 256})
    for (int64_t d : {64, 128, 256}) {
      const DecodeGeometry g = plan({.tokens_per_page = n, .head_dim = d});
      SCOPED_TRACE("N " + std::to_string(n) + " D " + std::to_string(d));
      EXPECT_GE(g.pages_per_stage, 1);
      EXPECT_LE(g.pages_per_stage, kMaxStagePages);  // one token per page once overflowed a 64-bit mask
      EXPECT_LE(g.pages_per_stage * n, kMaxStageTokens);
      // A stage gives every consumer warp a tile unless the 64-page cap binds.
      if (n <= kTile * kConsumerWarps && n * kMaxStagePages >= kTile * kConsumerWarps) {
        EXPECT_GE(g.pages_per_stage * n, kTile * kConsumerWarps - n + 1);
      }
      if (!g.tensor_rows) {
        EXPECT_EQ(g.slot_bytes, 2 * (n * d / 2 + (n * d / 16 + 15) / 16 * 16));
      } else {  // rows of at least 16 bytes, planes on 128 bytes
        const auto up = [](int64_t b) { return (b + 127) / 128 * 128; };
        EXPECT_EQ(g.slot_bytes, 2 * (up(n * d / 2) + up(n * std::max<int64_t>(d / 16, 16))));
      }
    }
}

TEST(DecodePlan, StagesInFlightFillTheSharedMemoryOfTheBlocksPerSm) {
  const DecodeKernelFacts k = model_kernel();
  for (int64_t d : {64, 128, 256})
    for (int64_t group : {1, 4, 8, 16}) {
      const DecodeGeometry g = plan({.head_dim = d, .q_heads = 8 * group});
      const int budget = std::min(kH200.max_smem_per_block,
                                  kH200.smem_per_sm / decode_blocks_per_sm(g.head_dim, group > 8 ? 16 : 8) - 1024);
      SCOPED_TRACE("D " + std::to_string(d) + " group " + std::to_string(group));
      EXPECT_GE(g.stages, 2);
      EXPECT_LE(g.stages, kMaxStages);
      // Reserved for the largest split the stride allows; the chosen split needs no more.
      EXPECT_GE(g.smem_bytes, k.smem_bytes(g));
      EXPECT_LE(g.smem_bytes, budget);
      if (g.stages < kMaxStages) {
        DecodeGeometry more = g;
        ++more.stages;
        EXPECT_GT(k.smem_bytes(more), budget) << "one more stage would have fitted";
      }
    }
  // Two blocks of the light instance fit on one SM.
  const DecodeGeometry g = plan({});
  EXPECT_LE(2 * (g.smem_bytes + 1024), kH200.smem_per_sm);
}

TEST(DecodePlan, SplitsCoverEveryBlockTableEntryOnce) {
  for (int64_t stride : {1, 7, 8, 9, 100, 128, 2048, 8192, 65536, 262144})
    for (int64_t batch : {1, 3, 16, 128})
      for (int64_t n : {1, 16, 128}) {
        const DecodeGeometry g = plan({.tokens_per_page = n, .batch = batch, .stride = stride});
        SCOPED_TRACE("stride " + std::to_string(stride) + " batch " + std::to_string(batch) + " N " + std::to_string(n));
        EXPECT_GE(g.splits, 1);
        EXPECT_LE(g.splits, kMaxSplits);
        EXPECT_EQ(g.entries_per_split % g.pages_per_stage, 0);
        EXPECT_LE(g.entries_per_split, kMaxSplitEntries);
        EXPECT_GE(g.splits * g.entries_per_split, stride);          // every entry has a split
        EXPECT_LT((g.splits - 1) * g.entries_per_split, stride);    // and every split has entries
        if (g.splits == 1) {
          EXPECT_EQ(g.workspace_bytes, 0u);
        } else {
          size_t tickets_at = 0;
          EXPECT_EQ(g.workspace_bytes, decode_split_workspace_bytes(batch, g.splits, 32, 8, 128, &tickets_at));
          EXPECT_EQ(tickets_at % 16, 0u);
          EXPECT_GE(tickets_at, size_t(batch) * g.splits * 32 * 129 * sizeof(float));
          EXPECT_EQ(g.workspace_bytes - tickets_at, size_t(batch) * 8 * 8);
        }
      }
}

TEST(DecodePlan, SmallBatchesSplitAndLargeOnesDoNot) {
  // One sequence of 128K tokens: 8 blocks would use 8 of 264 block slots.
  EXPECT_GE(plan({.batch = 1, .stride = 8192}).splits, 16);
  // 128 sequences x 8 kv heads already fill the GPU four times over.
  EXPECT_EQ(plan({.batch = 128, .stride = 128}).splits, 1);
}

TEST(DecodePlan, PlaneKindsFollowTheLayout) {
  const DecodeGeometry native = plan({});
  EXPECT_TRUE(native.dense);
  EXPECT_TRUE(native.span);  // one copy per page
  const DecodeGeometry planes = plan({.preset = "flashinfer-hnd"});
  EXPECT_TRUE(planes.dense);
  EXPECT_FALSE(planes.span);  // four planes in two allocations
  EXPECT_FALSE(native.tensor_rows);
  EXPECT_FALSE(planes.tensor_rows);
  // Heads interleaved within a token: row by row, one tensor copy per (page, head)
  // tile of each region; the scale rows (8 bytes at D 128, the next head's after
  // them) are copied 16 bytes wide, so their plane's pitch is 16.
  const DecodeGeometry nhd = plan({.preset = "flashinfer-nhd"});
  EXPECT_FALSE(nhd.dense);
  EXPECT_TRUE(nhd.tensor_rows);
  EXPECT_EQ(nhd.row_pitch[int(Region::kKData)], 64);
  EXPECT_EQ(nhd.row_pitch[int(Region::kKScale)], 16);
  EXPECT_EQ(nhd.slot_bytes, 2 * (16 * 64 + 16 * 16));
  for (int ri = 0; ri < kRegionCount; ++ri) EXPECT_EQ(nhd.plane_offset[ri] % 128, 0);
  // Row copies by the lanes keep the rows' own widths.
  const DecodeGeometry rows = plan({.tokens_per_page = 3});
  EXPECT_FALSE(rows.dense);
  EXPECT_FALSE(rows.tensor_rows);  // a page's planes of 3 x 64 bytes: strides not multiples of 16 somewhere
  EXPECT_EQ(rows.row_pitch[int(Region::kKScale)], 8);
  // A box starts on 16 bytes: head h of a shared scale row of 8 bytes starts (8h) % 16
  // bytes into its box, and every shift leaves room for the row.
  EXPECT_EQ(tensor_row_shift(1, 8), 8);
  EXPECT_EQ(tensor_row_shift(2, 8), 0);
  EXPECT_EQ(tensor_row_shift(3, 4), 12);
  for (int cols : {2, 4, 8, 12, 16, 24, 32, 40, 64, 128})
    for (int h = 0; h < 64; ++h) EXPECT_LE(tensor_row_shift(h, cols) + cols, tensor_row_pitch(cols)) << cols << " " << h;
  EXPECT_EQ(tensor_row_pitch(8), 16);
  EXPECT_EQ(tensor_row_pitch(12), 32);
  EXPECT_EQ(tensor_row_pitch(64), 64);
  // A padded head is left to the row copies (a shared row's next head would sit in its padding).
  EXPECT_FALSE(plan({.head_dim = 96, .preset = "flashinfer-nhd"}).tensor_rows);
  const DecodeGeometry padded = plan({.head_dim = 80});
  EXPECT_EQ(padded.head_dim, 128);
  EXPECT_FALSE(padded.dense);
  EXPECT_FALSE(padded.tensor_rows);  // native rows of 40 bytes: a token stride the copy engine refuses
  EXPECT_EQ(padded.row_pitch[int(Region::kKData)], 64);
}

// An FP8 side's stage rows are D bytes and it has no scale plane: the slot's planes follow
// each side's element format, in region order, and still make one span of the native layout.
TEST(DecodePlan, Fp8SidesHaveRowsOfDBytesAndNoScalePlane) {
  constexpr ElementFormat kFp8 = ElementFormat::kFp8E4M3;
  for (int64_t d : {64, 128, 256}) {
    SCOPED_TRACE("D " + std::to_string(d));
    const DecodeGeometry k8 = plan({.head_dim = d, .k_element = kFp8});
    EXPECT_TRUE(k8.dense);
    EXPECT_TRUE(k8.span);
    EXPECT_EQ(k8.row_pitch[int(Region::kKData)], d);
    EXPECT_EQ(k8.row_pitch[int(Region::kKScale)], 0);
    EXPECT_EQ(k8.row_pitch[int(Region::kVData)], d / 2);
    EXPECT_EQ(k8.plane_offset[int(Region::kVData)], 16 * d);  // right after K's data
    EXPECT_EQ(k8.slot_bytes, 16 * d + 16 * d / 2 + 16 * d / 16);
    const DecodeGeometry v8 = plan({.head_dim = d, .v_element = kFp8});
    EXPECT_TRUE(v8.span);
    EXPECT_EQ(v8.plane_offset[int(Region::kVData)], 16 * d / 2 + 16 * d / 16);
    EXPECT_EQ(v8.row_pitch[int(Region::kVScale)], 0);
    EXPECT_EQ(v8.slot_bytes, 16 * d / 2 + 16 * d / 16 + 16 * d);
    const DecodeGeometry both = plan({.head_dim = d, .k_element = kFp8, .v_element = kFp8});
    EXPECT_TRUE(both.span);
    EXPECT_EQ(both.slot_bytes, 2 * 16 * d);
    // Twice K's bytes: fewer stages in flight at most, never more.
    EXPECT_LE(both.stages, plan({.head_dim = d}).stages);
  }
  // The other copy paths with an FP8 side: K's NVFP4 scale rows of 8 bytes (1 token a page)
  // make tensor copies, V's FP8 rows as wide as the copy engine takes them (16-byte multiples);
  // 3 tokens a page make row copies.
  const DecodeGeometry tensor = plan({.tokens_per_page = 1, .v_element = kFp8});
  EXPECT_TRUE(tensor.tensor_rows);
  EXPECT_EQ(tensor.row_pitch[int(Region::kVData)], 128);
  EXPECT_EQ(tensor.row_pitch[int(Region::kVScale)], 0);
  for (int ri = 0; ri < kRegionCount; ++ri) EXPECT_EQ(tensor.plane_offset[ri] % 128, 0);
  const DecodeGeometry rows = plan({.tokens_per_page = 3, .k_element = kFp8});
  EXPECT_FALSE(rows.dense);
  EXPECT_FALSE(rows.tensor_rows);
  EXPECT_EQ(rows.row_pitch[int(Region::kKData)], 128);
  // Two stages of whole pages must fit: at D 256 and 256 tokens a page both sides in FP8 take
  // 128 KiB a page, and the shape is refused by name (NVFP4 there: 72 KiB, planned).
  std::string why;
  plan({.tokens_per_page = 256, .head_dim = 256, .k_element = kFp8, .v_element = kFp8}, &why);
  EXPECT_NE(why.find("shared memory"), std::string::npos) << why;
  why.clear();
  plan({.tokens_per_page = 256, .head_dim = 256}, &why);
  EXPECT_EQ(why, "");
  // The padded path copies an FP8 row of the layout's D into a row of the instance's.
  const DecodeGeometry padded = plan({.head_dim = 80, .k_element = kFp8});
  EXPECT_FALSE(padded.dense);
  EXPECT_EQ(padded.row_pitch[int(Region::kKData)], 128);
  EXPECT_EQ(padded.row_pitch[int(Region::kKScale)], 0);
  EXPECT_EQ(padded.plane_offset[int(Region::kVData)], 16 * 128);
}

TEST(DecodePlan, UnsupportedShapesSayWhy) {
  std::string why;
  plan({.head_dim = 320}, &why);
  EXPECT_NE(why.find("head dims up to 256"), std::string::npos) << why;
  plan({.tokens_per_page = 512}, &why);
  EXPECT_NE(why.find("up to 256 tokens per page"), std::string::npos) << why;
  // A block table too long for 256 splits of 4096 entries.
  plan({.batch = 1, .stride = int64_t(kMaxSplits) * kMaxSplitEntries + 1}, &why);
  EXPECT_NE(why.find("more than 256 splits"), std::string::npos) << why;
  // A device with too little shared memory for two stages.
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 64, 256, 1, 256}));
  DecodeArgs a;
  a.q_heads = 1;
  a.batch.batch = 1;
  a.batch.block_table_stride = 4;
  DecodeGeometry g;
  const DecodeDeviceFacts small{.sms = 4, .max_smem_per_block = 48 << 10, .smem_per_sm = 64 << 10};
  why = plan_decode_geometry(v.view(), a, small, model_kernel(), &g);
  EXPECT_NE(why.find("bytes of shared memory"), std::string::npos) << why;
}

TEST(DecodePlan, TheGeometryDependsOnTheShapeOnly) {
  // Lengths are not an input; the same shape twice plans the same, and the kernel
  // is asked for its occupancy once.
  int queries = 0;
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 4096, 16, 8, 128}));
  DecodeArgs a;
  a.q_heads = 32;
  a.batch.batch = 4;
  a.batch.block_table_stride = 512;
  DecodeGeometry g1, g2;
  ASSERT_EQ(plan_decode_geometry(v.view(), a, kH200, model_kernel(&queries), &g1), "");
  // Everything that is not the shape: lengths, tables, options, the query's type.
  DecodeArgs b = a;
  int32_t lengths[4] = {1, 2, 3, 4}, table[4] = {0, 1, 2, 3};
  float sinks[32] = {};
  b.batch.seq_lens = lengths;
  b.batch.block_table = table;
  b.window = 100;
  b.softcap = 30.0f;
  b.sinks = sinks;
  b.q_type = ElementType::kFloat16;
  ASSERT_EQ(plan_decode_geometry(v.view(), b, kH200, model_kernel(&queries), &g2), "");
  EXPECT_EQ(queries, 2);
  EXPECT_EQ(g1.splits, g2.splits);
  EXPECT_EQ(g1.stages, g2.stages);
  EXPECT_EQ(g1.entries_per_split, g2.entries_per_split);
  EXPECT_EQ(g1.workspace_bytes, g2.workspace_bytes);
  // A failed occupancy query stops the plan.
  DecodeKernelFacts broken = model_kernel();
  broken.blocks_per_sm = [](const DecodeGeometry&) { return -1; };
  EXPECT_EQ(plan_decode_geometry(v.view(), a, kH200, broken, &g1), "blocks_per_sm failed");
}

// The head-dim traits table every attention family dispatches on.
// The short-query route: a block's rows are (query token, head) pairs, q length x
// group of them, on the 16-row instances; its split workspace holds a partial per
// row; shapes whose rows do not fit are refused by name.
TEST(DecodePlan, ShortQueriesTakeTokenHeadRowsOnTheSixteenRowInstances) {
  for (int64_t group : {1, 2, 4, 8, 16})
    for (int64_t q = 2; q * group <= kShortQueryRows; ++q) {
      SCOPED_TRACE("group " + std::to_string(group) + " q " + std::to_string(q));
      const DecodeGeometry g = plan({.q_heads = 8 * group, .batch = 4, .max_q_len = q});
      EXPECT_EQ(g.queries, q);
      EXPECT_EQ(g.rows, q * group);
      EXPECT_EQ(decode_instance_rows(g), 16);
      EXPECT_GT(g.splits, 1);  // 4 x 8 blocks of a 2048-entry table split
      EXPECT_EQ(g.workspace_bytes, decode_split_workspace_bytes(4, g.splits, 8 * group, 8, 128, nullptr, q));
      // q x more partials than a decode call of the same batch and splits.
      EXPECT_EQ(g.workspace_bytes, attention_split_workspace_bytes(4 * 8 * g.rows, g.splits, 4 * 8, 128));
    }
  // One query token is decode: the group's rows, 8-row instances up to group 8.
  const DecodeGeometry d = plan({.q_heads = 32, .batch = 4});
  EXPECT_EQ(d.rows, 4);
  EXPECT_EQ(decode_instance_rows(d), 8);
  EXPECT_EQ(decode_instance_rows(plan({.q_heads = 8 * 16, .batch = 4})), 16);
  std::string why;
  plan({.q_heads = 32, .max_q_len = 5}, &why);  // 5 x 4 = 20 rows
  EXPECT_NE(why.find("max q length x group <= 16"), std::string::npos) << why;
  EXPECT_NE(why.find("5 x 4"), std::string::npos) << why;
  plan({.q_heads = 8 * 16, .max_q_len = 2}, &why);
  EXPECT_NE(why.find("2 x 16"), std::string::npos) << why;
  plan({.q_heads = 32, .max_q_len = 0}, &why);
  EXPECT_NE(why.find("0 x 4"), std::string::npos) << why;
}

TEST(AttentionDims, EveryHeadDimUpTo256RunsTheNextInstance) {
  for (int64_t d = 1; d <= 300; ++d) {
    const int instance = attention_instance_dim(d);
    SCOPED_TRACE("D " + std::to_string(d));
    if (d > kMaxAttentionHeadDim) {
      EXPECT_EQ(instance, 0);
      continue;
    }
    EXPECT_GE(instance, d);
    bool listed = false;
    for (int listed_dim : kAttentionHeadDims) {
      listed = listed || listed_dim == instance;
      if (listed_dim >= d) {
        EXPECT_LE(instance, listed_dim);  // the smallest that holds D
      }
    }
    EXPECT_TRUE(listed);
  }
  EXPECT_EQ(attention_instance_dim(0), 0);
  EXPECT_EQ(attention_instance_dim(-64), 0);
}

TEST(AttentionDims, SplitWorkspaceHoldsEveryPartialThenAlignedTickets) {
  for (int64_t rows : {1, 7, 32, 4096})
    for (int64_t splits : {2, 3, 256})
      for (int dim : {64, 128, 256}) {
        size_t at = 0;
        const size_t bytes = attention_split_workspace_bytes(rows, splits, 5, dim, &at);
        EXPECT_EQ(at % 16, 0u);
        EXPECT_GE(at, size_t(rows * splits) * (dim + 1) * sizeof(float));
        EXPECT_LT(at, size_t(rows * splits) * (dim + 1) * sizeof(float) + 16);
        EXPECT_EQ(bytes, at + 5 * sizeof(unsigned long long));
      }
}

}  // namespace
}  // namespace nvfp4kv
