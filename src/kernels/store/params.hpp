#pragma once
// The store family: quantize K and V rows into the cache through a slot mapping.
// One params struct, built by name in the API from the validated layout and the
// caller's StoreArgs (the vocabulary the reference uses too).
#include <cuda_runtime_api.h>

#include "../common/format_view.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv::kernels {

struct StoreParams {
  LayoutView layout;
  CacheBuffers cache;
  StoreArgs args;
  LayerFormatView format;  // the layer's format (common/format_view.hpp)
};

// Dispatches on the element type, scale rule and head dim; one launch.
cudaError_t launch_store(const StoreParams& p, cudaStream_t stream);

}  // namespace nvfp4kv::kernels
