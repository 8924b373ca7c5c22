#include "nvfp4kv/core/cache_format.hpp"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/files.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "strict_json.hpp"

namespace nvfp4kv {

namespace {

using json = nlohmann::json;
using detail::json_excerpt;
using detail::require_keys;

// A format with mu for 128 layers x 8 heads x D 256 is about 5 MiB of text.
constexpr size_t kMaxFormatBytes = size_t(64) << 20;
constexpr size_t kMaxFormatDepth = 8;

bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

std::string rotation_name(int64_t r) {
  if (r == kNoRotation) return "none";
  if (r == kRotateWholeHead) return "head";
  return std::to_string(r);
}

std::string tensor_problem(const TensorFormat& t, const CacheDims& d, const std::string& where) {
  if (t.element != ElementFormat::kNvfp4 && t.element != ElementFormat::kFp8E4M3)
    return where + ".element: unknown element format " + std::to_string(int(t.element));
  if (t.rule != ScaleRule::kStandard && t.rule != ScaleRule::kFourOverSix)
    return where + ".rule: unknown scale rule " + std::to_string(int(t.rule));
  if (t.element == ElementFormat::kFp8E4M3 && t.rule != ScaleRule::kStandard)
    return where + ".rule: fp8_e4m3 has no block scales, so only \"standard\" applies, got \"" +
           scale_rule_name(t.rule) + "\"";
  if (t.rotation == kNoRotation || t.rotation == kRotateWholeHead) return "";
  if (!power_of_two(t.rotation) || t.rotation < 16 || t.rotation > 256)
    return where + ".rotation: " + std::to_string(t.rotation) +
           " is not a rotation size (16, 32, 64, 128, 256, \"head\" or \"none\")";
  if (d.head_dim % t.rotation != 0)
    return where + ".rotation: " + std::to_string(t.rotation) + " does not divide the head dim " +
           std::to_string(d.head_dim);
  return "";
}

ElementFormat element_from(const json& v, const std::string& where) {
  if (v.is_string())
    if (std::optional<ElementFormat> f = element_format_named(v.get<std::string>())) return *f;
  throw LayoutError(where + ": expected \"nvfp4\" or \"fp8_e4m3\", got " + json_excerpt(v));
}

ScaleRule rule_from(const json& v, const std::string& where) {
  if (v == "standard") return ScaleRule::kStandard;
  if (v == "4over6") return ScaleRule::kFourOverSix;
  throw LayoutError(where + ": expected \"standard\" or \"4over6\", got " + json_excerpt(v));
}

int64_t rotation_from(const json& v, const std::string& where) {
  if (v == "none") return kNoRotation;
  if (v == "head") return kRotateWholeHead;
  if (v.is_number_integer() && v.get<int64_t>() > 0) return v.get<int64_t>();  // the size is format_problem's
  throw LayoutError(where + ": expected a size (16, 32, 64, 128, 256), \"head\" or \"none\", got " +
                    json_excerpt(v));
}


TensorFormat tensor_from(const json& v, const std::string& where) {
  require_keys(v, {"element", "rule", "rotation"}, where);
  TensorFormat t;
  if (v.contains("element")) t.element = element_from(v["element"], where + ".element");
  if (v.contains("rule")) t.rule = rule_from(v["rule"], where + ".rule");
  if (v.contains("rotation")) t.rotation = rotation_from(v["rotation"], where + ".rotation");
  return t;
}

json tensor_json(const TensorFormat& t) {
  json j = {{"element", element_format_name(t.element)}, {"rule", scale_rule_name(t.rule)}};
  if (t.rotation == kNoRotation) j["rotation"] = "none";
  else if (t.rotation == kRotateWholeHead) j["rotation"] = "head";
  else j["rotation"] = t.rotation;
  return j;
}

std::string tensor_text(const TensorFormat& t) {
  std::string s = element_format_name(t.element);
  if (t.element == ElementFormat::kNvfp4) s += std::string(" ") + scale_rule_name(t.rule);
  if (t.rotation != kNoRotation) s += ", rotation " + rotation_name(t.rotation);
  return s;
}

}  // namespace

const char* element_format_name(ElementFormat f) {
  return f == ElementFormat::kFp8E4M3 ? "fp8_e4m3" : "nvfp4";
}

std::optional<ElementFormat> element_format_named(std::string_view name) {
  if (name == "nvfp4") return ElementFormat::kNvfp4;
  if (name == "fp8_e4m3") return ElementFormat::kFp8E4M3;
  return std::nullopt;
}

const char* scale_rule_name(ScaleRule r) { return r == ScaleRule::kFourOverSix ? "4over6" : "standard"; }

LayerFormat CacheFormat::layer(int64_t l) const {
  if (layers.empty()) return {};
  return layers.size() == 1 ? layers[0] : layers.at(size_t(l));
}

const float* CacheFormat::k_mean_row(const CacheDims& d, int64_t layer, int64_t head) const {
  if (k_mean.empty()) return nullptr;
  return k_mean.data() + size_t((layer * d.heads + head) * d.head_dim);
}

const float* CacheFormat::k_channel_scale_row(const CacheDims& d, int64_t layer, int64_t head) const {
  if (k_channel_scale.empty()) return nullptr;
  return k_channel_scale.data() + size_t((layer * d.heads + head) * d.head_dim);
}

bool CacheFormat::plain_nvfp4(int64_t l) const {
  if (has_k_mean() || has_k_channel_scale()) return false;
  const LayerFormat f = layer(l);
  for (const TensorFormat* t : {&f.k, &f.v})
    if (t->element != ElementFormat::kNvfp4 || t->rotation != kNoRotation) return false;
  return true;
}

bool CacheFormat::transforms() const {
  if (has_k_mean() || has_k_channel_scale()) return true;
  for (const LayerFormat& f : layers)
    if (f.k.rotation != kNoRotation || f.v.rotation != kNoRotation) return true;
  return false;
}

int64_t rotation_block(int64_t rotation, int64_t head_dim) {
  if (rotation != kRotateWholeHead) return rotation;
  int64_t b = 1;
  while (head_dim % (b * 2) == 0) b *= 2;
  return b;
}

namespace {
// A (layers, heads, D) vector of the format (empty: absent): its size, and every value finite
// (within [2^-16, 2^16] where `positive`: lambda divides K and multiplies q).
std::string per_channel_problem(const std::vector<float>& x, const char* name, bool positive, const CacheDims& d) {
  if (x.empty()) return "";
  const int64_t want = d.layers * d.heads * d.head_dim;
  if (int64_t(x.size()) != want)
    return std::string("format.") + name + ": " + std::to_string(x.size()) + " values, expected (layers " +
           std::to_string(d.layers) + ", heads " + std::to_string(d.heads) + ", D " + std::to_string(d.head_dim) +
           ") = " + std::to_string(want);
  for (size_t i = 0; i < x.size(); ++i) {
    // lambda within 2^+-16: a query times lambda stays finite in float32 wherever the query is
    // (and K - mu over lambda wherever K - mu is), as the GPU's query step needs.
    const bool bad = positive ? !(std::isnormal(x[i]) && x[i] >= 0x1p-16f && x[i] <= 0x1p16f) : !std::isfinite(x[i]);
    if (bad) {
      const int64_t e = int64_t(i) % d.head_dim, h = int64_t(i) / d.head_dim % d.heads,
                    l = int64_t(i) / d.head_dim / d.heads;
      std::ostringstream v;
      v << x[i];
      return std::string("format.") + name + "[" + std::to_string(l) + "][" + std::to_string(h) + "][" +
             std::to_string(e) + "]: " + v.str() + (positive ? " is not a float in [2^-16, 2^16]" : " is not finite");
    }
  }
  return "";
}
}  // namespace

std::string format_problem(const CacheFormat& f, const CacheDims& d) {
  if (!f.layers.empty() && f.layers.size() != 1 && int64_t(f.layers.size()) != d.layers)
    return "format.layers: " + std::to_string(f.layers.size()) + " entries for a cache of " +
           std::to_string(d.layers) + " layers (give 1 for every layer, or one per layer)";
  for (size_t l = 0; l < f.layers.size(); ++l)
    for (Side s : {Side::kK, Side::kV}) {
      const std::string where = "format.layers[" + std::to_string(l) + "]." + (s == Side::kK ? "k" : "v");
      if (std::string p = tensor_problem(f.layers[l].side(s), d, where); !p.empty()) return p;
    }
  if (std::string p = per_channel_problem(f.k_mean, "k_mean", false, d); !p.empty()) return p;
  return per_channel_problem(f.k_channel_scale, "k_channel_scale", true, d);
}

double bits_per_value(ElementFormat f) { return f == ElementFormat::kFp8E4M3 ? 8.0 : 4.5; }

double bits_per_value(const LayerFormat& f) { return (bits_per_value(f.k.element) + bits_per_value(f.v.element)) / 2; }

double bits_per_value(const CacheDims& d) { return (bits_per_value(d.k_element) + bits_per_value(d.v_element)) / 2; }

double bits_per_value(const CacheFormat& f, int64_t layers) {
  if (layers < 1) throw ArgumentError("bits_per_value: layers must be >= 1, got " + std::to_string(layers));
  double sum = 0;
  for (int64_t l = 0; l < layers; ++l) sum += bits_per_value(f.layer(l));
  return sum / double(layers);
}

std::string format_to_json(const CacheFormat& f, int indent) {
  json doc = {{"nvfp4kv_format", kCacheFormatVersion}, {"layers", json::array()}};
  for (const LayerFormat& l : f.layers) doc["layers"].push_back({{"k", tensor_json(l.k)}, {"v", tensor_json(l.v)}});
  if (!f.k_mean.empty()) doc["k_mean"] = f.k_mean;  // flat in C order; the cache's sizes give the shape
  if (!f.k_channel_scale.empty()) doc["k_channel_scale"] = f.k_channel_scale;
  return doc.dump(indent);
}

namespace {
// doc[name] as floats (empty when absent): an array of numbers, each finite as a float (the
// ranges are format_problem's, against a cache's sizes).
std::vector<float> float_array(const json& doc, const char* name) {
  std::vector<float> out;
  if (!doc.contains(name)) return out;
  const json& a = doc[name];
  const std::string where = std::string("format.") + name;
  if (!a.is_array()) throw LayoutError(where + ": expected an array of numbers, got " + json_excerpt(a));
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number())
      throw LayoutError(where + "[" + std::to_string(i) + "]: expected a number, got " + json_excerpt(a[i]));
    const double x = a[i].get<double>();
    if (!std::isfinite(float(x)))
      throw LayoutError(where + "[" + std::to_string(i) + "]: " + json_excerpt(a[i]) + " is not a finite float");
    out.push_back(float(x));
  }
  return out;
}
}  // namespace

