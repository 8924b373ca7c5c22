#pragma once
// Planning an allocation: from model and memory sizes to nvfp4kv's native
// layout (or one's own), its bytes per page and its token capacity (docs/layouts.md says why
// the native layout looks the way it does).
#include <optional>
#include <string>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {

struct PlanRequest {
  int64_t layers = 0;
  int64_t kv_heads = 0;  // of the whole model
  int64_t head_dim = 0;
  int64_t tokens_per_page = 16;
  std::optional<int64_t> memory_bytes;  // budget for this rank's KV cache, all layers
  std::optional<int64_t> pages;         // or a page count
  int64_t tp_size = 1, tp_rank = 0;
  bool cross_layer = false;  // one allocation for all layers instead of one per layer
  bool interleave_v_scales = false;  // TensorRT-LLM's 4-token interleave of each V-scale plane
  // What each side's bytes hold in the native layout: NVFP4, or FP8 E4M3 (a data plane of
  // N x D bytes and no scale plane). A layout of one's own says it itself ("elements").
  ElementFormat k_element = ElementFormat::kNvfp4, v_element = ElementFormat::kNvfp4;
  // A layout of one's own instead of the native one (its open sizes are filled from
  // the request; a size it fixes must agree): sized by what one page adds to it.
  std::optional<LayoutSpec> layout;
};

struct Plan {
  ValidLayout layout;
  int64_t heads_per_rank = 0;
  int64_t first_head = 0;               // this rank holds global kv heads [first_head, first_head + heads_per_rank)
  int64_t bytes_per_page_per_layer = 0;
  int64_t bytes_per_page = 0;           // all layers
  int64_t token_capacity = 0;
  int64_t total_bytes = 0;
  int64_t fixed_bytes = 0;              // bytes that do not grow with pages (0 for the native layout)
  bool native = true;                   // nvfp4kv's layout, not one of the request's
  std::string summary() const;
};

// Throws LayoutError saying what to change when the request is impossible.
Plan plan(const PlanRequest& request);

}  // namespace nvfp4kv
