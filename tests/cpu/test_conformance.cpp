// The conformance kit against foreign writers and readers, each simulated from its
// engine's own index arithmetic (engine_formulas.hpp) and its own rounding: what
// check-write and check-read say must be what those engines do.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <unordered_set>

#include "engine_formulas.hpp"
#include "nvfp4kv/conformance/check.hpp"
#include "nvfp4kv/conformance/npy.hpp"
#include "nvfp4kv/reference/attention.hpp"

namespace nvfp4kv::conformance {
namespace {

using engines::Place;
using engines::Transcription;

ValidLayout layout_of(const char* name, int64_t heads = 2, int64_t pages = 16, int64_t n = 16, int64_t dim = 128) {
  return validate(instantiate(preset_spec(name), {1, pages, n, heads, dim}));
}

// How an engine rounds one block, given nvfp4kv's global scale gs (a dequant multiplier).
using Quantizer = std::function<QuantizedBlock(const float* x, float gs)>;

// FlashInfer's / vLLM's cvt_warp_fp16_to_fp4, transcribed: the engine is given the
// quant multiplier global_sf = 1 / gs; reciprocals as the IEEE operations.
QuantizedBlock engine_reciprocal_multiply(const float* x, float gs) {
  const float global_sf = 1.0f / gs;
  float vec_max = 0;
  for (int i = 0; i < kBlockSize; ++i) vec_max = std::fmax(vec_max, std::fabs(x[i]));
  const float sf_value = global_sf * (vec_max * (1.0f / 6.0f));
  QuantizedBlock q{};
  q.scale = e4m3_encode(sf_value);  // __nv_fp8_e4m3(SFValue): round to nearest even, saturating
  const float output_scale = q.scale == 0 ? 0.0f : 1.0f / (e4m3_decode(q.scale) * (1.0f / global_sf));
  for (int i = 0; i < kBlockSize; i += 2)  // cvt.rn.satfinite.e2m1x2.f32
    q.packed[i / 2] = uint8_t(e2m1_code(x[i] * output_scale) | e2m1_code(x[i + 1] * output_scale) << 4);
  return q;
}

// nvfp4kv's rule with the reciprocal one ulp high, as an approximate reciprocal
// (--use_fast_math) may return it.
QuantizedBlock engine_fast_math(const float* x, float gs) {
  QuantizedBlock q = quantize_block(x, gs, ScaleRule::kStandard);
  const float inv = std::nextafter(1.0f / (e4m3_decode(q.scale) * gs), 1e30f);
  for (int i = 0; i < kBlockSize; i += 2)
    q.packed[i / 2] = uint8_t(e2m1_code(x[i] * inv) | e2m1_code(x[i + 1] * inv) << 4);
  return q;
}

QuantizedBlock engine_nvfp4kv(const float* x, float gs) { return quantize_block(x, gs, ScaleRule::kStandard); }

// A foreign writer: the kit's stored rows, row by row, head by head, K then V, each
// block rounded by `quantize` and each byte put where `place` says, into buffers
// named and sized like the layout's and filled with kPoison.
std::vector<std::vector<uint8_t>> foreign_write(const Kit& kit, const Transcription& place, const Quantizer& quantize) {
  const Layout& l = kit.layout();
  const CacheDims& d = l.dims;
  std::vector<std::vector<uint8_t>> out;
  for (const Buffer& b : l.buffers) out.emplace_back(size_t(b.bytes), kPoison);
  const auto put = [&](const Place& p, uint8_t byte) {
    for (size_t i = 0; i < l.buffers.size(); ++i)
      if (l.buffers[i].name == p.buffer && p.byte >= 0 && p.byte < int64_t(out[i].size())) out[i][size_t(p.byte)] = byte;
  };
  for (int64_t row = 0; row < kit.rows; ++row) {
    const auto cell = kit.cell(row);
    if (!cell) continue;
    for (int64_t h = 0; h < d.heads; ++h)
      for (Side side : {Side::kK, Side::kV})
        for (int64_t g = 0; g < d.scale_bytes(); ++g) {
          float x[kBlockSize];
          kit.block_values({row, h, side, g}, x);
          const QuantizedBlock q = quantize(x, kit.global_scale(side));
          const SideRegions reg = side_regions(side);
          for (int64_t j = 0; j < 8; ++j)
            put(place(reg.data, {kit.options.layer, cell->first, cell->second, h, g * 8 + j}, d), q.packed[j]);
          put(place(reg.scale, {kit.options.layer, cell->first, cell->second, h, g}, d), q.scale);
        }
  }
  return out;
}

// A foreign reader: the kit's sequences dequantized into dense rows, each element's
// code and scale taken where `place` says.
std::pair<std::vector<float>, std::vector<float>> foreign_read(const Kit& kit, const Transcription& place) {
  const Layout& l = kit.layout();
  const CacheDims& d = l.dims;
  const auto byte = [&](const Place& p) {
    for (size_t i = 0; i < l.buffers.size(); ++i)
      if (l.buffers[i].name == p.buffer) return kit.cache[i].at(size_t(p.byte));
    ADD_FAILURE() << "no buffer " << p.buffer;
    return uint8_t(0);
  };
  std::vector<float> k(kit.read_k.size()), v(k.size());
  for (const KitSequence& s : kit.sequences)
    for (int64_t t = 0; t < s.length; ++t)
      for (Side side : {Side::kK, Side::kV})
        for (int64_t h = 0; h < d.heads; ++h)
          for (int64_t e = 0; e < d.head_dim; ++e) {
            const SideRegions reg = side_regions(side);
            const int64_t page = s.pages[size_t(t / d.tokens_per_page)], tok = t % d.tokens_per_page;
            const uint8_t data = byte(place(reg.data, {kit.options.layer, page, tok, h, e / 2}, d));
            const uint8_t scale = byte(place(reg.scale, {kit.options.layer, page, tok, h, e / 16}, d));
            (side == Side::kK ? k : v)[size_t(((s.first_read_row + t) * d.heads + h) * d.head_dim + e)] =
                dequantize_element(data, int(e % 2), scale, kit.global_scale(side));
          }
  return {k, v};
}

Transcription engine(const char* preset) { return engines::transcriptions().at(preset); }

// Whether two region maps place every element of one (layer, page range) alike.
bool same_places(const RegionMap& a, const RegionMap& b, const CacheDims& d, Region r) {
  for (Coord c; c.page < d.pages; ++c.page)
    for (c.head = 0; c.head < d.heads; ++c.head)
      for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
        for (c.column = 0; c.column < d.columns(r); ++c.column)
          if (a.buffer != b.buffer || region_offset(a, c) != region_offset(b, c)) return false;
  return true;
}

std::string all_differences(const std::vector<MapDifference>& diffs) {
  std::string s;
  for (const MapDifference& m : diffs) s += m.text("the layout") + "\n";
  return s;
}

TEST(ConformanceKit, SignaturesAreExactUniqueAndCarryRoundingProbes) {
  for (ElementType type : {ElementType::kBFloat16, ElementType::kFloat16})
    for (int64_t dim : {64, 128, 256}) {
      const ValidLayout l = layout_of("vllm-packed-nhd-rows", 2, 24, 16, dim);
      KitOptions o;
      o.type = type;
      const Kit kit = generate(l, o);
      SCOPED_TRACE(std::string(element_type_name(type)) + " D " + std::to_string(dim));
      EXPECT_TRUE(kit.scale_rows_unique);
      EXPECT_GT(kit.probe_blocks, 0);
      EXPECT_GT(kit.bytes_differing[size_t(RoundingPolicy::kReciprocalMultiply)], 0);
      // Every data key (bytes 0..6) is unique over the kit, under every policy.
      std::unordered_set<uint64_t> keys;
      for (int64_t b = 0; b < kit.block_count(); ++b) {
        float x[kBlockSize];
        const BlockId id = kit.block(b);
        kit.block_values(id, x);
        uint64_t key[kRoundingPolicyCount] = {};
        for (int p = 0; p < 2; ++p) {
          const QuantizedBlock q = quantize_block_as(RoundingPolicy(p), x, kit.global_scale(id.side));
          for (int j = 0; j < 7; ++j) key[p] |= uint64_t(q.packed[j]) << (8 * j);
          EXPECT_NE(q.scale, kPoison);
          for (uint8_t byte : q.packed) EXPECT_NE(byte, kPoison);
        }
        EXPECT_EQ(key[0], key[1]);
        EXPECT_TRUE(keys.insert(key[0]).second) << "block " << b;
      }
      // Every probe singles out its token.
      for (uint8_t isolates : kit.probe_isolates) EXPECT_TRUE(isolates);
      // No stored byte is the poison; the poison fills what no row owns.
      int64_t poison = 0;
      for (const auto& buf : kit.cache)
        for (uint8_t byte : buf) poison += byte == kPoison;
      EXPECT_GT(poison, 0);
    }
}

TEST(ConformanceKit, FilesLoadBackAndRefuseAnotherLayoutOrAModifiedCache) {
  const ValidLayout l = layout_of("vllm-packed-nhd-rows");
  const Kit kit = generate(l, {});
  const std::string dir = (std::filesystem::temp_directory_path() / "nvfp4kv-kit-test").string();
  std::filesystem::remove_all(dir);
  write_kit(kit, dir);
  EXPECT_EQ(load_kit(dir, l).cache, kit.cache);
  const NpyArray k = read_npy(dir + "/k.npy");
  EXPECT_EQ(k.descr, "<u2");
  EXPECT_EQ(k.shape, (std::vector<int64_t>{kit.rows, 2, 128}));
  const std::vector<float> kf = npy_to_floats(read_npy(dir + "/k.f32.npy"), "k");
  EXPECT_EQ(npy_to_floats(k, "k"), kf);
  EXPECT_THROW(load_kit(dir, layout_of("flashinfer-nhd")), Error);
  {
    std::fstream f(dir + "/cache/kv.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put(char(0x11));
  }
  EXPECT_THROW(load_kit(dir, l), Error);
  std::filesystem::remove_all(dir);
}

TEST(ConformanceKit, RefusesFormatsItsSignaturesCannotCarry) {
  const ValidLayout plain = layout_of("nvfp4kv-native-v1");
  CacheFormat f;
  f.layers = {LayerFormat{}};
  EXPECT_NO_THROW(generate(with_format(plain, f), {}));  // an explicit plain format is plain
  f.layers[0].k.rotation = 32;
  try {
    generate(with_format(plain, f), {});
    ADD_FAILURE() << "a kit was generated for a rotated cache";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("conformance kits cover plain NVFP4"), std::string::npos) << e.what();
  }
  f.layers[0].k.rotation = kNoRotation;
  f.layers[0].v.rule = ScaleRule::kFourOverSix;
  EXPECT_THROW(generate(with_format(plain, f), {}), ArgumentError);
  // mu or lambda alone, in a format without per-layer entries (they are the cache's), rewrite
  // the stored codes as much: refused too.
  const CacheDims& d = plain.layout().dims;
  CacheFormat mu_only, lambda_only;
  mu_only.k_mean.assign(size_t(d.layers * d.heads * d.head_dim), 0.5f);
  lambda_only.k_channel_scale.assign(size_t(d.layers * d.heads * d.head_dim), 2.0f);
  for (const CacheFormat& g : {mu_only, lambda_only}) {
    ASSERT_TRUE(g.implicit());
    EXPECT_THROW(generate(with_format(plain, g), {}), ArgumentError);
  }
}

TEST(CheckWrite, TheReferenceStoreIsExact) {
  const Kit kit = generate(layout_of("nvfp4kv-native-v1"), {});
  const WriteReport r = check_write(kit, kit.cache);
  EXPECT_TRUE(r.ok()) << r.text();
  for (const RegionWriteReport& x : r.regions) {
    EXPECT_EQ(x.verdict, RegionVerdict::kExact);
    EXPECT_EQ(x.exact, x.bytes);
  }
  EXPECT_FALSE(r.writer_layout);
}

TEST(CheckWrite, AReciprocalMultiplyWriterIsRoundingOnly) {
  // FlashInfer's own NHD tensors and its own rounding.
  const Kit kit = generate(layout_of("flashinfer-nhd"), {});
  const WriteReport r = check_write(kit, foreign_write(kit, engine("flashinfer-nhd"), engine_reciprocal_multiply));
  EXPECT_TRUE(r.ok()) << r.text();
  int64_t rounding = 0;
  for (const RegionWriteReport& x : r.regions) {
    EXPECT_NE(x.verdict, RegionVerdict::kMisplaced) << region_name(x.region);
    if (x.rounding > 0) {
      EXPECT_EQ(x.policy, RoundingPolicy::kReciprocalMultiply) << region_name(x.region);
    }
    rounding += x.rounding;
  }
  const RegionWriteReport& kd = r.regions[size_t(Region::kKData)];
  EXPECT_EQ(kd.verdict, RegionVerdict::kRoundingOnly);
  EXPECT_GT(rounding, 0);
  EXPECT_LT(double(kd.rounding) / double(kd.bytes), 0.02);  // one byte in some probe blocks
  EXPECT_NE(r.text().find("rounding-only (reciprocal-multiply)"), std::string::npos) << r.text();
}

TEST(CheckWrite, AFastMathWriterIsRoundingOnly) {
  const Kit kit = generate(layout_of("vllm-legacy-hnd-writer-sm12x"), {});
  const WriteReport r = check_write(kit, foreign_write(kit, engine("vllm-legacy-hnd-writer-sm12x"), engine_fast_math));
  EXPECT_TRUE(r.ok()) << r.text();
  int64_t rounding = 0;
  for (const RegionWriteReport& x : r.regions) {
    rounding += x.rounding;
    if (x.rounding > 0) {
      EXPECT_EQ(x.policy, RoundingPolicy::kFastMathDivision);
    }
  }
  EXPECT_GT(rounding, 0);
}

TEST(CheckWrite, VllmTokenMajorWriterIsMisplacedAndItsMapInferred) {
  // The packed NHD tensor (B, N, 2H, F) as a configurator describes it, and vLLM's
  // writer, which takes its NHD strides from H heads, not the 2H slots of a row.
  const ValidLayout l = layout_of("vllm-packed-nhd-rows");
  const Kit kit = generate(l, {});
  const WriteReport r = check_write(kit, foreign_write(kit, engine("vllm-packed-nhd-writer-sm12x"), engine_nvfp4kv));
  ASSERT_FALSE(r.ok());
  const std::string diffs = all_differences(r.differences);
  for (const RegionWriteReport& x : r.regions) {
    EXPECT_EQ(x.verdict, RegionVerdict::kMisplaced) << region_name(x.region);
    EXPECT_GT(x.found_elsewhere, 0) << region_name(x.region);
    ASSERT_TRUE(x.writer_map && x.writer_map->fitted) << region_name(x.region);
    EXPECT_EQ(x.writer_map->explained, x.writer_map->observations) << region_name(x.region);
  }
  EXPECT_NE(diffs.find("k_data token stride is 128 (H*dd), the layout says 288 (2*H*F)"), std::string::npos) << diffs;
  EXPECT_NE(diffs.find("k_scale offset is 2048 (H*N*dd)"), std::string::npos) << diffs;
  // The writer's V writes land on the K rows that follow: found nowhere afterwards.
  EXPECT_GT(r.regions[size_t(Region::kVData)].not_found, 0);
  // What was inferred is vLLM's writer, region by region.
  ASSERT_TRUE(r.writer_layout);
  const Layout vllm = instantiate(preset_spec("vllm-packed-nhd-writer-sm12x"), {1, 16, 16, 2, 128});
  for (Region reg : kAllRegions)
    EXPECT_TRUE(same_places(r.writer_layout->region(reg), vllm.region(reg), l.layout().dims, reg)) << region_name(reg);
  EXPECT_NE(r.writer_layout_check.find("REJECTED"), std::string::npos) << r.writer_layout_check;
  EXPECT_NE(r.text().find("check-write: FAIL"), std::string::npos);
}

// A writer whose one region lands nowhere the kit can see (its V scales never written):
// that region's map cannot be inferred, so no layout of the writer's map is offered, and
// the report says which region stopped it.
TEST(CheckWrite, NoWriterLayoutUnlessEveryMisplacedRegionWasInferred) {
  const Kit kit = generate(layout_of("flashinfer-nhd"), {});
  const Transcription flashinfer = engine("flashinfer-nhd");
  const Transcription no_v_scales = [&](Region r, const Coord& c, const CacheDims& d) {
    return r == Region::kVScale ? Place{"no such buffer", 0} : flashinfer(r, c, d);
  };
  const WriteReport r = check_write(kit, foreign_write(kit, no_v_scales, engine_nvfp4kv));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.regions[size_t(Region::kVScale)].verdict, RegionVerdict::kMisplaced);
  EXPECT_EQ(r.regions[size_t(Region::kVScale)].not_found, r.regions[size_t(Region::kVScale)].bytes);
  for (Region reg : {Region::kKData, Region::kKScale, Region::kVData})
    EXPECT_EQ(r.regions[size_t(reg)].verdict, RegionVerdict::kExact) << region_name(reg);
  EXPECT_EQ(r.not_inferred, std::vector<Region>{Region::kVScale});
  EXPECT_FALSE(r.writer_layout);
  EXPECT_NE(r.text().find("no layout of the writer's map: the map of v_scale could not be inferred"), std::string::npos)
      << r.text();
  EXPECT_NE(r.json().find(R"("not_inferred":["v_scale"])"), std::string::npos) << r.json();
}

// Only the K scales misplaced (each block's at another group's byte), the codes rounded the
// FlashInfer way beside the writer's own scales: the data is where the layout says, so k_data
// is rounding-only and k_scale alone is misplaced, as with nvfp4kv's own rounding.
TEST(CheckWrite, DataPlacementIsJudgedApartFromItsScale) {
  const Kit kit = generate(layout_of("flashinfer-nhd"), {});
  const Transcription flashinfer = engine("flashinfer-nhd");
  const Transcription k_scales_reversed = [&](Region r, const Coord& c, const CacheDims& d) {
    Coord at = c;
    if (r == Region::kKScale) at.column = d.scale_bytes() - 1 - c.column;
    return flashinfer(r, at, d);
  };
  for (const auto& [name, quantizer] : {std::pair{"reciprocal-multiply", Quantizer(engine_reciprocal_multiply)},
                                        {"nvfp4kv", Quantizer(engine_nvfp4kv)}}) {
    SCOPED_TRACE(name);
    const WriteReport r = check_write(kit, foreign_write(kit, k_scales_reversed, quantizer));
    EXPECT_EQ(r.regions[size_t(Region::kKScale)].verdict, RegionVerdict::kMisplaced);
    EXPECT_GT(r.regions[size_t(Region::kKScale)].wrong, 0);
    const RegionWriteReport& kd = r.regions[size_t(Region::kKData)];
    EXPECT_EQ(kd.wrong, 0) << r.text();
    EXPECT_NE(kd.verdict, RegionVerdict::kMisplaced) << r.text();
    if (std::string(name) == "nvfp4kv") {
      EXPECT_EQ(kd.verdict, RegionVerdict::kExact);
    } else {
      EXPECT_EQ(kd.verdict, RegionVerdict::kRoundingOnly);
      EXPECT_EQ(kd.policy, RoundingPolicy::kReciprocalMultiply);
    }
  }
}

TEST(CheckWrite, InterleavedVScalesAgainstALinearLayoutAreNamed) {
  // vLLM upstream's writer swizzles V scales on every GPU; the SM12x layout is linear.
  const ValidLayout l = layout_of("vllm-legacy-hnd-writer-sm12x");
  const Kit kit = generate(l, {});
  const WriteReport r = check_write(kit, foreign_write(kit, engine("vllm-legacy-hnd-writer-upstream"), engine_nvfp4kv));
  ASSERT_FALSE(r.ok());
  for (Region reg : {Region::kKData, Region::kKScale, Region::kVData})
    EXPECT_EQ(r.regions[size_t(reg)].verdict, RegionVerdict::kExact) << region_name(reg);
  const RegionWriteReport& vs = r.regions[size_t(Region::kVScale)];
  EXPECT_EQ(vs.verdict, RegionVerdict::kMisplaced);
  EXPECT_EQ(vs.found_elsewhere, vs.wrong);  // every misplaced V scale found
  const std::string diffs = all_differences(r.differences);
  EXPECT_NE(diffs.find("V scales are in the 4-token interleave"), std::string::npos) << diffs;
  const Layout up = instantiate(preset_spec("vllm-legacy-hnd-writer-upstream"), {1, 16, 16, 2, 128});
  EXPECT_TRUE(same_places(r.writer_layout->region(Region::kVScale), up.region(Region::kVScale), l.layout().dims, Region::kVScale));
  EXPECT_TRUE(check(*r.writer_layout).report.ok);  // sound, just not this layout
}

TEST(CheckWrite, BytesOutsideTheRowsCellsAndPaddingRowsAreListed) {
  // N 3, D 80: each data plane of 120 bytes is padded to 128, so some bytes are no element's.
  const ValidLayout l = validate(instantiate(preset_spec("nvfp4kv-native-v1"), {1, 40, 3, 2, 80}));
  const Kit kit = generate(l, {});
  std::vector<std::vector<uint8_t>> dump = kit.cache;
  int64_t gap = -1, unstored = -1;
  const ByteOwners owners(l.layout());
  for (int64_t o = 0; o < int64_t(dump[0].size()) && (gap < 0 || unstored < 0); ++o) {
    const auto e = owners.owner({0, o});
    if (!e && gap < 0) gap = o;
    if (e && unstored < 0 && dump[0][size_t(o)] == kPoison) unstored = o;
  }
  ASSERT_GE(gap, 0);
  ASSERT_GE(unstored, 0);
  dump[0][size_t(gap)] = 0x12;
  dump[0][size_t(unstored)] = 0x34;
  dump[0][size_t(unstored + 1)] = 0x35;
  // A writer that stores padding row 0 into the cell of... an unstored slot.
  float x[kBlockSize];
  kit.block_values({0, 0, Side::kK, 0}, x);
  const QuantizedBlock q = quantize_block(x, kit.k_global_scale, ScaleRule::kStandard);
  std::copy(q.packed, q.packed + 8, dump[0].begin() + unstored + 40);
  const WriteReport r = check_write(kit, dump);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.outside_bytes, 1);
  ASSERT_EQ(r.outside_cells.size(), 1u);
  EXPECT_EQ(r.outside_cells[0].first.byte, gap);
  EXPECT_GE(r.unstored_bytes, 2);
  EXPECT_EQ(r.unstored_cells[0].first.byte, unstored);
  EXPECT_NE(r.unstored_cells[0].owner.find("k_data[layer 0"), std::string::npos) << r.unstored_cells[0].owner;
  EXPECT_EQ(r.padding_rows_written, std::vector<int64_t>{0});
  for (const RegionWriteReport& x : r.regions) EXPECT_EQ(x.verdict, RegionVerdict::kExact);
}

