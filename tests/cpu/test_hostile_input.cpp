// Hostile input (issue 9): every size, number and coordinate either gives an
// exact answer or a refusal that names the bound. Offsets are only ever
// evaluated for layouts that satisfy evaluation_problem, whoever built them.
#include <gtest/gtest.h>

#include <functional>

#include "nvfp4kv/core/expr.hpp"

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace {

constexpr int64_t kBig = int64_t(1) << 62;

Layout tiny() {
  return instantiate(preset_spec("vllm-legacy-hnd-writer-sm12x"), {2, 3, 4, 2, 32});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const LayoutError& e) {
    return e.what();
  }
  return "accepted";
}

// A layout built by hand that breaks the evaluation rule is refused by every
// path, with the same message, before any offset is computed.
TEST(EvaluationRule, HandBuiltLayoutsCannotBypassIt) {
  const std::vector<std::pair<std::string, std::function<void(Layout&)>>> cases = {
      {"9 buffers; a layout has at most 8", [](Layout& l) { l.buffers.resize(9, l.buffers[0]); }},
      {"the layout names no buffer", [](Layout& l) { l.buffers.clear(); }},
      {"k_scale names buffer #5, which does not exist", [](Layout& l) { l.regions[1].buffer = 5; }},
      {"v_data: the token mode's inner extent must be >= 1, got 0", [](Layout& l) { l.regions[2].token = Mode(0, 1, 4); }},
      {"k_data: page stride 4611686018427387905 is beyond", [](Layout& l) { l.regions[0].page = kBig + 1; }},
      {"v_scale: offset -4611686018427387905 is beyond", [](Layout& l) { l.regions[3].offset = -kBig - 1; }},
      {"v_scale: inner column stride -4611686018427387905 is beyond",
       [](Layout& l) { l.regions[3].column = Mode(2, -kBig - 1, 0); }},
      {"k_data: offsets reach beyond 4611686018427387904 (2^62) bytes, the bound on any offset (largest term: page "
       "2 x stride 3000000000000000000)",
       [](Layout& l) { l.regions[0].page = 3000000000000000000; }},
      {"k_scale: offsets reach beyond 4611686018427387904 (2^62) bytes, the bound on any offset (largest term: token "
       "3 through mode (2,_):(-4600000000000000000,100000000000000000))",
       [](Layout& l) { l.regions[1].token = Mode(2, -4600000000000000000, 100000000000000000); }},
      {"layers 1099511627776 x pages 200000 x heads 2 x tokens per page 4 x elements per token and head 36 is more "
       "than 4611686018427387904 (2^62) elements",
       [](Layout& l) { l.dims.layers = int64_t(1) << 40, l.dims.pages = 200000; }},
      {"layers 4611686018427387904 x pages 4611686018427387904 x heads 2",
       [](Layout& l) { l.dims.layers = l.dims.pages = kBig; }},
      {"buffer \"kv\" has size -1; a size lies in [0, 4611686018427387904 (2^62)]",
       [](Layout& l) { l.buffers[0].bytes = -1; }},
      {"the allocations over 2 layer(s) total more than 4611686018427387904 (2^62) bytes",
       [](Layout& l) { l.buffers[0].bytes = kBig; }},
      {"head dim must be a positive multiple of 16", [](Layout& l) { l.dims.head_dim = 0; }},
  };
  for (const auto& [want, mutate] : cases) {
    Layout l = tiny();
    mutate(l);
    const std::string problem = evaluation_problem(l);
    EXPECT_NE(problem.find(want), std::string::npos) << "want: " << want << "\n got: " << problem;
    const CheckReport rep = check(l).report;
    EXPECT_FALSE(rep.ok) << want;
    ASSERT_EQ(rep.problems.size(), 1u) << want;  // nothing after the rule ran
    EXPECT_EQ(rep.problems[0], problem);
    EXPECT_EQ(error_of([&] { compare(l, l); }), "layout \"vllm-legacy-hnd-writer-sm12x\": " + problem);
    EXPECT_EQ(error_of([&] { compare(tiny(), l); }).find("describe different caches"), std::string::npos);
    EXPECT_EQ(error_of([&] { byte_map(l); }), "layout \"vllm-legacy-hnd-writer-sm12x\": " + problem);
    EXPECT_THROW(validate(l), LayoutError);
    EXPECT_THROW(l.total_bytes(), LayoutError);
  }
  // The rule is exact at its edge: 2^62 itself is a legal stride and offset.
  Layout l = instantiate(preset_spec("vllm-legacy-hnd"), {1, 1, 1, 1, 16});
  l.regions[0].page = kBig;
  l.regions[3].offset = kBig - 1;
  l.buffers[0].bytes = kBig;
  EXPECT_EQ(evaluation_problem(l), "");
  l.regions[3].column = Mode(1, 0, 1);
  l.dims.head_dim = 32;  // two scale groups: v_scale's last one at 2^62
  EXPECT_EQ(evaluation_problem(l).find("v_scale: offsets reach beyond"), std::string::npos);
  l.regions[3].offset = kBig;
  EXPECT_NE(evaluation_problem(l).find("v_scale: offsets reach beyond"), std::string::npos);
}

