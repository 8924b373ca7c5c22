// The layout contract: expressions, the text form, the validator and compare.
#include <gtest/gtest.h>

#include <map>

#include <random>

#include "brute_force.hpp"
#include "nvfp4kv/core/expr.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace {

int64_t eval(const char* text) {
  return evaluate_expression(text, [](std::string_view n) -> std::optional<int64_t> {
    if (n == "H") return 8;
    if (n == "N") return 16;
    return std::nullopt;
  });
}

TEST(Expr, EvaluatesWithPrecedenceAndSymbols) {
  EXPECT_EQ(eval("2*H*N + 3"), 259);
  EXPECT_EQ(eval("(N*8 + 15) / 16 * 16"), 128);
  EXPECT_EQ(eval("-(3 - 10) % 4"), 3);
  EXPECT_EQ(eval(" 7 "), 7);
  EXPECT_THROW(eval("2*Q"), LayoutError);
  EXPECT_THROW(eval("1/0"), LayoutError);
  EXPECT_THROW(eval("9223372036854775807 + 1"), LayoutError);
  EXPECT_THROW(eval("3000000000*3000000000*3"), LayoutError);
  EXPECT_THROW(eval("(1 + 2"), LayoutError);
  EXPECT_THROW(eval("1 +"), LayoutError);
  EXPECT_THROW(eval("1 2"), LayoutError);
  try {
    eval("2*Q");
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown or open size \"Q\""), std::string::npos) << e.what();
  }
}

const char* kTinyLayout = R"({
  "name": "tiny", "dims": {"heads": 2, "head_dim": 32, "tokens_per_page": 4, "pages": 3},
  "buffers": [{"name": "kv", "bytes": "P*2*H*N*F"}],
  "regions": {
    "k_data":  {"offset": 0,               "page": "2*H*N*F", "head": "N*dd", "token": "dd"},
    "k_scale": {"offset": "H*N*dd",        "page": "2*H*N*F", "head": "N*sd", "token": "sd"},
    "v_data":  {"offset": "H*N*F",         "page": "2*H*N*F", "head": "N*dd", "token": "dd"},
    "v_scale": {"offset": "H*N*F+H*N*dd",  "page": "2*H*N*F", "head": "N*sd", "token": "sd"}
  }})";

