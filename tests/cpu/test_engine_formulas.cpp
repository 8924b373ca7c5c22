// Every preset against an independent transcription of its engine's own index
// arithmetic (issue 13; the transcriptions are in engine_formulas.hpp). The
// preset's offsets must equal it buffer for buffer and byte for byte, for every
// element at every size of the sweep (H 1, 3 and 8 against N 4, 16 and 32; D 64,
// 128 and 256).
#include <gtest/gtest.h>

#include "engine_formulas.hpp"

namespace nvfp4kv {
namespace {

using namespace engines;

// Elements of `l` the transcription places elsewhere (a different buffer or byte).
int64_t mismatches(const Layout& l, const Transcription& engine, std::string* first = nullptr) {
  const CacheDims& d = l.dims;
  int64_t bad = 0;
  for (Region r : kAllRegions)
    for (Coord c; c.layer < d.layers; ++c.layer)
      for (c.page = 0; c.page < d.pages; ++c.page)
        for (c.head = 0; c.head < d.heads; ++c.head)
          for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
            for (c.column = 0; c.column < d.columns(r); ++c.column) {
              const Place want = engine(r, c, d);
              const Place got{l.buffers.at(size_t(l.region(r).buffer)).name, l.offset(r, c)};
              if (got == want) continue;
              if (bad++ == 0 && first)
                *first = describe_element(r, c) + ": engine byte " + std::to_string(want.byte) + " of \"" +
                         want.buffer + "\", preset byte " + std::to_string(got.byte) + " of \"" + got.buffer + "\"";
            }
  return bad;
}

TEST(EngineFormulas, EveryPresetHasProvenanceAndATranscription) {
  for (const PresetInfo& p : list_presets()) {
    EXPECT_TRUE(transcriptions().count(p.name)) << p.name << " has no transcription of its engine's formulas";
    EXPECT_FALSE(p.provenance.empty()) << p.name;
    EXPECT_FALSE(p.provenance.version.empty() || p.provenance.gpu_path.empty() || p.provenance.sources.empty() ||
                 p.provenance.expressions.empty())
        << p.name;
  }
  EXPECT_EQ(transcriptions().size(), list_presets().size());
}

TEST(EngineFormulas, EveryPresetEqualsItsEnginesOwnArithmeticByteForByte) {
  int64_t elements = 0;
  int sizes = 0;
  for (const PresetInfo& p : list_presets()) {
    const auto it = transcriptions().find(p.name);
    if (it == transcriptions().end()) continue;  // reported by the test above
    const int64_t layers = p.name.rfind("nvfp4kv-native-layers", 0) == 0 ? 2 : 1;
    for (int64_t heads : {1, 3, 8})
      for (int64_t dim : {64, 128, 256})
        for (int64_t n : {4, 16, 32}) {
          const Layout l = instantiate(preset_spec(p.name), {layers, 3, n, heads, dim});
          std::string first;
          ASSERT_EQ(mismatches(l, it->second, &first), 0)
              << p.name << " H" << heads << " D" << dim << " N" << n << ": " << first;
          elements += l.dims.layers * l.dims.pages * heads * n * 2 * (dim / 2 + dim / 16);
          ++sizes;
        }
  }
  EXPECT_EQ(sizes, 25 * 27);
  std::printf("%d preset sizes, %lld elements equal to their engines' arithmetic\n", sizes, (long long)elements);
}

// The comparison can fail, and fails where the engines differ: vLLM's upstream
// writer against the linear presets misplaces V scales and nothing else, as
// does FlashInfer's trtllm-gen quantizer against its FA2 layout; TensorRT-LLM's
// index against the FlashInfer/vLLM spelling agrees (sd % 4 == 0 here).
TEST(EngineFormulas, TranscriptionsTellThePathsApart) {
  const DimsOverride d{1, 3, 16, 3, 128};
  const auto misplaced_v_scales = [&](const char* preset, const char* engine) {
    const Layout l = instantiate(preset_spec(preset), d);
    const Transcription& t = transcriptions().at(engine);
    // The same layout with every region but V scales moved onto the engine's bytes
    // counts V scales alone.
    const Transcription v_scales_only = [&](Region r, const Coord& c, const CacheDims& dims) {
      if (r == Region::kVScale) return t(r, c, dims);
      return Place{l.buffers.at(size_t(l.region(r).buffer)).name, l.offset(r, c)};
    };
    return std::pair{mismatches(l, t), mismatches(l, v_scales_only)};
  };
  // 3 pages x 3 heads x (16 x 8 V scales, 8 of them on the interleave's fixed points)
  const std::pair<int64_t, int64_t> v_only{3 * 3 * 120, 3 * 3 * 120};
  EXPECT_EQ(misplaced_v_scales("vllm-legacy-hnd-reader-sm120", "vllm-legacy-hnd-writer-upstream"), v_only);
  EXPECT_EQ(misplaced_v_scales("vllm-legacy-nhd-writer-sm12x", "vllm-legacy-nhd-writer-upstream"), v_only);
  EXPECT_EQ(misplaced_v_scales("vllm-packed-hnd-writer-sm12x", "vllm-packed-hnd-reader-sm100"), v_only);
  EXPECT_EQ(misplaced_v_scales("flashinfer-hnd", "flashinfer-trtllm-gen-hnd"), v_only);
  EXPECT_EQ(misplaced_v_scales("flashinfer-nhd", "flashinfer-trtllm-gen-nhd"), v_only);
  // vLLM's packed NHD writer and reader views differ everywhere but token 0.
  EXPECT_GT(mismatches(instantiate(preset_spec("vllm-packed-nhd-writer-sm12x"), d),
                       transcriptions().at("vllm-packed-nhd-reader-sm120")),
            0);
  // SGLang's fp4_e2m1 pool puts its bytes where flashinfer-nhd does (its scales are E8M0, not NVFP4).
  for (int64_t heads : {1, 3})
    for (int64_t dim : {64, 128})
      EXPECT_EQ(mismatches(instantiate(preset_spec("flashinfer-nhd"), {1, 3, 16, heads, dim}), sglang_fp4_pool), 0);
}

}  // namespace
}  // namespace nvfp4kv
