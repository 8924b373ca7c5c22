#pragma once
// docs/api.md's planning example: CPU only, so layout_example runs it everywhere and
// api_example allocates what it plans on the GPU. The region between the two
// "// [plan]" lines is the page's code block.
#include <cstdio>

#include "nvfp4kv/core/plan.hpp"

inline nvfp4kv::Plan plan_example() {
  // [plan]
  using namespace nvfp4kv;
  // Plan once at start-up: 32 layers, 8 kv heads, D 128, 16 tokens per page,
  // 2 GiB for the whole cache, one buffer per layer.
  PlanRequest req;
  req.layers = 32;
  req.kv_heads = 8;
  req.head_dim = 128;
  req.tokens_per_page = 16;
  req.memory_bytes = int64_t(2) << 30;
  const Plan plan = nvfp4kv::plan(req);
  std::printf("%s\n", plan.summary().c_str());
  // [plan]
  return plan;
}
