// Every engine layout of the reference doc, section 2: formulas, verdicts and
// the known-bad cases pinned.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "brute_force.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace {

Layout preset(const char* name, const DimsOverride& d) { return instantiate(preset_spec(name), d); }

// vLLM's packed NHD views as its writer and its reader address them (reference doc section 2).
const std::vector<std::string> kBroken = {"vllm-packed-nhd-writer-upstream", "vllm-packed-nhd-writer-sm12x",
                                          "vllm-packed-nhd-reader-sm120"};

bool broken(const std::string& n) { return std::find(kBroken.begin(), kBroken.end(), n) != kBroken.end(); }

TEST(Presets, VerdictsMatchTheExhaustiveOwnershipMapAtManySizes) {
  int checked = 0;
  for (const PresetInfo& p : list_presets())
    for (int64_t layers : {1, 3})
      for (int64_t heads : {1, 2, 8})
        for (int64_t dim : {64, 128, 256})
          for (int64_t n : {4, 16, 32}) {
            const Layout l = preset(p.name.c_str(), {layers, 3, n, heads, dim});
            const CheckReport r = check(l).report;
            const testing::BruteForce bf = testing::brute_force(l);
            ASSERT_EQ(r.ok, !bf.overlap && !bf.out_of_bounds) << p.name << ": " << r.summary();
            ASSERT_EQ(r.ok, !broken(p.name)) << p.name << " H" << heads << " D" << dim << " N" << n << ": " << r.summary();
            ++checked;
          }
  EXPECT_GE(checked, 23 * 54);
}

// Kernels address a (layer, page, head) tile through LayoutView::tile and walk
// heads by adding head_step; both must give the layout's own offset for every
// region and coordinate of every preset. The comparison must be able to fail:
// a tile view built from a layout with one stride perturbed disagrees.
int64_t tile_mismatches(const LayoutView& view, const Layout& truth) {
  const CacheDims& d = view.dims();
  int64_t bad = 0;
  for (Region r : kAllRegions)
    for (int64_t layer = 0; layer < d.layers; ++layer)
      for (int64_t page = 0; page < d.pages; ++page)
        for (int64_t h = 0; h < d.heads; ++h) {
          const TileMap t = view.tile(r, layer, page, h);
          const int64_t head0 = view.tile(r, layer, page, 0).base;
          bad += t.base != head0 + h * view.head_step(r);
          for (int64_t tok = 0; tok < d.tokens_per_page; ++tok)
            for (int64_t col = 0; col < d.columns(r); ++col)
              bad += t.offset(tok, col) != truth.offset(r, {layer, page, tok, h, col});
        }
  return bad;
}

TEST(Presets, TileViewAndHeadStepGiveEveryElementsOffset) {
  int64_t checked = 0;
  for (const PresetInfo& p : list_presets()) {
    if (broken(p.name)) continue;
    for (int64_t n : {4, 16})
      for (int64_t dim : {64, 128}) {
        const Layout l = preset(p.name.c_str(), {2, 3, n, 3, dim});
        const ValidLayout v = validate(l);
        ASSERT_EQ(tile_mismatches(v.view(), l), 0) << p.name;
        checked += 1;
        // Perturb each stride of each region in turn (a layout the view was not made from).
        for (int r = 0; r < kRegionCount; ++r)
          for (int which = 0; which < 5; ++which) {
            Layout bent = l;
            RegionMap& m = bent.regions[size_t(r)];
            // The stride of a mode that its coordinate's range actually uses.
            const auto used = [](Mode& md, int64_t extent) { return extent > md.inner ? &md.stride : &md.inner_stride; };
            int64_t* field[] = {&m.offset, &m.page, &m.head, used(m.token, n), used(m.column, l.dims.columns(Region(r)))};
            *field[which] += 1;
            EXPECT_GT(tile_mismatches(v.view(), bent), 0) << p.name << " region " << r << " stride " << which;
          }
      }
  }
  EXPECT_GE(checked, 20 * 4);
}

// check rejects `l` naming two V scales and the byte they share, which both really occupy.
CheckReport expect_two_v_scales_share_a_byte(const Layout& l) {
  const CheckReport r = check(l).report;
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.collision.has_value()) << r.summary();
  if (!r.collision) return r;
  const Collision& c = *r.collision;
  EXPECT_EQ(c.a, Region::kVScale);
  EXPECT_EQ(c.b, Region::kVScale);
  EXPECT_EQ(l.offset(c.a, c.coord_a), c.byte);
  EXPECT_EQ(l.offset(c.b, c.coord_b), c.byte);
  EXPECT_NE(r.problems[0].find("share byte " + std::to_string(c.byte)), std::string::npos) << r.problems[0];
  return r;
}

