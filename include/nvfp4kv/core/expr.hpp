#pragma once
// Integer expressions for strides and sizes in layout files: numbers, the
// symbols of the cache's sizes, + - * / % and parentheses, overflow-checked.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace nvfp4kv {

// Returns the value of a symbol, or nullopt when the symbol is unknown or the
// size it names is still open (the evaluator then names it in the error).
using SymbolLookup = std::function<std::optional<int64_t>(std::string_view)>;

// Throws LayoutError on syntax errors, unknown symbols, overflow and division by zero.
int64_t evaluate_expression(std::string_view text, const SymbolLookup& lookup);

}  // namespace nvfp4kv
