// What compare and the conformance kit say about two maps: field differences in
// the layouts' own terms, examples spread over regions and rows, "did you mean".
#include <gtest/gtest.h>

#include <set>

#include "nvfp4kv/core/layout_diff.hpp"
#include "nvfp4kv/core/names.hpp"
#include "nvfp4kv/core/plan.hpp"

namespace nvfp4kv {
namespace {

Layout preset(const char* name, int64_t heads = 2, int64_t pages = 3) {
  return instantiate(preset_spec(name), {1, pages, 16, heads, 128});
}

std::vector<std::string> texts(const Layout& a, const Layout& b) {
  std::vector<std::string> out;
  for (const MapDifference& d : map_differences(a, b)) out.push_back(d.text("the layout"));
  return out;
}

TEST(MapDifferences, NamesTheStridesOfTheTokenMajorWriter) {
  // vLLM's packed NHD writer against the tensor's physical rows (H 2, D 128, N 16).
  const auto t = texts(preset("vllm-packed-nhd-writer-sm12x"), preset("vllm-packed-nhd-rows"));
  const std::vector<std::string> want = {
      "k_data token stride is 128 (H*dd), the layout says 288 (2*H*F)",
      "k_data head stride is 64 (dd), the layout says 72 (F)",
      "k_scale offset is 2048 (H*N*dd), the layout says 64",
      "k_scale token stride is 16 (H*sd), the layout says 288 (2*H*F)",
      "k_scale head stride is 8 (sd), the layout says 72 (F)",
      "v_data token stride is 128 (H*dd), the layout says 288 (2*H*F)",
      "v_data head stride is 64 (dd), the layout says 72 (F)",
      "v_scale offset is 2192, the layout says 208",
      "v_scale token stride is 16 (H*sd), the layout says 288 (2*H*F)",
      "v_scale head stride is 8 (sd), the layout says 72 (F)"};
  EXPECT_EQ(t, want);
}

TEST(MapDifferences, NamesTheVScaleInterleave) {
  const auto t = texts(preset("vllm-legacy-hnd-writer-upstream"), preset("vllm-legacy-hnd-writer-sm12x"));
  ASSERT_EQ(t.size(), 2u);
  EXPECT_NE(t[0].find("v_scale token is (4,_):(1,32), the layout says 8 (sd): V scales are in "), std::string::npos) << t[0];
  EXPECT_NE(t[1].find("v_scale column is (2,_):(4,8), the layout says 1"), std::string::npos) << t[1];
  // The other way round, the layout's interleave is named.
  const auto back = texts(preset("vllm-legacy-hnd-writer-sm12x"), preset("vllm-legacy-hnd-writer-upstream"));
  EXPECT_NE(back[0].find("V scales are linear, not in "), std::string::npos) << back[0];
  // A head stride with one head, or modes that agree on [0, N), are no difference.
  EXPECT_TRUE(map_differences(preset("vllm-legacy-hnd-writer-sm12x", 1), preset("vllm-legacy-nhd-writer-sm12x", 1)).size() <
              map_differences(preset("vllm-legacy-hnd-writer-sm12x", 2), preset("vllm-legacy-nhd-writer-sm12x", 2)).size());
  EXPECT_TRUE(map_differences(preset("trtllm"), preset("trtllm")).empty());
  Layout spelled = preset("vllm-legacy-hnd-writer-upstream");  // the column (2,_):(4,8) is 4 at sd 8
  spelled.regions[size_t(Region::kVScale)].column = Mode(4);
  EXPECT_TRUE(map_differences(spelled, preset("vllm-legacy-hnd-writer-upstream")).empty());
}

TEST(MapDifferences, SaysWhereAnOffsetLands) {
  Layout a = preset("vllm-legacy-hnd-writer-sm12x"), b = a;
  a.regions[size_t(Region::kVData)].offset = b.region(Region::kKScale).offset;
  const auto t = texts(a, b);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0], "v_data offset is 2048 (H*N*dd) (where the layout starts k_scale), the layout says 2304");
}

TEST(SpreadExamples, CoverEveryDifferingRegionAndSpreadOverRows) {
  const Layout w = preset("vllm-packed-nhd-writer-sm12x", 1, 1), r = preset("vllm-packed-nhd-reader-sm120", 1, 1);
  const auto ex = spread_examples(w, r, 8);
  ASSERT_EQ(ex.size(), 8u);
  std::set<int> regions, tokens;
  for (const Misplacement& m : ex) {
    regions.insert(int(m.region));
    tokens.insert(int(m.coord.token));
    EXPECT_NE(m.writer_byte, m.reader_byte);
    EXPECT_EQ(m.writer_byte, w.offset(m.region, m.coord));
  }
  EXPECT_EQ(regions.size(), 4u);
  EXPECT_EQ(tokens.size(), 2u);  // two per region: tokens 1 and 8 of the 15 that differ
  // Only what differs is shown: the #50084 pair differs in V scales alone.
  for (const Misplacement& m : spread_examples(preset("vllm-legacy-hnd-writer-upstream"),
                                               preset("vllm-legacy-hnd-reader-sm120"), 6))
    EXPECT_EQ(m.region, Region::kVScale);
  EXPECT_TRUE(spread_examples(w, w, 5).empty());
}

TEST(Names, SuggestTheClosestKnownName) {
  const std::vector<std::string> commands = {"layout", "roundtrip", "demo", "bench", "conformance"};
  EXPECT_EQ(closest_name("layuot", commands), "layout");
  EXPECT_EQ(closest_name("roundtirp", commands), "roundtrip");
  EXPECT_EQ(closest_name("conform", commands), "conformance");
  EXPECT_EQ(closest_name("frobnicate", commands), "");
  EXPECT_EQ(did_you_mean("demp", commands), " (did you mean \"demo\"?)");
  try {
    load_spec("vllm-packed-nhd-writer-sm21x");
    ADD_FAILURE() << "loaded a mistyped preset";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean \"vllm-packed-nhd-writer-sm12x\"?"), std::string::npos) << e.what();
  }
}

TEST(Plan, SizesALayoutOfOnesOwn) {
  PlanRequest q;
  q.layers = 4;
  q.kv_heads = 8;
  q.head_dim = 128;
  q.tp_size = 2;
  q.memory_bytes = int64_t(1) << 20;
  q.layout = preset_spec("vllm-legacy-hnd-writer-sm12x");
  const Plan p = plan(q);
  EXPECT_FALSE(p.native);
  EXPECT_EQ(p.heads_per_rank, 4);
  EXPECT_EQ(p.bytes_per_page_per_layer, 2 * 4 * 16 * 72);
  EXPECT_EQ(p.bytes_per_page, 4 * 2 * 4 * 16 * 72);
  EXPECT_EQ(p.layout.layout().dims.pages, (int64_t(1) << 20) / p.bytes_per_page);
  EXPECT_EQ(p.layout.layout().name, "vllm-legacy-hnd-writer-sm12x");
  EXPECT_EQ(p.fixed_bytes, 0);
  q.cross_layer = true;
  EXPECT_THROW(plan(q), LayoutError);
  q.cross_layer = false;
  q.layout = preset_spec("vllm-packed-nhd-writer-sm12x");  // unsound: refused with the reason
  try {
    plan(q);
    ADD_FAILURE() << "planned an unsound layout";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("REJECTED"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nvfp4kv
