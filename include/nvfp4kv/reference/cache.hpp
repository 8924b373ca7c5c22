#pragma once
// Scalar reference for the paged cache: store rows through a slot mapping and
// gather pages back, every byte placed by the validated layout.
#include <vector>

#include "nvfp4kv/core/cache_buffers.hpp"
#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::reference {

struct StoreParams {
  KvRows rows;
  ElementType type = ElementType::kBFloat16;
  const int64_t* slots = nullptr;  // (tokens); slot = page * N + token, < 0 = padding
  int64_t layer = 0;
  float k_global_scale = 1.0f, v_global_scale = 1.0f;
  ScaleRule rule = ScaleRule::kStandard;
};

StoreCounts store(const ValidLayout& layout, const CacheBuffers& buffers, const StoreParams& p);

struct GatherParams {
  const int32_t* block_table = nullptr;  // pages of one sequence, in order
  int64_t tokens = 0;                    // tokens to gather: needs ceil(tokens / N) entries
  int64_t layer = 0;
  float k_global_scale = 1.0f, v_global_scale = 1.0f;
};

struct GatheredKv {
  std::vector<float> k, v;  // (tokens, heads, D)
};

GatheredKv gather(const ValidLayout& layout, const CacheBuffers& buffers, const GatherParams& p);

// Host allocations for one layer of a layout, filled with `fill`.
struct HostCache {
  std::vector<std::vector<uint8_t>> storage;
  CacheBuffers buffers;
  HostCache(const Layout& layout, uint8_t fill);
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;
};

}  // namespace nvfp4kv::reference