TEST(LayoutText, ParsesInstantiatesAndPrintsBack) {
  const Layout l = instantiate(parse_layout_spec(kTinyLayout), {});
  EXPECT_EQ(l.dims.heads, 2);
  EXPECT_EQ(l.dims.pages, 3);
  EXPECT_EQ(l.buffers[0].bytes, 3 * 2 * 2 * 4 * 18);
  EXPECT_EQ(l.region(Region::kVScale).offset, 2 * 4 * 18 + 2 * 4 * 16);
  // The printed form loads back to the same layout.
  const Layout again = instantiate(parse_layout_spec(to_json(l)), {});
  EXPECT_EQ(to_json(again), to_json(l));
  // A size the file fixes may be repeated, never contradicted; open ones come from the caller.
  EXPECT_EQ(instantiate(parse_layout_spec(kTinyLayout), {std::nullopt, 3}).dims.pages, 3);
  try {
    instantiate(parse_layout_spec(kTinyLayout), {std::nullopt, 9});
    ADD_FAILURE() << "a contradicting page count was accepted";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("layout \"tiny\" fixes pages 3; --pages 9 contradicts it"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(instantiate(parse_layout_spec(kTinyLayout), {7}).dims.layers, 7);
  EXPECT_EQ(assumed_sizes(parse_layout_spec(kTinyLayout), {}), std::vector<std::string>{"layers 1"});
  EXPECT_TRUE(assumed_sizes(parse_layout_spec(kTinyLayout), {2}).empty());
}

TEST(LayoutText, RejectsBadTextWithAMessage) {
  const auto msg = [](const std::string& text, const DimsOverride& d = {}) {
    try {
      instantiate(parse_layout_spec(text), d);
    } catch (const LayoutError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(msg("{").find("not valid JSON"), std::string::npos);
  std::string t = kTinyLayout;
  EXPECT_NE(msg(std::string(t).replace(t.find("\"token\": \"dd\""), 7, "\"tokn\"")).find("unknown key \"tokn\""),
            std::string::npos);
  EXPECT_NE(msg(std::string(t).replace(t.find("\"heads\": 2, "), 12, "")).find("--heads"), std::string::npos);
  EXPECT_NE(msg(std::string(t).replace(t.find("\"head_dim\": 32"), 14, "\"head_dim\": 40")).find("multiple of 16"),
            std::string::npos);
  EXPECT_NE(msg(std::string(t).replace(t.find("\"k_data\""), 8, "\"k_dat\"")).find("unknown key"), std::string::npos);
}

// The tiny layout; sizes given here replace the ones its text fixes.
Layout tiny(const DimsOverride& d = {}) {
  LayoutSpec spec = parse_layout_spec(kTinyLayout);
  if (d.pages) spec.defaults.pages.reset();
  if (d.heads) spec.defaults.heads.reset();
  if (d.head_dim) spec.defaults.head_dim.reset();
  if (d.tokens_per_page) spec.defaults.tokens_per_page.reset();
  return instantiate(spec, d);
}

TEST(Check, AcceptsASoundLayoutAndReportsAlignment) {
  const CheckResult r = check(tiny());
  ASSERT_TRUE(r.report.ok) << r.report.summary();
  EXPECT_EQ(r.report.elements, 3 * 2 * 4 * (16 + 2) * 2);
  EXPECT_EQ(r.report.access[0].vector_bytes, 16);  // data rows of 16 bytes at multiples of 16
  EXPECT_EQ(r.report.access[1].vector_bytes, 2);   // scale rows of 2 bytes
  EXPECT_TRUE(r.report.access[0].dense_plane);     // each (page, head) plane is N x D/2 bytes, no gap
  EXPECT_EQ(r.report.access[1].plane_align, 8);    // scale planes start at multiples of 8 (N * D/16)
  ASSERT_TRUE(r.valid.has_value());
  EXPECT_EQ(r.valid->view().offset(Region::kKScale, {0, 1, 2, 1, 1}), 2 * 2 * 4 * 18 + 2 * 4 * 16 + 1 * 8 + 2 * 2 + 1);
}

TEST(Check, RejectsOutOfBoundsNamingTheElement) {
  Layout l = tiny();
  l.buffers[0].bytes -= 1;
  const CheckReport r = check(l).report;
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.problems[0], "v_scale[layer 0, page 2, token 3, head 1, group 1] at byte " +
                               std::to_string(l.buffers[0].bytes) + " is outside buffer \"kv\" of " +
                               std::to_string(l.buffers[0].bytes) + " bytes");
}

TEST(Check, FindsCollisionsBetweenPages) {
  Layout l = tiny();
  for (auto& m : l.regions) m.page -= 1;  // each page one byte short: page 1 starts on page 0's last byte
  const CheckReport r = check(l).report;
  ASSERT_FALSE(r.ok);
  ASSERT_TRUE(r.collision.has_value());
  EXPECT_NE(r.collision->coord_a.page, r.collision->coord_b.page);
  // The two named elements really share the named byte.
  EXPECT_EQ(l.offset(r.collision->a, r.collision->coord_a), r.collision->byte);
  EXPECT_EQ(l.offset(r.collision->b, r.collision->coord_b), r.collision->byte);
}

TEST(Check, ZeroStrideAcrossPagesCollides) {
  Layout l = tiny();
  l.regions[2].page = 0;
  const CheckReport r = check(l).report;
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(l.offset(r.collision->a, r.collision->coord_a), l.offset(r.collision->b, r.collision->coord_b));
}

TEST(Check, RejectsNegativeStridesAndBadModes) {
  Layout l = tiny();
  l.regions[0].token = -16;
  EXPECT_NE(check(l).report.problems[0].find("negative token stride"), std::string::npos);
  l = tiny();
  l.regions[3].token = Mode(0, 1, 8);  // not even evaluable: x % 0
  EXPECT_NE(check(l).report.problems[0].find("v_scale: the token mode's inner extent must be >= 1, got 0"), std::string::npos);
  l = tiny();
  l.regions[3].column = Mode(2, -1, 4);
  EXPECT_NE(check(l).report.problems[0].find("negative inner column stride"), std::string::npos);
}

// A mode whose inner extent exceeds its coordinate's extent is its inner stride, plainly:
// judged as that stride (never rejected for its spelling) and spelled as one by instantiate
// and check.
TEST(Check, AModeWhoseInnerExceedsItsExtentIsAPlainStride) {
  Layout l = tiny();
  const Mode plain = l.regions[3].token;
  ASSERT_TRUE(plain.is_plain());
  l.regions[3].token = Mode(5, plain.stride, 1000000);  // 4 tokens per page: x % 5 == x
  const CheckResult r = check(l);
  ASSERT_TRUE(r.valid) << r.report.summary();
  EXPECT_EQ(r.valid->layout().regions[3].token, plain);
  ASSERT_TRUE(check(instantiate(preset_spec("trtllm"), {1, 1, 3, 1, 16})).valid);
  // Every preset with a 4-token interleave, at 1 to 3 tokens per page: the verdict is the
  // exhaustive walk's, whatever it is.
  int interleaved = 0;
  for (const PresetInfo& p : list_presets()) {
    bool has_interleave = false;
    for (Region reg : kAllRegions) has_interleave |= instantiate(preset_spec(p.name), {1, 2, 16, 2, 64}).region(reg).token.inner == 4;
    if (!has_interleave) continue;
    ++interleaved;
    for (int64_t n = 1; n <= 3; ++n) {
      const Layout small = instantiate(preset_spec(p.name), {1, 2, n, 2, 64});
      for (Region reg : kAllRegions) EXPECT_TRUE(small.region(reg).token.is_plain()) << p.name << " " << region_name(reg);
      const testing::BruteForce bf = testing::brute_force(small);
      const CheckResult c = check(small);
      EXPECT_EQ(c.valid.has_value(), !bf.overlap && !bf.out_of_bounds) << p.name << " at " << n << ": " << c.report.summary();
      EXPECT_EQ(c.report.summary().find("inner extent"), std::string::npos) << c.report.summary();
    }
  }
  EXPECT_GE(interleaved, 3);
}

TEST(Check, RejectsOffsetsThatOverflow64Bits) {
  Layout l = tiny();
  l.regions[2].page = int64_t(1) << 62;  // page 2 of v_data would sit at 2^63
  const CheckReport r = check(l).report;
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.problems[0].rfind("v_data: offsets reach beyond 4611686018427387904 (2^62) bytes", 0), 0u) << r.problems[0];
  EXPECT_NE(r.problems[0].find("largest term: page 2 x stride 4611686018427387904"), std::string::npos) << r.problems[0];
}

// The scale interleaves are modes. TensorRT-LLM's spelling permutes a contiguous
// N x sd plane at every head dim; FlashInfer/vLLM's agrees with it where
// sd % 4 == 0.
TEST(Modes, InterleavesAsModesMatchTheEnginesFormulas) {
  for (int64_t n : {4, 8, 16, 64})
    for (int64_t d : {16, 32, 48, 64, 80, 96, 128, 256}) {
      const int64_t sd = d / 16;
      RegionMap trt;
      trt.token = Mode(4, 1, 4 * sd);
      trt.column = Mode(4);
      std::vector<int> seen(size_t(n * sd), 0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t g = 0; g < sd; ++g) {
          const int64_t o = region_offset(trt, {0, 0, t, 0, g});
          ASSERT_EQ(o, (t / 4) * 4 * sd + g * 4 + t % 4);
          ASSERT_LT(o, n * sd);
          seen[size_t(o)]++;
        }
      for (int s : seen) ASSERT_EQ(s, 1) << "D " << d << " N " << n;
      if (sd < 4) continue;  // FlashInfer's spelling divides by sd / 4
      RegionMap fi = trt;
      fi.column = Mode(sd / 4, 4, sd);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t g = 0; g < sd; ++g) {
          const int64_t want = ((t / 4) * 4 + g / (sd / 4)) * sd + (g % (sd / 4)) * 4 + t % 4;
          ASSERT_EQ(region_offset(fi, {0, 0, t, 0, g}), want);
          if (sd % 4 == 0) {
            ASSERT_EQ(want, region_offset(trt, {0, 0, t, 0, g}));
          }
        }
    }
}

TEST(Modes, ArgmaxFindsTheLargestOffset) {
  for (const Mode m : {Mode(7), Mode(4, 1, 32), Mode(4, 9, 2), Mode(3, 5, 5), Mode(2, 0, 0)})
    for (int64_t n = 1; n < 20; ++n) {
      int64_t best = 0;
      for (int64_t x = 0; x < n; ++x) best = std::max(best, m(x));
      EXPECT_EQ(m(m.argmax(n)), best) << mode_text(m) << " n " << n;
    }
  EXPECT_EQ(mode_text(Mode(4, 1, 32)), "(4,_):(1,32)");
  EXPECT_EQ(mode_text(Mode(72)), "72");
}

TEST(LayoutText, ModesParseAndPrintBack) {
  std::string t = kTinyLayout;
  const std::string linear_v = R"("head": "N*sd", "token": "sd"})";
  t.replace(t.rfind(linear_v), linear_v.size(), R"("head": "N*sd", "token": {"inner": 4, "stride": [1, "4*sd"]}, "column": 4})");
  const Layout l = instantiate(parse_layout_spec(t), {});
  EXPECT_EQ(l.region(Region::kVScale).token, Mode(4, 1, 8));
  EXPECT_EQ(l.region(Region::kVScale).column, Mode(4));
  EXPECT_EQ(to_json(instantiate(parse_layout_spec(to_json(l)), {})), to_json(l));
  EXPECT_TRUE(check(l).report.ok) << check(l).report.summary();
  // An inner extent that evaluates below 1 is refused when the sizes are bound.
  std::string z = kTinyLayout;
  z.replace(z.rfind(linear_v), linear_v.size(), R"("head": "N*sd", "token": {"inner": "sd/4", "stride": [1, 8]}})");
  try {
    instantiate(parse_layout_spec(z), {});
    ADD_FAILURE() << "accepted an inner extent of 0";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("v_scale.token: inner extent sd/4 = 0 at head dim 32"), std::string::npos)
        << e.what();
  }
}

