#pragma once
// The cache's format: how each tensor's values become the bytes the layout places.
// The layout says where a byte lives; the format says what the bytes mean: per layer
// and per tensor (K, V) the element format (NVFP4, or FP8 E4M3 with a per-tensor scale),
// NVFP4's scale rule, an optional Hadamard rotation, a K smoothing vector mu subtracted
// before quantizing and a K channel scale lambda divided out after it. A ValidLayout carries one (with_format), so the
// writer and every reader take it from the same object (docs/format.md, "Cache formats").
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/layout_view.hpp"

namespace nvfp4kv {

// ElementFormat (NVFP4 or FP8 E4M3) is in layout_view.hpp: a layout fixes it per side, and a
// format's elements must agree with its layout's (with_format).
// "nvfp4" or "fp8_e4m3" (the names layout and format files use).
const char* element_format_name(ElementFormat f);
std::optional<ElementFormat> element_format_named(std::string_view name);

// Rotation sizes: 0 none, a power of two in [16, 256], or the whole head.
inline constexpr int64_t kNoRotation = 0;
inline constexpr int64_t kRotateWholeHead = -1;

struct TensorFormat {
  ElementFormat element = ElementFormat::kNvfp4;
  ScaleRule rule = ScaleRule::kStandard;  // NVFP4's block rule; FP8 has no blocks and keeps kStandard
  int64_t rotation = kNoRotation;         // x -> H x before quantizing, H orthonormal, block-diagonal
};
// Written out (not defaulted): CUDA sources built as C++17 include this header through layout.hpp.
inline bool operator==(const TensorFormat& a, const TensorFormat& b) {
  return a.element == b.element && a.rule == b.rule && a.rotation == b.rotation;
}

struct LayerFormat {
  TensorFormat k, v;
  const TensorFormat& side(Side s) const { return s == Side::kK ? k : v; }
};
inline bool operator==(const LayerFormat& a, const LayerFormat& b) { return a.k == b.k && a.v == b.v; }

inline constexpr int kCacheFormatVersion = 1;

struct CacheFormat {
  // Empty: plain NVFP4 for K and V in every layer, the scale rule chosen by each store
  // call (what a cache without a format has always been). One entry: every layer.
  // Otherwise one entry per layer.
  std::vector<LayerFormat> layers;
  // Empty, or (layers, heads, D) floats, finite: mu, subtracted from K before it is
  // rotated and quantized; readers add q.mu back to every score.
  std::vector<float> k_mean;
  // Empty, or (layers, heads, D) floats, each in [2^-16, 2^16]: lambda, K's
  // channel scale. The writer stores H((k - mu) / lambda), so readers multiply the query by
  // lambda before rotating it (q . k = (H (lambda q)) . stored + q . mu) and gather
  // multiplies the restored row by lambda before adding mu. Chosen against the queries'
  // energy (docs/accuracy.md), it evens out the quantization error each channel adds
  // to the scores.
  std::vector<float> k_channel_scale;

  bool implicit() const { return layers.empty(); }
  LayerFormat layer(int64_t l) const;  // LayerFormat{} when implicit, else that layer's (or the one) entry
  bool has_k_mean() const { return !k_mean.empty(); }
  // mu of (layer, head): D floats, or nullptr without smoothing.
  const float* k_mean_row(const CacheDims& d, int64_t layer, int64_t head) const;
  bool has_k_channel_scale() const { return !k_channel_scale.empty(); }
  // lambda of (layer, head): D floats, or nullptr without a channel scale.
  const float* k_channel_scale_row(const CacheDims& d, int64_t layer, int64_t head) const;
  // Plain NVFP4 in this layer: no FP8, no rotation, no mu, no lambda (either rule).
  bool plain_nvfp4(int64_t layer) const;
  // Some layer rotates K or V, or K is smoothed or channel-scaled: attention needs its query and output
  // steps (the GPU kernels compile them only into the instances that take them).
  bool transforms() const;
};
inline bool operator==(const CacheFormat& a, const CacheFormat& b) {
  return a.layers == b.layers && a.k_mean == b.k_mean && a.k_channel_scale == b.k_channel_scale;
}

const char* scale_rule_name(ScaleRule r);            // "standard", "4over6"

// The block size of the block-diagonal Hadamard matrix a rotation means at head dim D
// (0 for none): the size itself, or for the whole head D when D is a power of two and
// otherwise the largest power of two dividing D (D 80: 16, D 96: 32).
int64_t rotation_block(int64_t rotation, int64_t head_dim);

// Why this format cannot describe a cache of these sizes ("" when it can), naming the
// field: "format.layers[3].k.rotation: 48 is not a power of two in [16, 256] ...".
std::string format_problem(const CacheFormat& f, const CacheDims& d);

// Bits per stored value (data and scales; the global scales and mu are per layer, not
// per token): NVFP4 4.5, FP8 8; a layer the mean of K and V; a cache the mean of its layers.
double bits_per_value(ElementFormat f);
double bits_per_value(const LayerFormat& f);
double bits_per_value(const CacheFormat& f, int64_t layers);
// A cache by its layout's elements alone (what a layout with this format holds: with_format
// makes the two agree).
double bits_per_value(const CacheDims& d);

// Why this format's element formats differ from the layout's ("" when they agree): a layout
// fixes each side's element format (it sets the bytes per row), so a format entry must match
// it in every layer. with_format checks format_problem and this.
std::string element_problem(const CacheFormat& f, const CacheDims& d);

// JSON text, versioned: {"nvfp4kv_format": 1, "layers": [{"k": {...}, "v": {...}}, ...],
// "k_mean": [...] and "k_channel_scale": [...] (layers x heads x D, flat in C order) or absent}. Parse refuses unknown keys, a
// missing or newer version and ill-typed fields, naming the field; the sizes are checked
// against a cache by format_problem (with_format does both).
std::string format_to_json(const CacheFormat& f, int indent = 2);
CacheFormat parse_format(std::string_view json_text);  // throws LayoutError
CacheFormat load_format(const std::string& path);      // a file, at most 64 MiB

// Lines for `layout show`: one per distinct layer format, plus mu's and lambda's shape and range.
std::string format_text(const CacheFormat& f, const CacheDims& d);

}  // namespace nvfp4kv