// The issue's reproducers at the library level: sizes whose offsets, totals or
// counts leave 64 bits are refused when the layout is bound to them.
TEST(EvaluationRule, InstantiateRefusesSizesBeyondTheBound) {
  EXPECT_NE(error_of([] { instantiate(preset_spec("nvfp4kv-native"), {int64_t(1) << 40, 200000, 16, 8, 128}); })
                .find("is more than 4611686018427387904 (2^62) elements, the bound on any count"),
            std::string::npos);
  EXPECT_NE(error_of([] { instantiate(preset_spec("nvfp4kv-native"), {int64_t(1) << 62, 200000, 16, 8, 128}); })
                .find("layers 4611686018427387904 x pages 200000"),
            std::string::npos);
  // A buffer without "bytes": its size comes from offsets, which must be computable first.
  const LayoutSpec open = parse_layout_spec(R"({"name": "open", "buffers": [{"name": "kv"}],
    "regions": {"k_data": {"page": "1000000000000", "head": 0, "token": 0, "column": 0},
                "k_scale": {"page": 0, "head": 0, "token": 0, "column": 0},
                "v_data": {"page": 0, "head": 0, "token": 0, "column": 0},
                "v_scale": {"page": 0, "head": 0, "token": 0, "column": 0}}})");
  EXPECT_NE(error_of([&] { instantiate(open, {1, int64_t(1) << 40, 1, 1, 16}); })
                .find("k_data: offsets reach beyond 4611686018427387904 (2^62) bytes, the bound on any offset "
                      "(largest term: page 1099511627775 x stride 1000000000000)"),
            std::string::npos);
  EXPECT_EQ(instantiate(open, {1, int64_t(1) << 20, 1, 1, 16}).buffers[0].bytes, ((int64_t(1) << 20) - 1) * 1000000000000 + 1);
  // Totals: a per-layer buffer of 2^61 bytes over 3 layers.
  std::string text = R"({"name": "big", "buffers": [{"name": "kv", "bytes": "2305843009213693952"}],
    "regions": {"k_data": {"page": 0, "head": 0, "token": 0}, "k_scale": {"page": 0, "head": 0, "token": 0},
                "v_data": {"page": 0, "head": 0, "token": 0}, "v_scale": {"page": 0, "head": 0, "token": 0}}})";
  EXPECT_EQ(instantiate(parse_layout_spec(text), {2, 1, 1, 1, 16}).total_bytes(), kBig);
  EXPECT_EQ(error_of([&] { instantiate(parse_layout_spec(text), {3, 1, 1, 1, 16}); }),
            "layout \"big\": the allocations over 3 layer(s) total more than 4611686018427387904 (2^62) bytes, the "
            "bound on any size; lower the sizes");
}

TEST(ByteMap, RefusesCoordinatesOutsideTheCacheAndPagesTooLargeToDraw) {
  const Layout l = tiny();
  EXPECT_EQ(error_of([&] { byte_map(l, 0, -1); }), "page -1 is outside the cache's [0, 3)");
  EXPECT_EQ(error_of([&] { byte_map(l, 0, INT64_MAX); }), "page 9223372036854775807 is outside the cache's [0, 3)");
  EXPECT_EQ(error_of([&] { byte_map(l, kBig, 0); }), "layer 4611686018427387904 is outside the cache's [0, 2)");
  EXPECT_NE(byte_map(l, 1, 2).find("page 2 of layer 1"), std::string::npos);
  const Layout wide = instantiate(preset_spec("vllm-legacy-hnd"), {1, 1, 16, 10000000, 128});
  EXPECT_EQ(error_of([&] { byte_map(wide); }),
            "the byte map of one page draws heads 10000000 x tokens per page 16 x 144 elements = 23040000000, more "
            "than 8388608 (2^23), the bound on any enumeration; draw fewer heads or tokens per page");
}