CacheFormat parse_format(std::string_view text) {
  json doc;
  try {
    doc = detail::parse_json_strict(text, {"format", kMaxFormatBytes, kMaxFormatDepth, false});
  } catch (const ArgumentError& e) {
    throw LayoutError(e.what());
  }
  require_keys(doc, {"nvfp4kv_format", "layers", "k_mean", "k_channel_scale"}, "format");
  if (!doc.contains("nvfp4kv_format"))
    throw LayoutError("format: \"nvfp4kv_format\" (the version, " + std::to_string(kCacheFormatVersion) +
                      ") is required");
  const json& version = doc["nvfp4kv_format"];
  if (!version.is_number_integer() || version.get<int64_t>() != kCacheFormatVersion)
    throw LayoutError("format.nvfp4kv_format: version " + json_excerpt(version) + " is not one this build reads (" +
                      std::to_string(kCacheFormatVersion) + ")");
  CacheFormat f;
  if (doc.contains("layers")) {
    const json& layers = doc["layers"];
    if (!layers.is_array()) throw LayoutError("format.layers: expected an array, got " + json_excerpt(layers));
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string where = "format.layers[" + std::to_string(i) + "]";
      require_keys(layers[i], {"k", "v"}, where);
      LayerFormat l;
      if (layers[i].contains("k")) l.k = tensor_from(layers[i]["k"], where + ".k");
      if (layers[i].contains("v")) l.v = tensor_from(layers[i]["v"], where + ".v");
      f.layers.push_back(l);
    }
  }
  f.k_mean = float_array(doc, "k_mean");
  f.k_channel_scale = float_array(doc, "k_channel_scale");
  return f;
}