TEST(CheckRead, TheReferenceReaderIsRight) {
  const Kit kit = generate(layout_of("vllm-packed-nhd-rows"), {});
  const ReadReport r = check_read_rows(kit, kit.read_k, kit.read_v);
  EXPECT_TRUE(r.ok()) << r.text();
  const auto [k, v] = foreign_read(kit, engine("vllm-packed-nhd-rows"));
  EXPECT_TRUE(check_read_rows(kit, k, v).ok());
}

TEST(CheckRead, VllmSplitDataScaleOnThePackedNhdCacheNamesTheAliasedBytes) {
  // nvfp4_split_data_scale's views of the packed NHD tensor: data strides scaled by
  // dd/F, scales by sd/F, so token t's data view runs into the scales.
  const ValidLayout l = layout_of("vllm-packed-nhd-rows", 1);
  const Kit kit = generate(l, {});
  const auto [k, v] = foreign_read(kit, engine("vllm-packed-nhd-reader-sm120"));
  const ReadReport r = check_read_rows(kit, k, v, 64);
  ASSERT_FALSE(r.ok());
  const SideReadReport& ks = r.sides[size_t(Side::kK)];
  EXPECT_GT(ks.blocks_misread, 0);
  EXPECT_GT(ks.aliased, 0);
  EXPECT_GT(ks.wrong_data, 0);
  // Token 8 of a page (H 1, D 128, N 16): its data view is bytes 1024.. of the page,
  // the scale view's first bytes, which the layout's rows hold as K data of token 7.
  bool named = false;
  for (const BlockRead& b : r.examples) {
    if (b.side != Side::kK || !b.aliased) continue;
    named = named || b.data_owner.find("_scale[") != std::string::npos || b.scale_owner.find("_data[") != std::string::npos;
  }
  EXPECT_TRUE(named) << r.text();
  ASSERT_TRUE(r.reader_layout) << r.text();
  const Layout vllm = instantiate(preset_spec("vllm-packed-nhd-reader-sm120"), {1, 16, 16, 1, 128});
  EXPECT_TRUE(same_places(r.reader_layout->region(Region::kKData), vllm.region(Region::kKData), l.layout().dims,
                          Region::kKData))
      << r.text();
  EXPECT_NE(r.text().find("aliased data/scale"), std::string::npos);
}

