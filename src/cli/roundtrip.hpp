#pragma once
// The conformance round trip shared by `nvfp4kv roundtrip` and the demo.
#include <cstdint>
#include <iosfwd>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::cli {

struct RoundtripOptions {
  int64_t tokens = 0;  // 0: fill about 3/4 of the cache, at most 4096 tokens
  uint64_t seed = 1;
  bool use_gpu = true;
};

// Prints per-region results; returns true when every check passed.
bool roundtrip(const ValidLayout& layout, const RoundtripOptions& opt, std::ostream& out);

}  // namespace nvfp4kv::cli
