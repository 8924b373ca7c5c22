#pragma once
// The prefill / extend attention family: each sequence's new query tokens
// against its pages of the NVFP4 cache, causally (core/ops.hpp PrefillArgs says
// what it computes; src/kernels/prefill/prefill.cu how).
#include <cuda_runtime_api.h>

#include <string>

#include "../common/format_view.hpp"
#include "nvfp4kv/core/ops.hpp"
#include "nvfp4kv/core/prefill_plan.hpp"

namespace nvfp4kv::kernels {

struct PrefillParams {
  LayoutView layout;
  CacheBuffers cache;
  PrefillArgs args;
  PrefillGeometry geometry;
  LayerFormatView format;  // the layer's format: its rotations and K smoothing (common/format_view.hpp)
};

// Fills p.geometry (core's plan_prefill_geometry) from the layout and the args'
// shape on the current device; kUnsupported-class problems come back as a message.
cudaError_t plan_prefill_geometry(PrefillParams& p, std::string* unsupported);

// Launches the prefill kernel; one stream, no sync.
cudaError_t launch_prefill(const PrefillParams& p, cudaStream_t stream);

}  // namespace nvfp4kv::kernels