// A reader's decode attention over the probes, its K and V taken through `place`.
std::vector<float> foreign_attention(const Kit& kit, const Transcription& place) {
  const CacheDims& d = kit.dims();
  const auto [k, v] = foreign_read(kit, place);
  const int64_t D = d.head_dim, Hq = kit.q_heads;
  std::vector<float> out(size_t(kit.probes() * Hq * D));
  for (int64_t b = 0; b < kit.probes(); ++b) {
    const KitSequence& s = kit.sequences[size_t(kit.probe_sequence[size_t(b)])];
    std::vector<double> q(size_t(Hq * D)), kd(size_t(s.length * d.heads * D)), vd(kd.size()), o(q.size()), lse(static_cast<size_t>(Hq));
    for (int64_t i = 0; i < Hq * D; ++i) q[size_t(i)] = bf16_to_float(kit.q[size_t(b * Hq * D + i)]);
    for (int64_t i = 0; i < s.length * d.heads * D; ++i) {
      kd[size_t(i)] = k[size_t(s.first_read_row * d.heads * D + i)];
      vd[size_t(i)] = v[size_t(s.first_read_row * d.heads * D + i)];
    }
    reference::attend(q.data(), Hq, kd.data(), vd.data(), s.length, d.heads, D, {kit.softmax_scale}, o.data(), lse.data());
    for (int64_t i = 0; i < Hq * D; ++i) out[size_t(b * Hq * D + i)] = float(o[size_t(i)]);
  }
  return out;
}

