// libFuzzer target over the whole layout surface, at fuzzer-chosen sizes:
// text -> parse -> instantiate -> check, compare, byte map, text form again.
// Invariants (any violation aborts):
//  - only LayoutError is thrown, and its message is one short line;
//  - a layout instantiate returns satisfies the evaluation rule, and check,
//    compare and byte_map never throw on it except to refuse a bound;
//  - compare of a layout with itself, and with its printed form loaded back,
//    agrees over every element;
//  - a layout check accepts draws no byte owned twice and, at sizes small
//    enough to enumerate, the exhaustive ownership map agrees with check.
// Input: 8 bytes of sizes and choices, then the layout text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "../cpu/brute_force.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace {

using namespace nvfp4kv;

[[noreturn]] void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "invariant violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void require_short_line(const LayoutError& e) {
  const std::string m = e.what();
  if (m.find('\n') != std::string::npos || m.size() > 512) violated("a refusal is one short line", m);
}

// A size from one byte: mostly small, sometimes zero or negative, sometimes near the bounds.
int64_t size_from(uint8_t b, int64_t small, int64_t unit) {
  if (b < 8) return int64_t(b) - 4;
  if (b < 224) return unit * (1 + b % small);
  if (b == 255) return INT64_MAX;
  return int64_t(1) << (2 * (b - 224));  // 2^0 .. 2^60
}

int64_t coordinate_from(uint8_t b) {
  if (b < 240) return b % 4;
  return b == 255 ? INT64_MAX : b == 254 ? -1 : int64_t(1) << (4 * (b - 240));
}

template <typename F>
bool refused_within_bound(F&& f) {
  try {
    f();
    return false;
  } catch (const LayoutError& e) {
    require_short_line(e);
    return true;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  // Bit i of data[7] leaves size i open, so the file's own defaults are used.
  const uint8_t open = data[7];
  const auto pick = [&](int i, int64_t small, int64_t unit) -> std::optional<int64_t> {
    if (open & (1u << i)) return std::nullopt;
    return size_from(data[i], small, unit);
  };
  const DimsOverride dims{pick(0, 3, 1), pick(1, 4, 1), pick(2, 16, 1), pick(3, 4, 1), pick(4, 8, 16)};
  const int64_t layer = coordinate_from(data[5]), page = coordinate_from(data[6]);
  const std::string_view text(reinterpret_cast<const char*>(data + 8), size - 8);

  Layout layout;
  try {
    layout = instantiate(parse_layout_spec(text), dims);
  } catch (const LayoutError& e) {
    require_short_line(e);
    return 0;
  }
  if (const std::string p = evaluation_problem(layout); !p.empty()) violated("instantiate returned an unevaluable layout", p);

  const CheckResult result = check(layout);
  if (result.report.ok != result.valid.has_value()) violated("check's verdict and its ValidLayout disagree", to_json(layout));

  // compare with itself: every element agrees, unless the planes are past the bound.
  CompareReport self;
  if (!refused_within_bound([&] { self = compare(layout, layout); })) {
    if (!self.agree || self.misplaced != 0) violated("a layout disagrees with itself", to_json(layout));
    if (result.report.ok && self.elements != result.report.elements)
      violated("compare and check count different elements", to_json(layout));
  }

  // The printed form loads back to the same layout.
  const std::string printed = to_json(layout);
  Layout again;
  try {
    again = instantiate(parse_layout_spec(printed), {});
  } catch (const LayoutError& e) {
    violated("the printed form does not load", std::string(e.what()) + "\n" + printed);
  }
  if (to_json(again) != printed) violated("the printed form loads to another layout", printed + "\n" + to_json(again));

  // The byte map at fuzzer-chosen coordinates: refused or drawn; a sound layout owns each byte once.
  std::string map;
  if (!refused_within_bound([&] { map = byte_map(layout, layer, page); }) && result.report.ok) {
    std::istringstream lines(map);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("  ", 0) == 0 && line.find('!', 13) != std::string::npos)
        violated("a sound layout's byte map shows a byte owned twice", printed + "\n" + map);
  }

  // Exhaustive oracle where the cache is small enough to enumerate.
  if (!result.report.ok) return 0;
  const CacheDims& d = layout.dims;
  if (d.layers * d.pages * d.heads * d.tokens_per_page * (d.head_dim / 2 + d.head_dim / 16) * 2 > (int64_t(1) << 20))
    return 0;
  for (const auto& b : layout.buffers)
    if (b.bytes * (b.per_layer ? d.layers : 1) > (int64_t(1) << 24)) return 0;  // the oracle allocates the buffers
  const auto bf = testing::brute_force(layout, int64_t(1) << 22);
  if (bf.overlap || bf.out_of_bounds) violated("accepted a layout the ownership map rejects", printed);
  return 0;
}