// Provenance is data the loader keeps: parsed, carried to the Layout, printed
// back by to_json, and refused when a required part is missing or empty.
TEST(LayoutText, ProvenanceIsParsedKeptAndPrintedBack) {
  const std::string prov = R"("provenance": {"engine": "E", "version": "v1", "gpu_path": "SM100", "role": "writer",
    "sources": ["a.cu: f"], "expressions": ["K = t*dd + j", "V = ..."]},)";
  std::string t = kTinyLayout;
  t.insert(t.find("\"buffers\""), prov);
  const Layout l = instantiate(parse_layout_spec(t), {});
  EXPECT_EQ(l.provenance.engine, "E");
  EXPECT_EQ(l.provenance.gpu_path, "SM100");
  EXPECT_EQ(l.provenance.expressions.size(), 2u);
  EXPECT_TRUE(l.provenance.notes.empty());
  const Layout again = instantiate(parse_layout_spec(to_json(l)), {});
  EXPECT_EQ(again.provenance.sources, l.provenance.sources);
  EXPECT_EQ(to_json(again), to_json(l));
  EXPECT_NE(provenance_text(l.provenance, "", true).find("K = t*dd + j"), std::string::npos);
  EXPECT_TRUE(instantiate(parse_layout_spec(kTinyLayout), {}).provenance.empty());
  const auto refused = [&](const std::string& from, const std::string& to, const std::string& why) {
    std::string bad = t;
    bad.replace(bad.find(from), from.size(), to);
    try {
      parse_layout_spec(bad);
      ADD_FAILURE() << "accepted " << to;
    } catch (const LayoutError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(R"("engine": "E", )", "", R"("engine" (text) is required)");
  refused(R"(["a.cu: f"])", "[]", R"("sources" (a non-empty array of text) is required)");
  refused(R"("version": "v1")", R"("version": 1)", "provenance.version: expected non-empty text");
  refused(R"("role": "writer")", R"("rolle": "writer")", R"(unknown key "rolle")");
}

// Random small layouts, most of them broken: check() must agree with the
// exhaustive ownership map every time, and a named collision must be real.
TEST(Check, AgreesWithBruteForceOnRandomLayouts) {
  std::mt19937_64 rng(99);
  int sound = 0, rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
    Layout l;
    l.name = "random";
    l.dims = {pick(1, 3), pick(1, 4), pick(1, 5), pick(1, 3), 16 * pick(1, 2)};
    const int nbuf = int(pick(1, 2));
    for (int b = 0; b < nbuf; ++b) l.buffers.push_back({std::string(1, char('a' + b)), 1, rng() % 2 == 0});
    for (Region r : kAllRegions) {
      RegionMap& m = l.regions[size_t(r)];
      m.buffer = int32_t(pick(0, nbuf - 1));
      const int64_t cols = l.dims.columns(r);
      // Mostly "nearly right" strides so that overlaps are subtle.
      m.column = pick(0, 5) == 0 ? pick(0, 2) : 1;
      m.token = cols * m.column.stride + pick(-2, 2) * (rng() % 3 == 0);
      if (rng() % 20 == 0) m.token = Mode(pick(1, std::min<int64_t>(4, l.dims.tokens_per_page)), pick(0, 3), m.token.stride * pick(1, 3));  // nested, often broken
      m.head = m.token.stride * l.dims.tokens_per_page + pick(-3, 3) * (rng() % 3 == 0);
      m.page = m.head * l.dims.heads * pick(1, 3) + pick(-4, 4) * (rng() % 3 == 0);
      m.layer = l.buffers[size_t(m.buffer)].per_layer ? 0 : m.page * l.dims.pages * pick(1, 2) + pick(-5, 5) * (rng() % 2);
      if (m.token.stride < 0) m.token.stride = 0;
      if (m.head < 0) m.head = 0;
      if (m.page < 0) m.page = 0;
      if (m.layer < 0) m.layer = 0;
      // Usually right after the regions already placed in the same buffer, sometimes anywhere.
      int64_t end = 0;
      for (Region q : kAllRegions) {
        if (q == r) break;
        const RegionMap& o = l.region(q);
        if (o.buffer != m.buffer) continue;
        const Coord last{l.layers_in(l.buffers[size_t(o.buffer)]) - 1, l.dims.pages - 1, o.token.argmax(l.dims.tokens_per_page),
                         l.dims.heads - 1, l.dims.columns(q) - 1};
        end = std::max(end, l.offset(q, last) + 1);
      }
      m.offset = rng() % 4 == 0 ? pick(0, 60) : end + pick(-2, 2) * (rng() % 3 == 0);
      if (m.offset < 0) m.offset = 0;
      if (m.token.stride < 0) m.token.stride = 0;
      if (m.head < 0) m.head = 0;
      if (m.page < 0) m.page = 0;
      if (m.layer < 0) m.layer = 0;
    }
    for (Buffer& b : l.buffers) {
      int64_t need = 1;
      for (Region r : kAllRegions) {
        const RegionMap& m = l.region(r);
        if (l.buffers[size_t(m.buffer)].name != b.name) continue;
        const Coord c{l.layers_in(b) - 1, l.dims.pages - 1, m.token.argmax(l.dims.tokens_per_page), l.dims.heads - 1,
                      l.dims.columns(r) - 1};
        need = std::max(need, l.offset(r, c) + 1);
      }
      b.bytes = std::max<int64_t>(1, need - (rng() % 10 == 0 ? 1 : 0));
    }
    const CheckResult res = check(l);
    const testing::BruteForce bf = testing::brute_force(l);
    ASSERT_EQ(res.report.ok, !bf.overlap && !bf.out_of_bounds)
        << "trial " << trial << ": " << res.report.summary() << "\n" << to_json(l);
    if (res.report.collision) {
      const Collision& c = *res.report.collision;
      ASSERT_EQ(l.offset(c.a, c.coord_a), c.byte) << trial;
      ASSERT_EQ(l.offset(c.b, c.coord_b), c.byte) << trial;
      ASSERT_EQ(l.region(c.a).buffer, l.region(c.b).buffer);
      ASSERT_TRUE(c.a != c.b || c.coord_a.layer != c.coord_b.layer || c.coord_a.page != c.coord_b.page ||
                  c.coord_a.head != c.coord_b.head || c.coord_a.token != c.coord_b.token ||
                  c.coord_a.column != c.coord_b.column);
    }
    (res.report.ok ? sound : rejected)++;
  }
  EXPECT_GT(sound, 200);
  EXPECT_GT(rejected, 300);
}