// With the interleave as data both spellings exist at every head dim: TensorRT-LLM's
// stays inside its (page, head) plane at D 80 and 96; FlashInfer/vLLM's leaves it
// there, and check names the byte two of its coordinates share.
TEST(Presets, InterleaveSpellingsAtHeadDims80And96) {
  for (int64_t dim : {80, 96}) {
    const CheckReport trt = check(preset("trtllm", {1, 3, 16, 2, dim})).report;
    EXPECT_TRUE(trt.ok) << dim << ": " << trt.summary();
    SCOPED_TRACE(dim);
    expect_two_v_scales_share_a_byte(preset("flashinfer-trtllm-gen-hnd", {1, 3, 16, 2, dim}));
  }
  // Below D 64 FlashInfer's spelling divides by sd / 4 = 0: refused when the sizes are bound.
  EXPECT_THROW(preset("flashinfer-trtllm-gen-hnd", {1, 2, 16, 2, 32}), LayoutError);
  EXPECT_TRUE(check(preset("trtllm", {1, 2, 16, 2, 32})).report.ok);
}

TEST(Presets, FormulasOfTheReferenceDoc) {
  // vLLM legacy HND: K scale = b*P + H*N*dd + h*N*sd + t*sd + g, V base + H*N*F.
  const int64_t H = 4, N = 16, D = 128, dd = 64, sd = 8, F = 72, P = 2 * H * N * F;
  const Layout hnd = preset("vllm-legacy-hnd-writer-sm12x", {1, 5, N, H, D});
  const Layout nhd = preset("vllm-legacy-nhd-writer-sm12x", {1, 5, N, H, D});
  const Layout fi = preset("flashinfer-trtllm-gen-hnd", {1, 5, N, H, D});
  const Layout trt = preset("trtllm", {1, 5, N, H, D});
  for (int64_t b = 0; b < 5; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < N; ++t) {
        for (int64_t j = 0; j < dd; ++j) {
          ASSERT_EQ(hnd.offset(Region::kKData, {0, b, t, h, j}), b * P + h * N * dd + t * dd + j);
          ASSERT_EQ(hnd.offset(Region::kVData, {0, b, t, h, j}), b * P + H * N * F + h * N * dd + t * dd + j);
          ASSERT_EQ(nhd.offset(Region::kKData, {0, b, t, h, j}), b * P + t * H * dd + h * dd + j);
        }
        for (int64_t g = 0; g < sd; ++g) {
          ASSERT_EQ(hnd.offset(Region::kKScale, {0, b, t, h, g}), b * P + H * N * dd + h * N * sd + t * sd + g);
          ASSERT_EQ(nhd.offset(Region::kKScale, {0, b, t, h, g}), b * P + N * H * dd + t * H * sd + h * sd + g);
          ASSERT_EQ(nhd.offset(Region::kVScale, {0, b, t, h, g}), b * P + N * H * F + N * H * dd + t * H * sd + h * sd + g);
          // FlashInfer's V-scale swizzle inside each (page, head) plane of N x sd bytes.
          const int64_t q = sd / 4;
          ASSERT_EQ(fi.offset(Region::kVScale, {0, b, t, h, g}),
                    (b * H + h) * N * sd + ((t / 4) * 4 + g / q) * sd + (g % q) * 4 + t % 4);
          ASSERT_EQ(fi.offset(Region::kKScale, {0, b, t, h, g}), (b * H + h) * N * sd + t * sd + g);
          // TensorRT-LLM's V scale index (tok/4)*4*sd + g*4 + tok%4 inside a (block, head) plane.
          ASSERT_EQ(trt.offset(Region::kVScale, {0, b, t, h, g}),
                    b * 2 * H * N * sd + H * N * sd + h * N * sd + (t / 4) * 4 * sd + g * 4 + t % 4);
        }
      }
}

TEST(Presets, VllmPackedNhdReaderFirstCollisionIsPinned) {
  const CheckReport r = check(preset("vllm-packed-nhd-reader-sm120", {1, 1, 16, 1, 128})).report;
  ASSERT_FALSE(r.ok);
  ASSERT_TRUE(r.collision.has_value());
  EXPECT_EQ(r.collision->message(),
            "k_data[layer 0, page 0, token 8, head 0, byte 0] and k_scale[layer 0, page 0, token 0, head 0, group 0] "
            "share byte 1024 of buffer \"kv\"");
  // Bytes 1024-1031 are K data (t=8, j=0..7) and K scale (t=0, g=0..7).
  const Layout l = preset("vllm-packed-nhd-reader-sm120", {1, 1, 16, 1, 128});
  for (int64_t k = 0; k < 8; ++k) {
    EXPECT_EQ(l.offset(Region::kKData, {0, 0, 8, 0, k}), 1024 + k);
    EXPECT_EQ(l.offset(Region::kKScale, {0, 0, 0, 0, k}), 1024 + k);
  }
}