TEST(Compare, RefusesPlanesTooLargeToEnumerate) {
  const Layout l = instantiate(preset_spec("vllm-legacy-hnd"), {1, 1, 1 << 18, 1, 128});
  EXPECT_NE(error_of([&] { compare(l, l); })
                .find("compare would take tokens per page 262144 x 64 columns of k_data = 16777216 steps, more than "
                      "8388608 (2^23)"),
            std::string::npos);
}


// check's own work is bounded over the whole proof and refused before it starts;
// such a verdict is UNDECIDED, not REJECTED: nothing was shown wrong.
TEST(Check, ProofsPastTheBoundsAreUndecidedNotRejected) {
  // NHD heads do not share strides across regions: each region's cell holds every head.
  const CheckReport big = check(instantiate(preset_spec("vllm-legacy-nhd"), {1, 4, 16, 7000, 128})).report;
  EXPECT_FALSE(big.ok);
  EXPECT_TRUE(big.undecided);
  EXPECT_EQ(big.elements_enumerated, 0);  // refused up front
  EXPECT_EQ(big.summary(),
            "UNDECIDED: cannot prove the layout sound at these sizes: its page cells hold more than 8388608 (2^23) "
            "elements to enumerate, the bound on any enumeration; check it with fewer heads or tokens per page");
  EXPECT_TRUE(check(instantiate(preset_spec("vllm-legacy-nhd"), {1, 4, 16, 1800, 128})).report.ok);
  // Pages as the fastest dimension: each page is a translation the lattice search must test.
  const LayoutSpec page_fastest = parse_layout_spec(R"json({"name": "page-fastest", "buffers": [{"name": "kv"}],
    "regions": {
      "k_data":  {"offset": 0, "page": 1, "head": "P", "token": "P*H", "column": "P*H*N"},
      "k_scale": {"offset": "P*H*N*dd", "page": 1, "head": "P", "token": "P*H", "column": "P*H*N"},
      "v_data":  {"offset": "P*H*N*(dd+sd)", "page": 1, "head": "P", "token": "P*H", "column": "P*H*N"},
      "v_scale": {"offset": "P*H*N*(2*dd+sd)", "page": 1, "head": "P", "token": "P*H", "column": "P*H*N"}}})json");
  EXPECT_TRUE(check(instantiate(page_fastest, {1, 2000, 16, 1, 64})).report.ok);
  const CheckReport far = check(instantiate(page_fastest, {1, 340000, 16, 1, 64})).report;
  EXPECT_TRUE(far.undecided);
  EXPECT_NE(far.problems[0].find("more than 33554432 (2^25) steps"), std::string::npos) << far.problems[0];
  // An element outside its buffer decides what the unfinished search could not.
  Layout short_buffer = instantiate(page_fastest, {1, 340000, 16, 1, 64});
  short_buffer.buffers[0].bytes -= 1;
  const CheckReport outside = check(short_buffer).report;
  EXPECT_FALSE(outside.undecided);
  EXPECT_NE(outside.summary().find("REJECTED: v_scale["), std::string::npos) << outside.summary();
  EXPECT_NE(outside.summary().find("is outside buffer \"kv\""), std::string::npos) << outside.summary();
  // A real collision is never undecided.
  EXPECT_FALSE(check(instantiate(preset_spec("vllm-packed-nhd-writer"), {1, 1, 16, 1, 128})).report.undecided);
}

// A one-line layout to edit: every test below changes one thing in it.
const std::string kText =
    R"({"name": "t", "dims": {"pages": 2, "heads": 1, "head_dim": 32, "tokens_per_page": 4},)"
    R"( "buffers": [{"name": "kv", "bytes": "P*2*H*N*F"}], "regions": {)"
    R"( "k_data": {"page": "2*H*N*F", "head": "N*dd", "token": "dd"},)"
    R"( "k_scale": {"offset": "H*N*dd", "page": "2*H*N*F", "head": "N*sd", "token": "sd"},)"
    R"( "v_data": {"offset": "H*N*F", "page": "2*H*N*F", "head": "N*dd", "token": "dd"},)"
    R"( "v_scale": {"offset": "H*N*F + H*N*dd", "page": "2*H*N*F", "head": "N*sd", "token": "sd"}}})";

