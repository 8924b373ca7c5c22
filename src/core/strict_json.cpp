#include "strict_json.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::detail {
namespace {

using json = nlohmann::json;
using nvfp4kv::quote_text;

// Where a value sits: "regions.k_data.page", "buffers[1].name".
struct JsonPath {
  struct Step {
    bool object;
    std::string key;    // the current key of an object
    size_t index = 0;   // the current element of an array
    std::set<std::string, std::less<>> keys;  // keys seen so far in an object
  };
  std::string_view root;
  std::vector<Step> steps;

  // A key other than a short identifier is quoted (escaped, cut), and a long path keeps its two
  // ends, so a message stays one short line.
  std::string text(size_t depth) const {
    std::string out(root);
    for (size_t i = 0; i < depth; ++i) {
      const Step& s = steps[i];
      const bool plain = !s.key.empty() && s.key.size() <= 24 && std::all_of(s.key.begin(), s.key.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      });
      out += !s.object ? "[" + std::to_string(s.index) + "]" : plain ? "." + s.key : "[" + quote_text(s.key) + "]";
    }
    if (out.size() > 160) out = out.substr(0, 60) + "..." + out.substr(out.size() - 90);
    return out;
  }
  std::string here() const { return text(steps.size()); }
  void element_done() {
    if (!steps.empty() && !steps.back().object) ++steps.back().index;
  }
};

}  // namespace

std::string json_excerpt(const json& v) {
  std::string text = v.dump(-1, ' ', true);
  if (text.size() > 60) text = text.substr(0, 60) + "... (" + std::to_string(text.size()) + " characters)";
  return text;
}

json parse_json_strict(std::string_view text, const JsonBounds& b) {
  if (text.size() > b.max_bytes)
    throw ArgumentError(std::string(b.root) + " text is more than " + std::to_string(b.max_bytes) + " bytes (" +
                        std::to_string(b.max_bytes >> 20) + " MiB), the bound on a " + std::string(b.root));
  JsonPath path{b.root, {}};
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (path.steps.size() >= b.max_depth)
          throw ArgumentError(path.here() + ": nested more than " + std::to_string(b.max_depth) + " levels deep");
        path.steps.push_back({event == E::object_start, "", 0, {}});
        break;
      case E::key: {
        auto& step = path.steps.back();
        std::string key = parsed.get<std::string>();
        if (!step.keys.insert(key).second)
          throw ArgumentError(path.text(path.steps.size() - 1) + ": key " + quote_text(key) + " appears twice (a " +
                              std::string(b.root) + " never takes one of two values silently)");
        step.key = std::move(key);
        break;
      }
      case E::object_end:
      case E::array_end:
        path.steps.pop_back();
        path.element_done();
        break;
      case E::value:
        if (b.int64_only && ((parsed.is_number_unsigned() && parsed.get<uint64_t>() > uint64_t(INT64_MAX)) ||
                             (parsed.is_number_float() && std::abs(parsed.get<double>()) >= 0x1p63)))
          throw ArgumentError(path.here() + ": " + json_excerpt(parsed) + " is outside the 64-bit signed integers a " +
                              std::string(b.root) + " holds");
        path.element_done();
        break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& e) {
    std::string what = e.what();  // names the position; its "last read" may quote a long token
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    throw ArgumentError(std::string(b.root) + " text is not valid JSON: " + what);
  }
}

void require_keys(const nlohmann::json& obj, std::initializer_list<const char*> allowed, const std::string& where) {
  if (!obj.is_object()) throw LayoutError(where + ": expected an object, got " + json_excerpt(obj));
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool known = false;
    for (const char* k : allowed) known |= it.key() == k;
    if (!known) {
      std::string list;
      for (const char* k : allowed) list += std::string(list.empty() ? "" : ", ") + k;
      throw LayoutError(where + ": unknown key " + quote_text(it.key()) + " (allowed: " + list + ")");
    }
  }
}

}  // namespace nvfp4kv::detail