TEST(Compare, CountsExactlyAcrossPagesAndLayers) {
  const Layout a = tiny({4, 5});
  EXPECT_TRUE(compare(a, a).agree);
  Layout b = a;
  b.regions[1].page += 1;  // k_scale of page p moves by p bytes: only page 0 agrees
  b.buffers[0].bytes += 8;
  const CompareReport r = compare(a, b);
  EXPECT_FALSE(r.agree);
  const int64_t per_page = 2 * 4 * 2;  // heads * tokens * groups
  EXPECT_EQ(r.misplaced, 4 * 4 * per_page);
  EXPECT_EQ(r.misplaced_per_region[1], 4 * 4 * per_page);
  ASSERT_FALSE(r.examples.empty());
  EXPECT_EQ(r.examples[0].region, Region::kKScale);
  EXPECT_EQ(r.examples[0].coord.page, 1);
  EXPECT_EQ(r.examples[0].reader_byte - r.examples[0].writer_byte, 1);
  Layout c = a;
  c.dims.heads = 4;
  EXPECT_THROW(compare(a, c), LayoutError);
}

// Element by element: the count per region, and every misplaced element by its name.
struct ElementwiseComparison {
  std::array<int64_t, kRegionCount> misplaced{};
  std::map<std::string, Misplacement> all;
};