CacheFormat load_format(const std::string& path) {
  return parse_format(read_text_file(path, int64_t(kMaxFormatBytes), "format file"));
}

std::string format_text(const CacheFormat& f, const CacheDims& d) {
  std::ostringstream s;
  if (f.implicit() && !f.transforms()) {
    if (!d.fp8(Side::kK) && !d.fp8(Side::kV)) {
      s << "  plain NVFP4 for K and V in every layer (scale rule per store call), 4.5 bits per value\n";
    } else {
      s << "  K " << element_format_name(d.k_element) << ", V " << element_format_name(d.v_element)
        << " in every layer (the layout's elements; NVFP4's scale rule per store call), no transforms, "
        << bits_per_value(d) << " bits per value\n";
    }
    return s.str();
  }
  if (f.implicit()) {  // mu or lambda alone: they are the cache's, not a layer's
    s << "  every layer: K " << element_format_name(d.k_element) << ", V " << element_format_name(d.v_element)
      << " (the layout's elements), no rotation, scale rule per store call (" << bits_per_value(d) << " bits)\n";
  }
  // Runs of equal layers: "layers 0-7: K nvfp4 standard, V nvfp4 standard (4.5 bits)".
  const int64_t n = f.implicit() ? 0 : f.layers.size() == 1 ? d.layers : int64_t(f.layers.size());
  for (int64_t first = 0; first < n;) {
    int64_t last = first;
    while (last + 1 < n && f.layer(last + 1) == f.layer(first)) ++last;
    const LayerFormat l = f.layer(first);
    s << "  layer" << (last > first ? "s " + std::to_string(first) + "-" + std::to_string(last)
                                    : " " + std::to_string(first))
      << ": K " << tensor_text(l.k) << "; V " << tensor_text(l.v) << " (" << bits_per_value(l) << " bits)\n";
    first = last + 1;
  }
  if (f.has_k_mean()) {
    float lo = f.k_mean[0], hi = f.k_mean[0];
    for (float x : f.k_mean) lo = std::min(lo, x), hi = std::max(hi, x);
    s << "  K smoothing: mu (" << d.layers << ", " << d.heads << ", " << d.head_dim << ") in [" << lo << ", " << hi
      << "]\n";
  } else {
    s << "  K smoothing: none\n";
  }
  if (f.has_k_channel_scale()) {
    float lo = f.k_channel_scale[0], hi = f.k_channel_scale[0];
    for (float x : f.k_channel_scale) lo = std::min(lo, x), hi = std::max(hi, x);
    s << "  K channel scale: lambda (" << d.layers << ", " << d.heads << ", " << d.head_dim << ") in [" << lo << ", "
      << hi << "]\n";
  }
  s << "  bits per value: " << (f.implicit() ? bits_per_value(d) : bits_per_value(f, d.layers)) << "\n";
  return s.str();
}

std::string element_problem(const CacheFormat& f, const CacheDims& d) {
  for (size_t l = 0; l < f.layers.size(); ++l)
    for (Side s : {Side::kK, Side::kV})
      if (f.layers[l].side(s).element != d.element(s))
        return "format.layers[" + std::to_string(l) + "]." + (s == Side::kK ? "k" : "v") +
               ".element: " + element_format_name(f.layers[l].side(s).element) + ", but the layout holds " +
               (s == Side::kK ? "K" : "V") + " as " + element_format_name(d.element(s)) +
               " (a layout holds one element format per side: layers that differ take a layout of their own, "
               "e.g. from plan with k_element; docs/format.md, \"Cache formats\")";
  return "";
}

ValidLayout with_format(const ValidLayout& layout, CacheFormat format) {
  const CacheDims& d = layout.layout().dims;
  for (const std::string& p : {format_problem(format, d), element_problem(format, d)})
    if (!p.empty()) throw LayoutError("layout \"" + layout.layout().name + "\": " + p);
  ValidLayout v = layout;
  v.format_ = std::move(format);
  return v;
}

}  // namespace nvfp4kv