TEST(Presets, VllmPackedNhdWriterOverlapsKWithV) {
  const CheckReport r = check(preset("vllm-packed-nhd-writer-sm12x", {1, 1, 16, 1, 128})).report;
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.collision->message(),
            "k_data[layer 0, page 0, token 1, head 0, byte 8] and v_data[layer 0, page 0, token 0, head 0, byte 0] "
            "share byte 72 of buffer \"kv\"");
  EXPECT_NE(std::find(r.colliding_pairs.begin(), r.colliding_pairs.end(), "k_scale/v_data"), r.colliding_pairs.end());
}

TEST(Presets, VllmPackedNhdWriterAndReaderDisagreeOnEveryTokenButZero) {
  const DimsOverride d{1, 1, 16, 1, 128};
  const CompareReport r =
      compare(preset("vllm-packed-nhd-writer-sm12x", d), preset("vllm-packed-nhd-reader-sm120", d));
  EXPECT_FALSE(r.agree);
  // 15 of 16 tokens differ in every region: 2 sides x 15 x (64 + 8).
  EXPECT_EQ(r.misplaced, 2160);
  EXPECT_EQ(r.misplaced_per_region[0], 15 * 64);
  EXPECT_EQ(r.misplaced_per_region[1], 15 * 8);
  EXPECT_EQ(r.elements, 2 * 16 * 72);
  ASSERT_FALSE(r.examples.empty());
  EXPECT_EQ(r.examples[0].coord.token, 1);
  // Over a full cache (8 heads, 1000 pages, 32 layers) the count scales exactly.
  const DimsOverride big{32, 1000, 16, 8, 128};
  const CompareReport r2 =
      compare(preset("vllm-packed-nhd-writer-sm12x", big), preset("vllm-packed-nhd-reader-sm120", big));
  // Only token 0 of head 0 agrees in each region: K/V data differ for (t, h) != (0, 0) since
  // t*H*dd + h*dd == t*2H*dd + h*dd only at t == 0.
  EXPECT_EQ(r2.misplaced, int64_t(32) * 1000 * 2 * 15 * 8 * 72);
}

TEST(Presets, SwizzledWriterAgainstLinearReaderDisagreesOnVScalesOnly) {
  const DimsOverride d{1, 4, 16, 8, 128};
  const CompareReport r = compare(preset("flashinfer-trtllm-gen-hnd", d), preset("flashinfer-hnd", d));
  EXPECT_FALSE(r.agree);
  EXPECT_EQ(r.misplaced_per_region[0], 0);
  EXPECT_EQ(r.misplaced_per_region[1], 0);
  EXPECT_EQ(r.misplaced_per_region[2], 0);
  EXPECT_GT(r.misplaced_per_region[3], 0);
  EXPECT_TRUE(compare(preset("vllm-legacy-hnd-writer-upstream", d), preset("vllm-packed-hnd-reader-sm100", d)).agree);
}

// vLLM issue #50084: upstream's writer interleaves V scales on every GPU, SM120's
// readers take them linear. compare names V scales and nothing else; the pairs
// of one GPU path agree. Counts and the example byte are issue 13's, measured by
// running vLLM's own writer arithmetic: 360 of 6912 at 1 head x D 128 x N 16 x
// 3 pages, 2880 of 55296 at 8 heads; V scale (page 0, token 0, head 0, group 1)
// is byte 2180 in the writer and 2177 where the linear reader looks.
TEST(Presets, VllmUpstreamWriterAgainstSm120ReaderIsIssue50084) {
  for (const char* cache : {"legacy-hnd", "packed-hnd", "legacy-nhd"}) {
    const std::string v = std::string("vllm-") + cache;
    for (int64_t heads : {1, 8}) {
      SCOPED_TRACE(v + " H" + std::to_string(heads));
      const DimsOverride d{1, 3, 16, heads, 128};
      const auto vllm = [&](const char* role_path) { return preset((v + role_path).c_str(), d); };
      const CompareReport r = compare(vllm("-writer-upstream"), vllm("-reader-sm120"));
      EXPECT_EQ(r.elements, 6912 * heads);
      EXPECT_EQ(r.misplaced, 360 * heads);
      EXPECT_EQ(r.misplaced_per_region[size_t(Region::kVScale)], r.misplaced);
      EXPECT_NE(r.summary("w", "r").find("v_scale " + std::to_string(360 * heads) + ")"), std::string::npos);
      EXPECT_TRUE(compare(vllm("-writer-sm12x"), vllm("-reader-sm120")).agree);
      if (v != "vllm-legacy-nhd") {  // SM100 reads HND only (vLLM requires it there)
        EXPECT_TRUE(compare(vllm("-writer-upstream"), vllm("-reader-sm100")).agree);
      }
    }
  }
  const DimsOverride one{1, 3, 16, 1, 128};
  const CompareReport r =
      compare(preset("vllm-legacy-hnd-writer-upstream", one), preset("vllm-legacy-hnd-reader-sm120", one));
  ASSERT_FALSE(r.examples.empty());
  const Misplacement& m = r.examples[0];
  EXPECT_EQ(m.region, Region::kVScale);
  EXPECT_EQ(describe_element(m.region, m.coord), "v_scale[layer 0, page 0, token 0, head 0, group 1]");
  EXPECT_EQ(m.writer_byte, 2180);
  EXPECT_EQ(m.reader_byte, 2177);
}

