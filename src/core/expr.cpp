#include "nvfp4kv/core/expr.hpp"

#include <cctype>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace {

class Parser {
 public:
  Parser(std::string_view text, const SymbolLookup& lookup) : text_(text), lookup_(lookup) {}

  int64_t parse() {
    const int64_t v = sum();
    skip_space();
    if (pos_ != text_.size()) fail("unexpected " + quote_text(text_.substr(pos_, 1)));
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw LayoutError("expression " + quote_text(text_) + ": " + what + " at character " + std::to_string(pos_ + 1));
  }
  // Parentheses and unary minus recurse; both count against one depth.
  void enter() {
    if (++depth_ > kMaxDepth) fail("nested more than " + std::to_string(kMaxDepth) + " levels deep");
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  // Each helper evaluates its operands first, then checks: never pass the result
  // variable and the overflow flag as arguments of one call.
  int64_t add(int64_t a, int64_t b) const {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) fail("integer overflow");
    return r;
  }
  int64_t sub(int64_t a, int64_t b) const {
    int64_t r = 0;
    if (__builtin_sub_overflow(a, b, &r)) fail("integer overflow");
    return r;
  }
  int64_t mul(int64_t a, int64_t b) const {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail("integer overflow");
    return r;
  }
  int64_t sum() {
    enter();
    int64_t v = product();
    for (;;) {
      if (eat('+')) v = add(v, product());
      else if (eat('-')) v = sub(v, product());
      else break;
    }
    --depth_;
    return v;
  }
  int64_t product() {
    int64_t v = unary();
    for (;;) {
      if (eat('*')) {
        v = mul(v, unary());
      } else if (eat('/')) {
        v = divide(v, unary(), false);
      } else if (eat('%')) {
        v = divide(v, unary(), true);
      } else {
        break;
      }
    }
    return v;
  }
  int64_t divide(int64_t v, int64_t d, bool modulo) const {
    if (d == 0) fail("division by zero");
    if (v == INT64_MIN && d == -1) fail("integer overflow");
    return modulo ? v % d : v / d;
  }
  int64_t unary() {
    if (eat('-')) {
      enter();
      const int64_t v = unary();
      --depth_;
      if (v == INT64_MIN) fail("integer overflow");
      return -v;
    }
    return primary();
  }
  int64_t primary() {
    skip_space();
    if (eat('(')) {
      const int64_t v = sum();
      if (!eat(')')) fail("missing ')'");
      return v;
    }
    if (pos_ >= text_.size()) fail("expression ends early");
    const char c = text_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        v = add(mul(v, 10), int64_t(text_[pos_] - '0'));
        ++pos_;
      }
      return v;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
        ++pos_;
      const std::string_view name = text_.substr(start, pos_ - start);
      const auto v = lookup_(name);
      if (!v) {
        pos_ = start;
        fail("unknown or open size " + quote_text(name) +
             " (known: L P N H D dd sd F kd ks vd vs; an open size must be given, e.g. --heads)");
      }
      return *v;
    }
    fail("unexpected " + quote_text(std::string_view(&text_[pos_], 1)));
  }

  std::string_view text_;
  const SymbolLookup& lookup_;
  size_t pos_ = 0;
  int depth_ = 0;
  static constexpr int kMaxDepth = 64;
};

}  // namespace

int64_t evaluate_expression(std::string_view text, const SymbolLookup& lookup) {
  return Parser(text, lookup).parse();
}

}  // namespace nvfp4kv
