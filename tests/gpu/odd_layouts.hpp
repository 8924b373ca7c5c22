#pragma once
// Layouts of one's own that the GPU tests share, for the paths the native layouts never take.
#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::test_layouts {

// K in FP8 whose token rows are 8 bytes longer than the heads' (H*D + 8 bytes a token), so an
// FP8 group's 16 bytes are 8-byte aligned only: the store writes them byte by byte and
// prefill's producers gather them byte by byte. V in NVFP4, data and scales in one row per
// token and head, standard code order (decode, which reads FP8 beside NVFP4 only in the
// fp16-split order, refuses it).
inline LayoutSpec fp8_k_rows_8_aligned() {
  return parse_layout_spec(R"json({
    "name": "test-fp8-k-rows-8-aligned",
    "elements": {"k": "fp8_e4m3"},
    "buffers": [{"name": "k"}, {"name": "v"}],
    "regions": {
      "k_data": {"buffer": "k", "page": "N*(H*kd + 8)", "token": "H*kd + 8", "head": "kd"},
      "v_data": {"buffer": "v", "page": "N*H*F", "token": "H*F", "head": "F"},
      "v_scale": {"buffer": "v", "offset": "dd", "page": "N*H*F", "token": "H*F", "head": "F"}
    }
  })json");
}

}  // namespace nvfp4kv::test_layouts
