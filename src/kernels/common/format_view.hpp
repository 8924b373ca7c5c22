#pragma once
// One layer of a cache format as the kernels read it (core/cache_format.hpp): per side the
// element format, the scale rule, the rotation's block size and, for K, the smoothing and
// channel-scale rows.
// The API builds it from the validated layout's format (api/launch_checks.hpp,
// layer_format_view), so the writer and every reader take their transforms from the same
// object; only mu and lambda travel separately, as device copies of the format's own values.
#include <cstdint>

#include "nvfp4kv/core/cache_format.hpp"
#include "nvfp4kv/core/layout_view.hpp"

namespace nvfp4kv::kernels {

struct SideFormatView {
  ElementFormat element = ElementFormat::kNvfp4;
  ScaleRule rule = ScaleRule::kStandard;
  int32_t rotation = 0;         // block size of the block-diagonal Hadamard rotation; 0: none
  const float* mean = nullptr;  // K smoothing: this layer's (kv heads x D) rows in device memory, or null
  const float* channel_scale = nullptr;  // K's lambda: this layer's (kv heads x D) rows in device memory, or null

  NVFP4KV_HD bool transformed() const { return rotation > 0 || mean != nullptr || channel_scale != nullptr; }
  NVFP4KV_HD const float* mean_row(int64_t head, int64_t head_dim) const {
    return mean ? mean + head * head_dim : nullptr;
  }
  NVFP4KV_HD const float* channel_scale_row(int64_t head, int64_t head_dim) const {
    return channel_scale ? channel_scale + head * head_dim : nullptr;
  }
};

struct LayerFormatView {
  SideFormatView k, v;

  NVFP4KV_HD const SideFormatView& side(Side s) const { return s == Side::kK ? k : v; }
  NVFP4KV_HD bool holds_fp8() const {
    return k.element == ElementFormat::kFp8E4M3 || v.element == ElementFormat::kFp8E4M3;
  }
  NVFP4KV_HD bool transformed() const { return k.transformed() || v.transformed(); }
  // What the vectorized store takes: nothing rotated, smoothed or channel-scaled, and the NVFP4 sides (an FP8
  // side has no block scales, so no rule) under one scale rule, nvfp4_rule().
  NVFP4KV_HD bool vector_store() const { return !transformed() && (holds_fp8() || k.rule == v.rule); }
  NVFP4KV_HD ScaleRule nvfp4_rule() const { return k.element == ElementFormat::kNvfp4 ? k.rule : v.rule; }
};

}  // namespace nvfp4kv::kernels
