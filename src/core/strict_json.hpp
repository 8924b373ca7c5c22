#pragma once
// The one JSON reader for files a user hands nvfp4kv (layouts, kit manifests):
// nlohmann's parser keeps the last of two equal keys, and every dump or
// destruction of a value recurses, so text nested 100,000 deep overflows the
// stack after parsing. This parse refuses duplicate keys, text past a size and
// nesting past a depth while parsing, naming the place. Private to the
// libraries: nothing of nlohmann reaches an installed consumer.
#include <nlohmann/json.hpp>
#include <string_view>

namespace nvfp4kv::detail {

struct JsonBounds {
  std::string_view root;        // how messages name the document: "layout", "manifest.json"
  size_t max_bytes;
  size_t max_depth;
  bool int64_only;              // refuse integers past int64 (a layout holds only those)
};

// Throws ArgumentError ("ROOT.a.b[2]: key "x" appears twice", "ROOT text is more than ...").
nlohmann::json parse_json_strict(std::string_view text, const JsonBounds& bounds);

// A value as an error message shows it: compact JSON, ASCII only, cut short.
std::string json_excerpt(const nlohmann::json& v);

// Throws LayoutError unless obj is an object whose keys are all in `allowed` ("WHERE:
// unknown key "x" (allowed: a, b)"): a typo never silently becomes a default.
void require_keys(const nlohmann::json& obj, std::initializer_list<const char*> allowed, const std::string& where);

}  // namespace nvfp4kv::detail