TEST(CheckRead, AttentionThroughTheWrongViewIsCaught) {
  const Kit kit = generate(layout_of("vllm-packed-nhd-rows", 1), {});
  const ReadReport right = check_read_attention(kit, foreign_attention(kit, engine("vllm-packed-nhd-rows")));
  EXPECT_TRUE(right.ok()) << right.text();
  const ReadReport wrong = check_read_attention(kit, foreign_attention(kit, engine("vllm-packed-nhd-reader-sm120")));
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.wrong_token + wrong.v_misread + wrong.non_finite + wrong.unidentified + wrong.probe_correct, wrong.probe_rows);
  EXPECT_LT(wrong.probe_correct, wrong.probe_rows);
}

TEST(FitMode, FindsPlainStridesInterleavesAndNothingElse) {
  const auto points = [](const Mode& m, std::initializer_list<int64_t> xs, int64_t c) {
    std::vector<std::pair<int64_t, int64_t>> p;
    for (int64_t x : xs) p.push_back({x, c + m(x)});
    return p;
  };
  EXPECT_EQ(fit_mode(points(Mode(144), {0, 3, 7, 15}, 1000), 16), Mode(144));
  EXPECT_EQ(fit_mode(points(Mode(-8), {2, 5}, 1000), 16), Mode(-8));
  // The 4-token interleave, from any partial set of tokens that pins both strides.
  EXPECT_EQ(fit_mode(points(Mode(4, 1, 32), {0, 1, 2, 3, 4, 9, 15}, 77), 16), Mode(4, 1, 32));
  EXPECT_EQ(fit_mode(points(Mode(4, 1, 32), {0, 1, 2, 3, 4}, 77), 16), Mode(4, 1, 32));  // a page's first tokens
  // Sparse points may fit a smaller inner extent too; the smallest that fits is the answer
  // (fit_region votes over many groups and counts what the winner explains).
  EXPECT_EQ(fit_mode(points(Mode(4, 1, 32), {1, 6, 13}, 77), 16), Mode(2, 15, 16));
  EXPECT_FALSE(fit_mode(points(Mode(4), {5}, 0), 16));  // one point: nothing to fit
  EXPECT_FALSE(fit_mode({{0, 0}, {1, 5}, {2, 7}, {3, 100}}, 4));  // no mode of a 4-extent does this
}

TEST(Npy, WritesWhatNumpyReadsAndReadsItBack) {
  const std::string path = (std::filesystem::temp_directory_path() / "nvfp4kv-npy-test.npy").string();
  write_npy(path, npy_i64({1, -2, 3, 4, 5, 6}, {2, 3}));
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.descr, "<i8");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.bytes.size(), 48u);
  std::ifstream in(path, std::ios::binary);
  std::string head(10, '\0');
  in.read(head.data(), 10);
  EXPECT_EQ(head.substr(0, 6), "\x93NUMPY");
  const size_t header = size_t(uint8_t(head[8])) | size_t(uint8_t(head[9])) << 8;
  EXPECT_EQ((10 + header) % 64, 0u);
  std::ofstream(path, std::ios::binary) << "not npy";
  EXPECT_THROW(read_npy(path), Error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace nvfp4kv::conformance
