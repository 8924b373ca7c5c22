#include <string_view>
#include <utility>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace detail {
extern const std::pair<std::string_view, std::string_view> kPresetFiles[];
extern const int kPresetFileCount;
}  // namespace detail

std::vector<PresetInfo> list_presets() {
  std::vector<PresetInfo> out;
  for (int i = 0; i < detail::kPresetFileCount; ++i) {
    const LayoutSpec spec = parse_layout_spec(detail::kPresetFiles[i].second);
    out.push_back({spec.name, spec.summary, spec.provenance});
  }
  return out;
}

bool is_preset_name(std::string_view name) {
  for (int i = 0; i < detail::kPresetFileCount; ++i)
    if (parse_layout_spec(detail::kPresetFiles[i].second).name == name) return true;
  return false;
}

LayoutSpec preset_spec(std::string_view name) {
  std::string names;
  for (int i = 0; i < detail::kPresetFileCount; ++i) {
    const LayoutSpec spec = parse_layout_spec(detail::kPresetFiles[i].second);
    if (spec.name == name) return spec;
    names += " " + spec.name;
  }
  throw LayoutError("no preset named \"" + std::string(name) + "\"; presets:" + names);
}

}  // namespace nvfp4kv