std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

std::string load_error(const std::string& text) {
  return error_of([&] { instantiate(parse_layout_spec(text), {}); });
}

// Every refusal is one short line, whatever the input echoed.
void expect_one_short_line(const std::string& message) {
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_LT(message.size(), 400u) << message;
}

TEST(StrictText, TheBaseTextLoads) {
  EXPECT_EQ(load_error(kText), "accepted");
  EXPECT_TRUE(check(instantiate(parse_layout_spec(kText), {})).report.ok);
}

TEST(StrictText, DuplicateKeysAreErrorsNamingKeyAndPlace) {
  const std::string twice_page = with(kText, R"("page": "2*H*N*F", "head": "N*dd", "token": "dd"},)",
                                      R"("page": 72, "page": 1, "head": "N*dd", "token": "dd"},)");
  EXPECT_EQ(load_error(twice_page),
            "layout.regions.k_data: key \"page\" appears twice (a layout never takes one of two values silently)");
  const std::string twice_region = with(kText, R"( "k_data": {)", R"( "k_data": {"page": 0, "head": 0, "token": 0}, "k_data": {)");
  EXPECT_EQ(load_error(twice_region).rfind("layout.regions: key \"k_data\" appears twice", 0), 0u) << load_error(twice_region);
  EXPECT_EQ(load_error(with(kText, R"("name": "t",)", R"("name": "t", "name": "u",)")).rfind("layout: key \"name\" appears twice", 0), 0u);
  // The same key in two different objects is fine.
  EXPECT_EQ(load_error(kText).find("twice"), std::string::npos);
  // Array elements are named by index.
  EXPECT_EQ(load_error(with(kText, R"([{"name": "kv", "bytes": "P*2*H*N*F"}])",
                            R"([{"name": "kv", "bytes": "P*2*H*N*F", "bytes": 1}])")).rfind("layout.buffers[0]: key \"bytes\"", 0),
            0u);
}

TEST(StrictText, IntegersOutsideInt64AreErrorsNamingThePlace) {
  const std::string page = R"("page": "2*H*N*F", "head": "N*dd", "token": "dd"},)";
  const auto with_page = [&](const std::string& v) { return with(kText, page, R"("page": )" + v + R"(, "head": "N*dd", "token": "dd"},)"); };
  EXPECT_EQ(load_error(with_page("18446744073709551615")),
            "layout.regions.k_data.page: 18446744073709551615 is outside the 64-bit signed integers a layout holds");
  EXPECT_EQ(load_error(with_page("18446744073709551616")),
            "layout.regions.k_data.page: 1.8446744073709552e+19 is outside the 64-bit signed integers a layout holds");
  EXPECT_EQ(load_error(with_page("9223372036854775808")).find("9223372036854775808 is outside"), 28u);
  EXPECT_NE(load_error(with_page("-9223372036854775809")).find("is outside the 64-bit signed integers"), std::string::npos);
  EXPECT_NE(load_error(with(kText, R"("pages": 2)", R"("pages": 1e300)")).find("layout.dims.pages: 1e+300 is outside"),
            std::string::npos);
  // Inside int64 a number is taken as it is, and the evaluation rule bounds it; -2^63 itself
  // cannot be negated back from its text and is refused as an overflow.
  EXPECT_EQ(load_error(with_page("-9223372036854775807")),
            "layout \"t\": k_data: page stride -9223372036854775807 is beyond +-4611686018427387904 (2^62), the bound "
            "on any offset");
  EXPECT_EQ(load_error(with_page("-9223372036854775808")),
            "k_data.page: expression \"-9223372036854775808\": integer overflow at character 20");
  EXPECT_EQ(load_error(with_page("1.5")), "k_data.page: expected an integer or an expression string, got 1.5");
}