// The names before the split keep loading the bytes they always described
// (linear V scales), under the preset that now holds them.
TEST(Presets, FormerNamesLoadTheBytesTheyAlwaysDescribed) {
  const DimsOverride d{2, 3, 16, 2, 128};
  for (const auto& [former, now] : std::vector<std::pair<std::string, std::string>>{
           {"vllm-legacy-hnd", "vllm-legacy-hnd-writer-sm12x"},
           {"vllm-legacy-nhd", "vllm-legacy-nhd-writer-sm12x"},
           {"vllm-packed-hnd", "vllm-packed-hnd-writer-sm12x"},
           {"vllm-packed-nhd-writer", "vllm-packed-nhd-writer-sm12x"},
           {"vllm-packed-nhd-reader", "vllm-packed-nhd-reader-sm120"}}) {
    ASSERT_TRUE(is_preset_name(former)) << former;
    const Layout l = instantiate(load_spec(former), d);
    EXPECT_EQ(l.name, now);
    EXPECT_EQ(to_json(l), to_json(preset(now.c_str(), d)));
    bool listed = false;
    for (const PresetInfo& p : list_presets())
      listed |= p.name == now && std::count(p.former_names.begin(), p.former_names.end(), former) == 1;
    EXPECT_TRUE(listed) << former;
  }
  // Linear V scales, as before: K's and V's scale planes have the same shape.
  const Layout l = instantiate(load_spec("vllm-legacy-hnd"), d);
  EXPECT_EQ(l.region(Region::kVScale).token, l.region(Region::kKScale).token);
  EXPECT_EQ(l.region(Region::kVScale).column, Mode(1));
}

// At D 96 (sd = 6, sd/4 = 1) vLLM's interleave leaves its (page, head) plane: the
// upstream writer is still describable, and check rejects it naming two V scales
// that share a byte, and the bytes that leave the allocation.
TEST(Presets, VllmUpstreamWriterAtHeadDim96IsRejectedWithTheByte) {
  for (const char* name : {"vllm-legacy-hnd-writer-upstream", "vllm-legacy-nhd-writer-upstream",
                           "vllm-packed-hnd-writer-upstream", "vllm-legacy-hnd-reader-sm100"}) {
    SCOPED_TRACE(name);
    const Layout l = preset(name, {1, 3, 16, 2, 96});
    const CheckReport r = expect_two_v_scales_share_a_byte(l);
    const testing::BruteForce bf = testing::brute_force(l);
    EXPECT_TRUE(bf.overlap && bf.out_of_bounds);
    bool outside = false;
    for (const std::string& p : r.problems) outside |= p.find("is outside buffer \"kv\"") != std::string::npos;
    EXPECT_TRUE(outside) << r.summary();
  }
  // Issue 13 measured vLLM's own writer arithmetic at 4 heads x D 96 x N 16 x 3 pages:
  // 8 (HND) / 32 (NHD) bytes outside the allocation, 752 / 704 elements sharing a byte.
  const auto damage = [](const Layout& l) {
    std::map<int64_t, int64_t> owners;
    for (Region r : kAllRegions)
      for (Coord c; c.page < l.dims.pages; ++c.page)
        for (c.head = 0; c.head < l.dims.heads; ++c.head)
          for (c.token = 0; c.token < l.dims.tokens_per_page; ++c.token)
            for (c.column = 0; c.column < l.dims.columns(r); ++c.column) ++owners[l.offset(r, c)];
    std::pair<int64_t, int64_t> outside_and_shared{0, 0};
    for (auto [byte, n] : owners) {
      outside_and_shared.first += byte >= l.buffers[0].bytes;
      outside_and_shared.second += n > 1 ? n : 0;
    }
    return outside_and_shared;
  };
  using Damage = std::pair<int64_t, int64_t>;
  EXPECT_EQ(damage(preset("vllm-legacy-hnd-writer-upstream", {1, 3, 16, 4, 96})), Damage(8, 752));
  EXPECT_EQ(damage(preset("vllm-legacy-nhd-writer-upstream", {1, 3, 16, 4, 96})), Damage(32, 704));
  // The linear SM12x writer is sound there, and below D 64 the interleave cannot be formed.
  EXPECT_TRUE(check(preset("vllm-legacy-hnd-writer-sm12x", {1, 3, 16, 2, 96})).report.ok);
  EXPECT_THROW(preset("vllm-legacy-hnd-writer-upstream", {1, 3, 16, 2, 48}), LayoutError);
}