ElementwiseComparison compare_elementwise(const Layout& w, const Layout& r) {
  ElementwiseComparison out;
  const CacheDims& d = w.dims;
  for (Coord c; c.layer < d.layers; ++c.layer)
    for (c.page = 0; c.page < d.pages; ++c.page)
      for (Region reg : kAllRegions)
        for (c.head = 0; c.head < d.heads; ++c.head)
          for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
            for (c.column = 0; c.column < d.columns(reg); ++c.column) {
              const Buffer& bw = w.buffers[size_t(w.region(reg).buffer)];
              const Buffer& br = r.buffers[size_t(r.region(reg).buffer)];
              // Per-layer allocations and one shared by all layers meet only at layer 0.
              const bool apart = bw.name != br.name || (bw.per_layer != br.per_layer && c.layer > 0);
              const int64_t wb = w.offset(reg, c), rb = r.offset(reg, c);
              if (!apart && wb == rb) continue;
              out.misplaced[size_t(reg)]++;
              out.all[describe_element(reg, c)] = {reg, c, bw.name, br.name, wb, rb};
            }
  return out;
}

// compare counts in closed form over (layer, page, head); on random pairs of
// layouts (negative strides and nested modes included: compare works on unsound
// layouts too) it must match the element-by-element count exactly.
TEST(Compare, AgreesWithElementwiseCountOnRandomPairs) {
  std::mt19937_64 rng(7);
  auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  auto random_mode = [&]() { return pick(0, 3) == 0 ? Mode(pick(1, 4), pick(-5, 5), pick(-12, 12)) : Mode(pick(-12, 12)); };
  int disagreeing = 0, agreeing = 0, three_moving = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    Layout w;
    w.name = "w";
    w.dims = {pick(1, 3), pick(1, 5), pick(1, 4), pick(1, 6), 16 * pick(1, 2)};
    w.buffers = {{"a", 1, rng() % 2 == 0}, {"b", 1, rng() % 2 == 0}};
    for (RegionMap& m : w.regions) {
      m.buffer = int32_t(pick(0, 1));
      m.offset = pick(-50, 50);
      m.layer = pick(-300, 300);
      m.page = pick(-100, 100);
      m.head = pick(-30, 30);
      m.token = random_mode();
      m.column = random_mode();
    }
    Layout r = w;
    r.name = std::string(1, 'r');  // (assigning the literal trips a GCC 12 -Wrestrict false positive)
    for (int64_t k = pick(0, 3); k > 0; --k) {
      RegionMap& m = r.regions[size_t(pick(0, 3))];
      switch (pick(0, 8)) {
        case 0: m.offset += pick(-3, 3); break;
        case 1: m.layer += pick(-3, 3); break;
        case 2: m.page += pick(-3, 3); break;
        case 3: m.head += pick(-3, 3); break;
        case 4: m.token = random_mode(); break;
        case 5: m.column = random_mode(); break;
        case 6: m.buffer = 1 - m.buffer; break;
        case 7: r.buffers[size_t(pick(0, 1))].per_layer ^= true; break;
        default: m.layer += pick(-2, 2), m.page += pick(-2, 2), m.head += pick(-2, 2); break;
      }
    }
    const CompareReport rep = compare(w, r, 4);
    const ElementwiseComparison truth = compare_elementwise(w, r);
    ASSERT_EQ(rep.misplaced_per_region, truth.misplaced) << "trial " << trial << "\n" << to_json(w) << "\n" << to_json(r);
    // The examples (spread over regions and rows) are misplaced elements, as many as asked for.
    ASSERT_EQ(rep.examples.size(), std::min<size_t>(4, truth.all.size())) << trial;
    for (const Misplacement& m : rep.examples) {
      const auto it = truth.all.find(describe_element(m.region, m.coord));
      ASSERT_TRUE(it != truth.all.end()) << trial << ": " << describe_element(m.region, m.coord) << " is not misplaced";
      EXPECT_EQ(m.writer_byte, it->second.writer_byte) << trial;
      EXPECT_EQ(m.reader_byte, it->second.reader_byte) << trial;
    }
    (rep.agree ? agreeing : disagreeing)++;
    for (Region reg : kAllRegions) {
      const RegionMap &a = w.region(reg), &b = r.region(reg);
      three_moving += w.dims.layers > 1 && w.dims.pages > 1 && w.dims.heads > 1 && a.layer != b.layer &&
                      a.page != b.page && a.head != b.head;
    }
  }
  EXPECT_GT(agreeing, 200);
  EXPECT_GT(disagreeing, 1000);
  EXPECT_GT(three_moving, 50);  // the walked case, where no stride difference is 0
}

// The count never visits every head or page: ten million heads compare like eight.
TEST(Compare, TenMillionHeadsCountedWithoutVisitingThem) {
  const Layout a = instantiate(preset_spec("vllm-legacy-hnd"), {1, 3, 16, 10000000, 128});
  EXPECT_TRUE(compare(a, a).agree);
  Layout b = a;
  for (RegionMap& m : b.regions) m.head += 1;  // only head 0 stays in place
  const CompareReport r = compare(a, b, 1);
  EXPECT_EQ(r.misplaced, int64_t(3) * (10000000 - 1) * 16 * 2 * 72);
  ASSERT_EQ(r.examples.size(), 1u);
  EXPECT_EQ(r.examples[0].coord.head, 1);
}

}  // namespace
}  // namespace nvfp4kv
