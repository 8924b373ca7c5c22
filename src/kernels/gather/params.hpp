#pragma once
// The gather family: dequantize the pages of a batch to dense BF16/FP16 rows.
#include <cuda_runtime_api.h>

#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv::kernels {

struct GatherParams {
  LayoutView layout;
  CacheBuffers cache;
  GatherArgs args;
};

// Dispatches on the output type and head dim; one launch.
cudaError_t launch_gather(const GatherParams& p, cudaStream_t stream);

}  // namespace nvfp4kv::kernels