TEST(StrictText, NestingAndSizeAreBounded) {
  // The issue's 200 KB file: 100000 nested arrays where a buffer belongs.
  const std::string deep = R"({"name":"t","buffers":[)" + std::string(100000, '[') + std::string(100000, ']') + "]}";
  EXPECT_EQ(load_error(deep), "layout.buffers[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
                              "[0][0][0][0][0][0][0]: nested more than 32 levels deep");
  std::string nested_objects;
  for (int i = 0; i < 40; ++i) nested_objects += R"({"a":)";
  EXPECT_NE(load_error(nested_objects).find("nested more than 32 levels deep"), std::string::npos);
  EXPECT_EQ(load_error(std::string((size_t(1) << 20) + 1, ' ')), "layout text is more than 1048576 bytes (1 MiB), the bound on a layout");
  // A long unterminated string: the parser's message quotes it; the echo is cut.
  const std::string message = load_error(R"({"name": ")" + std::string(100000, 'x'));
  EXPECT_EQ(message.rfind("layout text is not valid JSON", 0), 0u);
  expect_one_short_line(message);
}

TEST(StrictText, ExpressionsBoundTheirRecursionAndCutTheirEcho) {
  const auto none = [](std::string_view) -> std::optional<int64_t> { return std::nullopt; };
  const std::string minus = std::string(200000, '-') + "1";
  const std::string message = error_of([&] { evaluate_expression(minus, none); });
  EXPECT_EQ(message, "expression \"------------------------------------------------\"... (200001 characters): nested more "
                     "than 64 levels deep at character 65");
  EXPECT_EQ(evaluate_expression(std::string(62, '-') + "7", none), 7);
  EXPECT_EQ(evaluate_expression(std::string(63, '-') + "7", none), -7);
  EXPECT_THROW(evaluate_expression(std::string(64, '-') + "7", none), LayoutError);
  EXPECT_EQ(evaluate_expression("- -(-(1))", none), -1);
  EXPECT_NE(error_of([&] { evaluate_expression(std::string(65, '(') + "1" + std::string(65, ')'), none); }).find("nested more than 64"),
            std::string::npos);
  // In a layout file, the same refusal names the stride.
  const std::string text = with(kText, R"("page": "2*H*N*F", "head": "N*dd")", R"("page": ")" + minus + R"(", "head": "N*dd")");
  EXPECT_EQ(load_error(text).rfind("k_data.page: expression \"---", 0), 0u) << load_error(text);
  expect_one_short_line(load_error(text));
}

TEST(StrictText, NamesAreShortSingleLinesAndBuffersFitTheApi) {
  const std::string long_name = with(kText, R"("name": "t")", R"("name": ")" + std::string(100000, 'n') + R"(")");
  EXPECT_EQ(load_error(long_name),
            "layout.name: \"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\"... (100000 characters) is not a name: 1 to 128 "
            "bytes without control characters");
  EXPECT_EQ(load_error(with(kText, R"("name": "t")", R"("name": "a\nb")")),
            "layout.name: \"a\\x0ab\" is not a name: 1 to 128 bytes without control characters");
  EXPECT_NE(load_error(with(kText, R"("name": "t")", R"("name": "")")).find("is not a name"), std::string::npos);
  std::string nine = R"([{"name": "kv", "bytes": "P*2*H*N*F"})";
  for (int i = 0; i < 8; ++i) nine += R"(, {"name": "b)" + std::to_string(i) + R"("})";
  EXPECT_EQ(load_error(with(kText, R"([{"name": "kv", "bytes": "P*2*H*N*F"}])", nine + "]")),
            "buffers: 9 buffers; a layout has at most 8 (a cache hands kernels 8 base pointers)");
  EXPECT_EQ(load_error(with(kText, R"([{"name": "kv", "bytes": "P*2*H*N*F"}])",
                            R"([{"name": "kv", "bytes": 1}, {"name": "kv", "bytes": 2}])")),
            "buffer \"kv\" is declared twice");
  EXPECT_EQ(load_error(with(kText, R"("dims")", R"("let": [["2x", 1]], "dims")")),
            "let \"2x\": a name is letters, digits and _, not starting with a digit");
  EXPECT_EQ(load_error(with(kText, R"("dims")", R"("let": [["X", 1], ["X", 2]], "dims")")),
            "let \"X\": the name is already defined");
  EXPECT_EQ(quote_text("tab\there"), "\"tab\\x09here\"");
  EXPECT_EQ(quote_text(std::string(47, 'a') + "\xc3\xa9z"), "\"" + std::string(47, 'a') + "\"... (50 characters)");
}

