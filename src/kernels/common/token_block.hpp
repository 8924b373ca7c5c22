#pragma once
// Launch geometry shared by the store and the gather: a thread owns one
// 16-element group of one side of one token and walks that token's heads.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "nvfp4kv/core/layout_view.hpp"

namespace nvfp4kv::kernels {

// x = group (D / 16), y = side (K, V), z = tokens, as many as fit in about
// `threads` threads (at least one; at most `max_tokens`).
inline dim3 token_block(const CacheDims& d, int64_t threads, int64_t max_tokens = 1 << 30) {
  const int64_t groups = d.scale_bytes();
  const int64_t tokens = std::min<int64_t>(max_tokens, std::max<int64_t>(1, threads / (2 * groups)));
  return dim3(unsigned(groups), 2u, unsigned(tokens));
}

}  // namespace nvfp4kv::kernels