// A page size the 4-token interleave does not divide pushes the last tokens'
// scales out of their plane: check finds it, with the elements and the byte.
TEST(Presets, InterleaveOutsideItsPlaneIsRejected) {
  const CheckReport r = check(preset("trtllm", {1, 2, 6, 2, 128})).report;
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(r.problems[0].find("share byte") != std::string::npos ||
              r.problems[0].find("outside buffer") != std::string::npos)
      << r.problems[0];
}

// Native layout version 2 is version 1's places with the fp16-split code order; every
// engine's preset keeps the standard order (what their kernels write). compare() sees the two
// native versions place every byte alike and still disagree, for the bits inside the bytes,
// so a cache written by one is never silently read by the other.
TEST(Presets, NativeVersionTwoIsVersionOnesPlacesInTheFp16SplitOrder) {
  for (const PresetInfo& p : list_presets()) {
    const Layout l = preset(p.name.c_str(), {1, 3, 16, 2, 128});
    const bool native_v2 = p.name == "nvfp4kv-native" || p.name == "nvfp4kv-native-layers";
    EXPECT_EQ(code_order_name(l.codes), native_v2 ? "fp16-split" : "standard") << p.name;
  }
  for (const std::string name : {"nvfp4kv-native", "nvfp4kv-native-layers"})
    for (int64_t n : {1, 3, 16, 64})
      for (int64_t dim : {64, 80, 128, 256}) {
        const Layout v2 = preset(name.c_str(), {2, 3, n, 3, dim}), v1 = preset((name + "-v1").c_str(), {2, 3, n, 3, dim});
        EXPECT_TRUE(check(v2).report.ok) << name << " N " << n << " D " << dim;
        EXPECT_EQ(v2.total_bytes(), v1.total_bytes());
        const CompareReport r = compare(v1, v2);
        EXPECT_EQ(r.misplaced, 0) << name << " N " << n << " D " << dim;
        EXPECT_FALSE(r.codes_agree);
        EXPECT_FALSE(r.agree);
      }
}

// The proof's work is bounded by construction: it enumerates one (page, head) cell's elements per
// plane, never the allocation, and the count it reports is what it did (no clock asserted).
TEST(Check, SixtyFourLayersTwoHundredThousandPagesFromOneCellsElements) {
  const int64_t cell = 2 * 16 * 72;  // K and V, 16 tokens, 72 bytes of data and scales
  for (const char* name : {"nvfp4kv-native-layers", "vllm-legacy-hnd-writer-upstream", "flashinfer-nhd", "trtllm"}) {
    const Layout l = preset(name, {64, 200000, 16, 8, 128});
    const CheckReport r = check(l).report;
    EXPECT_TRUE(r.ok) << name << ": " << r.summary();
    EXPECT_EQ(r.elements, int64_t(64) * 200000 * 2 * 8 * 16 * 72);
    EXPECT_LE(r.elements_enumerated, 8 * cell) << name;  // at most the 8 heads of one page
  }
  // A head-outermost allocation ([H][pages][N][D/2]) is proved by peeling heads too.
  Layout l = preset("flashinfer-hnd", {64, 200000, 16, 8, 128});
  for (auto& m : l.regions) {
    const int64_t row = m.token.stride * 16;  // N * row bytes
    m.head = row * 200000;
    m.page = row;
  }
  const CheckReport r = check(l).report;
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_LE(r.elements_enumerated, 8 * cell);
  // Break one stride by one byte: a collision between pages at the far end must be found.
  l.regions[2].page -= 1;
  EXPECT_FALSE(check(l).report.ok);
}

}  // namespace
}  // namespace nvfp4kv