TEST(StrictText, PathsInMessagesStayShortAndOnOneLine) {
  std::string keys;  // 40 objects deep, each under a key with a newline in it
  for (int i = 0; i < 40; ++i) keys += R"({"a\nb)" + std::string(200, 'k') + R"(":)";
  const std::string message = load_error(keys);
  EXPECT_NE(message.find("nested more than 32 levels deep"), std::string::npos) << message;
  EXPECT_EQ(message.rfind("layout[\"a\\x0ab", 0), 0u) << message;
  expect_one_short_line(message);
}

// The printed form says everything that was read, unsound parts included: a
// per-layer region with a layer stride loads back with it, and check still
// names the mistake.
TEST(StrictText, PrintedFormKeepsALayerStrideOfAPerLayerRegion) {
  const Layout l = instantiate(parse_layout_spec(with(kText, R"("k_data": {"page")", R"("k_data": {"layer": 5, "page")")), {});
  EXPECT_EQ(l.region(Region::kKData).layer, 5);
  const Layout again = instantiate(parse_layout_spec(to_json(l)), {});
  EXPECT_EQ(again.region(Region::kKData).layer, 5);
  EXPECT_EQ(to_json(again), to_json(l));
  EXPECT_NE(check(again).report.problems[0].find("lives in per-layer buffer \"kv\" but has a layer stride"), std::string::npos);
}

}  // namespace
}  // namespace nvfp4kv

namespace nvfp4kv {
namespace {

// "codes": a name or the bit lists; a wrong one is refused by name, and a layout keeps it
// through to_json and back.
TEST(StrictText, CodeOrdersLoadByNameOrBitsAndRoundTrip) {
  const std::string base = R"({"name": "c", "dims": {"pages": 2, "tokens_per_page": 16, "heads": 1, "head_dim": 32},
    "buffers": [{"name": "kv"}],
    "regions": {"k_data": {"buffer": "kv", "page": "N*2*F", "head": 0, "token": "dd"},
                "k_scale": {"buffer": "kv", "offset": "N*dd", "page": "N*2*F", "head": 0, "token": "sd"},
                "v_data": {"buffer": "kv", "offset": "N*F", "page": "N*2*F", "head": 0, "token": "dd"},
                "v_scale": {"buffer": "kv", "offset": "N*F + N*dd", "page": "N*2*F", "head": 0, "token": "sd"}}})";
  const auto load = [&](const std::string& codes) {
    return instantiate(parse_layout_spec(with(base, R"("buffers")", "\"codes\": " + codes + R"(, "buffers")")), {});
  };
  EXPECT_TRUE(instantiate(parse_layout_spec(base), {}).codes.is_standard());
  const Layout split = load(R"("fp16-split")");
  EXPECT_EQ(code_order_name(split.codes), "fp16-split");
  EXPECT_TRUE(check(split).report.ok);
  const Layout bits = load(R"({"even": [4, 5, 6, 7], "odd": [0, 1, 2, 3]})");
  EXPECT_EQ(code_order_name(bits.codes), "high-first");
  for (const Layout& l : {split, bits}) {  // to_json writes what instantiate reads back
    const Layout back = instantiate(parse_layout_spec(to_json(l)), {});
    EXPECT_TRUE(back.codes == l.codes);
  }
  EXPECT_EQ(to_json(instantiate(parse_layout_spec(base), {})).find("codes"), std::string::npos);  // standard: unsaid
  for (const auto& [codes, says] : std::vector<std::pair<std::string, std::string>>{
           {R"("nibbles")", "is not a code order"},
           {R"({"even": [0, 1, 2, 3], "odd": [4, 5, 6, 6]})", "bit 6 holds both"},
           {R"({"even": [0, 1, 2], "odd": [4, 5, 6, 7]})", "codes.even: expected 4 bit positions"},
           {R"({"even": [0, 1, 2, 8], "odd": [4, 5, 6, 7]})", "codes.even[3]: expected a bit position 0 to 7"},
           {R"({"even": [0, 1, 2, 3], "odd": [4, 5, 6, 7], "extra": 1})", "extra"},
           {"7", "codes: expected a name or an object"}}) {
    const std::string e = error_of([&] { load(codes); });
    EXPECT_NE(e.find(says), std::string::npos) << codes << " -> " << e;
    expect_one_short_line(e);
  }
}

}  // namespace
}  // namespace nvfp4kv
