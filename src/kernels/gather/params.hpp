#pragma once
// The gather family: dequantize the pages of a batch to dense BF16/FP16 rows.
#include <cuda_runtime_api.h>

#include "../common/format_view.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv::kernels {

struct GatherParams {
  LayoutView layout;
  CacheBuffers cache;
  GatherArgs args;
  LayerFormatView format;  // the layer's format (common/format_view.hpp)
};

// Dispatches on the output type and head dim; one launch.
cudaError_t launch_gather(const GatherParams& p, cudaStream_t stream);

}  // namespace nvfp4kv::kernels
