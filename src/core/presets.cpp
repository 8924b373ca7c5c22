#include <string_view>
#include <utility>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/names.hpp"

namespace nvfp4kv {
namespace detail {
extern const std::pair<std::string_view, std::string_view> kPresetFiles[];
extern const int kPresetFileCount;
}  // namespace detail

namespace {

// Names the vLLM presets had before they were split by version and GPU path.
// Each keeps loading the bytes it always described: linear V scales,
// which is what the SM12x writer stores and the SM120 readers expect.
constexpr std::pair<std::string_view, std::string_view> kFormerNames[] = {
    {"vllm-legacy-hnd", "vllm-legacy-hnd-writer-sm12x"},
    {"vllm-legacy-nhd", "vllm-legacy-nhd-writer-sm12x"},
    {"vllm-packed-hnd", "vllm-packed-hnd-writer-sm12x"},
    {"vllm-packed-nhd-writer", "vllm-packed-nhd-writer-sm12x"},
    {"vllm-packed-nhd-reader", "vllm-packed-nhd-reader-sm120"},
};

std::string_view current_name(std::string_view name) {
  for (const auto& [former, now] : kFormerNames)
    if (former == name) return now;
  return name;
}

}  // namespace

std::vector<PresetInfo> list_presets() {
  std::vector<PresetInfo> out;
  for (int i = 0; i < detail::kPresetFileCount; ++i) {
    const LayoutSpec spec = parse_layout_spec(detail::kPresetFiles[i].second);
    PresetInfo info{spec.name, spec.summary, spec.provenance, {}};
    for (const auto& [former, now] : kFormerNames)
      if (now == spec.name) info.former_names.emplace_back(former);
    out.push_back(std::move(info));
  }
  return out;
}

bool is_preset_name(std::string_view name) {
  name = current_name(name);
  for (int i = 0; i < detail::kPresetFileCount; ++i)
    if (parse_layout_spec(detail::kPresetFiles[i].second).name == name) return true;
  return false;
}

LayoutSpec preset_spec(std::string_view name) {
  const std::string_view now = current_name(name);
  std::string names;
  std::vector<std::string> all;
  for (int i = 0; i < detail::kPresetFileCount; ++i) {
    const LayoutSpec spec = parse_layout_spec(detail::kPresetFiles[i].second);
    if (spec.name == now) return spec;
    names += " " + spec.name;
    all.push_back(spec.name);
  }
  for (const auto& [former, now_name] : kFormerNames) all.emplace_back(former);
  throw LayoutError("no preset named \"" + std::string(name) + "\"" + did_you_mean(name, all) + "; presets:" + names);
}

}  // namespace nvfp4kv
