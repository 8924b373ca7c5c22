// libFuzzer target over the expression parser. Invariants (any violation aborts):
// only LayoutError is thrown and its message is one short line; evaluation is
// deterministic; and a value is kept by parentheses and negated by unary minus
// (unless the added level is refused as too deep, or the negation overflows).
// Input: 2 bytes choosing symbol values, then the expression.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "nvfp4kv/core/expr.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace {

using namespace nvfp4kv;

[[noreturn]] void violated(const char* what, const std::string& text) {
  std::fprintf(stderr, "invariant violated: %s\nexpression (%zu bytes): %.200s\n", what, text.size(), text.c_str());
  std::abort();
}

std::optional<int64_t> evaluate(const std::string& text, const SymbolLookup& lookup) {
  try {
    return evaluate_expression(text, lookup);
  } catch (const LayoutError& e) {
    const std::string m = e.what();
    if (m.find('\n') != std::string::npos || m.size() > 512) violated("a refusal is one short line", m);
    return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // N and H from the first two bytes: small, 0, or at the edges of int64.
  const auto value = [](uint8_t b) -> int64_t {
    switch (b) {
      case 255: return INT64_MAX;
      case 254: return INT64_MIN;
      case 253: return int64_t(1) << 62;
      default: return int64_t(b) - 8;
    }
  };
  const int64_t n = value(data[0]), h = value(data[1]);
  const SymbolLookup lookup = [&](std::string_view name) -> std::optional<int64_t> {
    if (name == "N") return n;
    if (name == "H") return h;
    if (name == "sd") return 8;
    return std::nullopt;  // open or unknown: the parser must say so
  };
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::optional<int64_t> v = evaluate(text, lookup);
  if (evaluate(text, lookup) != v) violated("evaluation is not deterministic", text);
  if (!v) return 0;
  if (const auto p = evaluate("(" + text + ")", lookup); p && *p != *v) violated("parentheses changed the value", text);
  if (const auto m = evaluate("-(" + text + ")", lookup); m && (*v == INT64_MIN || *m != -*v))
    violated("unary minus did not negate", text);
  return 0;
}
